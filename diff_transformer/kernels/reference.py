"""Plain einsum + softmax attention. The readable definition, and the only path that returns maps.

Analysis option `logit_bits`: dynamic absmax quantisation of the attention logits (DIFF paper
Figure 8). Each query row's scaled logits over the keys it may attend to are rounded to a
symmetric `bits`-bit integer grid whose step is absmax / (2^(bits-1) - 1) (absmax over that row),
then dequantised before the softmax. Per-row scales make full-sequence and KV-cache decoding
quantise identically.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from diff_transformer.kernels import common

Array = jax.Array


def quantize_logits(logits_BNTS: Array, mask_BTS: Array | None, bits: int) -> Array:
  """Dynamic absmax fake-quantisation of each query row to `bits` bits (masked keys ignored)."""
  if bits < 2:
    raise ValueError(f"logit_bits: need at least 2 bits, got {bits}")
  levels = 2.0 ** (bits - 1) - 1.0
  absval = jnp.abs(logits_BNTS)
  if mask_BTS is not None:
    absval = jnp.where(mask_BTS[:, None], absval, 0.0)
  step = jnp.max(absval, axis=-1, keepdims=True) / levels
  step = jnp.where(step > 0, step, 1.0)
  return jnp.clip(jnp.round(logits_BNTS / step), -levels, levels) * step


def _softmax_map(q_BTNH: Array, k_BSKH: Array, scale: float, mask_BTS: Array | None,
                 logit_bits: int | None = None) -> Array:
  """float32 attention weights [B, N, T, S]; query head n reads kv head n // (N // K)."""
  group = q_BTNH.shape[2] // k_BSKH.shape[2]
  k_BSNH = jnp.repeat(k_BSKH, group, axis=2)
  logits_BNTS = jnp.einsum("btnh,bsnh->bnts", q_BTNH, k_BSNH, preferred_element_type=jnp.float32)
  logits_BNTS = logits_BNTS * scale
  if logit_bits is not None:
    logits_BNTS = quantize_logits(logits_BNTS, mask_BTS, logit_bits)
  if mask_BTS is not None:
    logits_BNTS = jnp.where(mask_BTS[:, None], logits_BNTS, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits_BNTS, axis=-1)


def attention_maps(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal=True,
                   scale=None, mask=None, logit_bits=None) -> tuple[Array, dict[str, Array]]:
  """Output plus {'A1', 'A2', 'lambda'}: A1/A2 float32 [B, N, T, S], lambda float32 [B, T, N]."""
  common.check_shapes(q1, k1, v, q2, k2, lam)
  scale = common.default_scale(q1, scale)
  batch, q_len, heads, _ = q1.shape
  mask_BTS = common.make_mask(q_len, k1.shape[1], causal=causal, segment_ids=segment_ids, mask=mask)
  group = heads // k1.shape[2]
  v_BSNH = jnp.repeat(v, group, axis=2).astype(jnp.float32)
  a1_BNTS = _softmax_map(q1, k1, scale, mask_BTS, logit_bits)
  out_BTNH = jnp.einsum("bnts,bsnh->btnh", a1_BNTS, v_BSNH)
  maps = {"A1": a1_BNTS}
  if q2 is not None:
    a2_BNTS = _softmax_map(q2, k1 if k2 is None else k2, scale, mask_BTS, logit_bits)
    lam_BTN = common.lam_per_query(lam, batch, q_len, heads)
    out_BTNH = out_BTNH - lam_BTN[..., None] * jnp.einsum("bnts,bsnh->btnh", a2_BNTS, v_BSNH)
    maps.update(A2=a2_BNTS, **{"lambda": lam_BTN})
  return out_BTNH.astype(q1.dtype), maps


def attention(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal=True, scale=None,
              mask=None, logit_bits=None) -> Array:
  return attention_maps(q1, k1, v, q2, k2, lam, segment_ids=segment_ids, causal=causal,
                        scale=scale, mask=mask, logit_bits=logit_bits)[0]
