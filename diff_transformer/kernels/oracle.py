"""The kernels' float64 oracle: an independent numpy reference of their forward and backward,
written from the formulas (kernels/common.py) with an explicit softmax-Jacobian backward
(tests/test_pallas_kernel.py checks it against finite differences), XLA's cuDNN-call semantics
on CPU (`exact_cpu_attention`), and random inputs for the kernels. It shares no code with the
kernels it checks: the tests and the GPU check both read it here.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

ARG_NAMES = ("q1", "k1", "v", "q2", "k2", "lam")


def np_mask(T: int, causal: bool, seg: np.ndarray | None, batch: int) -> np.ndarray:
  mask = np.ones((batch, T, T), bool)
  if causal:
    mask &= np.tril(np.ones((T, T), bool))[None]
  if seg is not None:
    mask &= seg[:, :, None] == seg[:, None, :]
  return mask


def np_attention(args: dict, do: np.ndarray, *, causal: bool, seg=None):
  """Returns (out, grads) in float64; grads has one entry per non-None input."""
  arrays: list[Any] = [None if args[n] is None else np.asarray(args[n], np.float64)
                       for n in ARG_NAMES]  # absent ones None: the branches below say which
  q1, k1, v, q2, k2, lam = arrays
  batch, T, N, d = q1.shape
  group = N // k1.shape[2]
  scale = 1.0 / np.sqrt(d)
  mask = np_mask(T, causal, seg, batch)[:, None]                   # [B,1,T,S]
  kv = lambda x: np.repeat(x, group, axis=2).transpose(0, 2, 1, 3)  # [B,N,S,H]
  heads = lambda x: x.transpose(0, 2, 1, 3)                         # [B,N,T,H]
  unheads = lambda x: x.transpose(0, 2, 1, 3)
  kv_sum = lambda x: unheads(x).reshape(batch, T, -1, group, x.shape[-1]).sum(3)
  v_N, do_N = kv(v), heads(do)
  lam_N: Any = (None if q2 is None else
               np.broadcast_to(lam, (batch, T, N)).transpose(0, 2, 1)[..., None])

  def softmax_map(q, k):
    s = np.where(mask, scale * heads(q) @ kv(k).transpose(0, 1, 3, 2), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)

  def map_grads(p, q, k, dout):  # softmax Jacobian: dS = P * (dP - rowsum(dP * P))
    dp = dout @ v_N.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return unheads(scale * ds @ kv(k)), kv_sum(scale * ds.transpose(0, 1, 3, 2) @ heads(q))

  p1 = softmax_map(q1, k1)
  o1 = p1 @ v_N
  dq1, dk1 = map_grads(p1, q1, k1, do_N)
  grads = {"q1": dq1, "k1": dk1, "v": kv_sum(p1.transpose(0, 1, 3, 2) @ do_N)}
  out = o1
  if q2 is not None:
    k2_or_1 = k1 if k2 is None else k2
    p2 = softmax_map(q2, k2_or_1)
    o2 = p2 @ v_N
    out = o1 - lam_N * o2
    dq2, dk2 = map_grads(p2, q2, k2_or_1, -lam_N * do_N)
    grads["q2"] = dq2
    if k2 is None:
      grads["k1"] = grads["k1"] + dk2
    else:
      grads["k2"] = dk2
    grads["v"] = grads["v"] + kv_sum(p2.transpose(0, 1, 3, 2) @ (-lam_N * do_N))
    dlam_BTN = -(do_N * o2).sum(-1).transpose(0, 2, 1)
    grads["lam"] = dlam_BTN.sum() if np.ndim(lam) == 0 else dlam_BTN
  return unheads(out), grads


def scalar_lam_terms(args: dict, do: np.ndarray, *, causal: bool, seg=None) -> float:
  """The absolute sum of a scalar lambda's gradient terms: dL/dlam = -sum(o2 * do) over every
  token and head cancels to a small fraction of them, so its float32 rounding is measured
  against this sum, not against the (near-zero) gradient itself."""
  o2 = (np_attention(dict(args, lam=np.float32(0)), do, causal=causal, seg=seg)[0]
        - np_attention(dict(args, lam=np.float32(1)), do, causal=causal, seg=seg)[0])
  return float(np.abs(o2 * do).sum())


def make_inputs(variant: str, *, B=1, T=40, N=4, K=2, d=8, seed=0, seg=False, dtype=jnp.float32):
  """variant: 'v1' (separate keys, 2d values, scalar lam), 'v2' (shared keys, per-token lam),
  'base' (single map)."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
  dim_v = 2 * d if variant == "v1" else d
  args = dict(q1=normal(B, T, N, d), k1=normal(B, T, K, d), v=normal(B, T, K, dim_v),
              q2=None, k2=None, lam=None)
  if variant == "v1":
    args.update(q2=normal(B, T, N, d), k2=normal(B, T, K, d),
                lam=jnp.float32(rng.uniform(0.2, 0.8)))
  elif variant == "v2":
    args.update(q2=normal(B, T, N, d), lam=jnp.asarray(rng.uniform(0, 1, (B, T, N)), jnp.float32))
  seg_ids = None
  if seg:  # 2-4 packed documents of random lengths per row
    seg_ids = np.cumsum(rng.random((B, T)) < 3.0 / T, axis=1).astype(np.int32)
  do = rng.standard_normal((B, T, N, dim_v))
  return args, seg_ids, do


def exact_cpu_attention(q, k, v, *, scale, causal, q_seqlen=None, kv_seqlen=None, q_offsets=None,
                        kv_offsets=None):
  """What one call of cuDNN's entry computes (kernels/cudnn.cudnn_exact), exactly and on any
  device, written from its contract: GQA heads, values as wide as they come, and in the packed
  layout each sequence (offset, length) attending within itself; a query in no sequence gets 0.
  The tests put it in cuDNN's place to check the exact layout's reshapes and map mix."""
  import jax
  T, S = q.shape[1], k.shape[1]
  group = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
  ok = jnp.ones((q.shape[0], T, S), bool)
  if causal:
    ok &= jnp.tril(jnp.ones((T, S), bool))[None]
  if q_offsets is not None:
    def which(offsets, lengths, n):  # the sequence holding each position, -1 for none
      pos = jnp.arange(n)[None, :, None]
      inside = ((offsets[:, None, :-1] >= 0) & (pos >= offsets[:, None, :-1])
                & (pos < offsets[:, None, :-1] + lengths[:, None, :]))
      return jnp.where(inside.any(-1), jnp.argmax(inside, -1), -1)
    sq, sk = which(q_offsets, q_seqlen, T), which(kv_offsets, kv_seqlen, S)
    ok &= (sq[:, :, None] == sk[:, None, :]) & (sq >= 0)[:, :, None]
  logits = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
  logits = jnp.where(ok[:, None], logits, -1e30)  # finite: no NaN in the masked gradient
  weights = jnp.where(ok[:, None].any(-1, keepdims=True), jax.nn.softmax(logits, axis=-1), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", weights, v.astype(jnp.float32)).astype(q.dtype)
