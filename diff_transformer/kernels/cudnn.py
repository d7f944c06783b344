"""`jax.nn.dot_product_attention` with cuDNN's fused flash attention (GPU; `implementation='xla'`
runs the same layout through XLA, which is how it is tested and timed on CPU).

dot_product_attention wants values exactly as wide as keys and one map per head, so the two
softmax maps become extra query heads of ONE call:
- shared keys (DIFF V2): q1/q2 interleave back to 2H heads over the K kv heads, one GQA call;
- separate keys (DIFF V1, Shared DIFF): heads [q1; q2] over kv heads [k1; k2] with values [v; v];
  when values are wider than keys (V1's 2d), q and k are zero-padded to the value width and the
  scale stays 1/sqrt(d), which leaves the logits unchanged.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from diff_transformer.kernels import common

Array = jax.Array


def _call(q, k, v, *, scale, causal, segment_ids, mask, implementation):
  bias_mask = None
  if mask is not None:
    bias_mask = mask.astype(bool)[:, None]
  elif segment_ids is not None:
    bias_mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  return jax.nn.dot_product_attention(
      q, k, v, scale=scale, is_causal=causal and mask is None, mask=bias_mask,
      implementation=implementation)


def attention(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal=True, scale=None,
              mask=None, implementation: str = "cudnn") -> Array:
  common.check_shapes(q1, k1, v, q2, k2, lam)
  scale = common.default_scale(q1, scale)
  kw = dict(scale=scale, causal=causal, segment_ids=segment_ids, mask=mask,
            implementation=implementation)
  batch, q_len, heads, _ = q1.shape
  if q2 is None:
    q, k = q1, k1
    if v.shape[-1] != k1.shape[-1]:
      q, k = _pad_to(q1, v.shape[-1]), _pad_to(k1, v.shape[-1])
    return _call(q, k, v, **kw)
  lam_BTN1 = common.lam_per_query(lam, batch, q_len, heads)[..., None]
  if k2 is None and v.shape[-1] == k1.shape[-1]:
    q_BT2NH = jnp.stack([q1, q2], axis=3).reshape(batch, q_len, 2 * heads, q1.shape[-1])
    o_BT2NH = _call(q_BT2NH, k1, v, **kw).reshape(batch, q_len, heads, 2, v.shape[-1])
    o1, o2 = o_BT2NH[:, :, :, 0], o_BT2NH[:, :, :, 1]
  else:
    k2 = k1 if k2 is None else k2
    width = max(v.shape[-1], k1.shape[-1])
    q = _pad_to(jnp.concatenate([q1, q2], axis=2), width)
    k = _pad_to(jnp.concatenate([k1, k2], axis=2), width)
    o = _call(q, k, jnp.concatenate([v, v], axis=2), **kw)
    o1, o2 = o[:, :, :heads], o[:, :, heads:]
  out = o1.astype(jnp.float32) - lam_BTN1 * o2.astype(jnp.float32)
  return out.astype(q1.dtype)


def _pad_to(x: Array, width: int) -> Array:
  extra = width - x.shape[-1]
  return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])
