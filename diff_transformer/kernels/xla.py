"""Einsum attention at the arithmetic floor (XLA on any platform; maps materialised in float32).

The differential map is formed before the value product, (A1 - lam A2) V, so one PV product
serves both maps:
- DIFF V1 / Shared DIFF (h heads, keys d, values 2d): QK^T 2 x 2hTSd + PV 2hTS(2d) = 8hTSd,
  the parameter-matched Transformer's (2h heads of d) cost;
- DIFF V2 (h output heads, 2h query maps of d over shared keys): 4hTSd + 2hTSd = 6hTSd.
Query heads are grouped as [K, G] against the kv heads (no repeat of keys or values).

Causal self-attention (T == S, no explicit mask) runs in query blocks of `block_q` rows, block i
attending to keys [0, end_i) only, so about (n + 1) / 2n of the square is computed for n blocks
instead of all of it; each block's softmax rows are complete, so the result is exact. Every
block's [B, N, block_q, S_i] maps are materialised: this path is for lengths whose maps fit in
memory; the fused Pallas kernel covers long sequences on GPU/TPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from diff_transformer.kernels import common

Array = jax.Array

# Query rows per causal block on CPU (benchmarks/results/attention_kernels_cpu.json).
BLOCK_Q = 64
# At most this many blocks: each block is unrolled into the compiled program, so their number
# bounds its size and compile time at long T; 8 blocks already skip 7/16 of the square.
MAX_BLOCKS = 8


def causal_blocks(q_len: int, block_q: int = BLOCK_Q) -> list[tuple[int, int]]:
  """(start, end) query rows of each causal block: block_q rows, widened where T needs more than
  MAX_BLOCKS; block i attends to keys [0, end_i)."""
  rows = max(block_q, -(-q_len // MAX_BLOCKS))
  return [(start, min(q_len, start + rows)) for start in range(0, q_len, rows)]


def attention(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal=True, scale=None,
              mask=None, block_q: int = BLOCK_Q) -> Array:
  common.check_shapes(q1, k1, v, q2, k2, lam)
  scale = common.default_scale(q1, scale)
  batch, q_len, heads, _ = q1.shape
  lam_f32 = None if lam is None else jnp.asarray(lam, jnp.float32)
  if not (causal and mask is None and q_len == k1.shape[1] and q_len > block_q):
    mask_BTS = common.make_mask(q_len, k1.shape[1], causal=causal, segment_ids=segment_ids,
                                mask=mask)
    return _block(q1, k1, v, q2, k2, lam_f32, scale, mask_BTS)
  outs = []
  for start, end in causal_blocks(q_len, block_q):
    mask_BTS = (jnp.arange(start, end)[:, None] >= jnp.arange(end)[None, :])[None]
    if segment_ids is not None:
      mask_BTS = mask_BTS & (segment_ids[:, start:end, None] == segment_ids[:, None, :end])
    rows = lambda x: None if x is None else x[:, start:end]
    keys = lambda x: None if x is None else x[:, :end]
    lam_rows = lam_f32 if lam_f32 is None or lam_f32.ndim == 0 else rows(lam_f32)
    outs.append(_block(rows(q1), keys(k1), keys(v), rows(q2), keys(k2), lam_rows, scale,
                       mask_BTS))
  return jnp.concatenate(outs, axis=1)


def _block(q1, k1, v, q2, k2, lam, scale, mask_BTS) -> Array:
  batch, q_len, heads, _ = q1.shape
  kv_heads = k1.shape[2]
  e1_BNTS, l1_BNT1 = _exp_rows(q1, k1, scale, mask_BTS)
  p_BNTS = e1_BNTS * (1.0 / l1_BNT1)
  if q2 is not None:
    if lam.ndim:  # per token and head [B, T, N] -> [B, N, T, 1]
      lam = lam.transpose(0, 2, 1)[..., None]
    e2_BNTS, l2_BNT1 = _exp_rows(q2, k1 if k2 is None else k2, scale, mask_BTS)
    # lam joins the second map's row normaliser: one reduction per map in the backward serves
    # both the softmax and lam's gradient.
    p_BNTS = p_BNTS - e2_BNTS * (lam / l2_BNT1)
  p_BKGTS = p_BNTS.reshape(batch, kv_heads, heads // kv_heads, *p_BNTS.shape[2:])
  out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", p_BKGTS.astype(v.dtype), v,
                         preferred_element_type=jnp.float32)
  return out_BTKGH.reshape(batch, q_len, heads, v.shape[-1]).astype(q1.dtype)


def _exp_rows(q_BTNH: Array, k_BSKH: Array, scale: float, mask_BTS: Array | None
              ) -> tuple[Array, Array]:
  """Unnormalised float32 softmax numerators exp(logit - row max) [B, N, T, S] and their row
  sums [B, N, T, 1]. The map work runs on [B, N, T, S], not [B, K, G, T, S]: XLA:CPU's fused
  reductions are many times slower over an array with a size-1 axis (G = 1 without GQA)."""
  batch, q_len, heads, width = q_BTNH.shape
  kv_heads = k_BSKH.shape[2]
  q_BTKGH = q_BTNH.reshape(batch, q_len, kv_heads, heads // kv_heads, width)
  logits = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH,
                      preferred_element_type=jnp.float32).reshape(batch, heads, q_len, -1) * scale
  if mask_BTS is not None:
    logits = jnp.where(mask_BTS[:, None], logits, jnp.finfo(jnp.float32).min)
  # The row max only keeps exp in range; the result does not depend on it.
  e = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True)))
  return e, jnp.sum(e, axis=-1, keepdims=True)
