"""Shared pieces of every attention kernel: masks, GQA mapping, argument checks.

Kernel contract (every implementation in this package follows it):

    out[b, t, n] = softmax(scale * q1[b, t, n] . k1[b, :, g(n)] + mask) @ v[b, :, g(n)]
      - lam[b, t, n] * softmax(scale * q2[b, t, n] . k2[b, :, g(n)] + mask) @ v[b, :, g(n)]

with g(n) = n // (N // K) (contiguous GQA groups), softmax in float32, output in q1's dtype.
Shapes: B batch, T query and S key positions, N query heads, K kv heads, H head width.
- q2 None: single softmax map (the baseline Transformer; lam must be None).
- k2 None: q2 attends to k1 (DIFF V2: each head pair shares its keys and values).
- lam: a scalar (DIFF V1 / Shared DIFF) or [B, T, N] (DIFF V2, per token and head).
- mask: causal (top-left aligned, T == S) and/or segment_ids [B, T] (packed documents attend only
  within their own segment); an explicit boolean `mask` [B, T, S] replaces both (KV-cache decode).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def check_shapes(q1, k1, v, q2, k2, lam) -> None:
  if q1.ndim != 4 or k1.ndim != 4 or v.ndim != 4:
    raise ValueError(f"attention: q, k, v must be [B, T, N, H]; got {q1.shape}, {k1.shape}, "
                     f"{v.shape}")
  num_heads, num_kv = q1.shape[2], k1.shape[2]
  if num_heads % num_kv:
    raise ValueError(f"attention: query heads ({num_heads}) must be a multiple of kv heads "
                     f"({num_kv})")
  if v.shape[:3] != k1.shape[:3]:
    raise ValueError(f"attention: values {v.shape} do not match keys {k1.shape} in B, S, K")
  if q2 is not None and q2.shape != q1.shape:
    raise ValueError(f"attention: q2 {q2.shape} must match q1 {q1.shape}")
  if k2 is not None and (k2.shape != k1.shape or q2 is None):
    raise ValueError(f"attention: k2 {None if k2 is None else k2.shape} needs q2 and k1's shape "
                     f"{k1.shape}")
  if (lam is None) != (q2 is None):
    raise ValueError("attention: lam must be given exactly when q2 is (the differential case)")


def default_scale(q1: Array, scale: float | None) -> float:
  return 1.0 / math.sqrt(q1.shape[-1]) if scale is None else scale


def lam_per_query(lam: Array, batch: int, seq: int, heads: int) -> Array:
  """lam as float32 [B, T, N] whatever form it came in (scalar or per token and head)."""
  return jnp.broadcast_to(jnp.asarray(lam, jnp.float32), (batch, seq, heads))


def make_mask(
    q_len: int,
    kv_len: int,
    *,
    causal: bool,
    segment_ids: Array | None = None,
    mask: Array | None = None,
) -> Array | None:
  """Boolean [B or 1, T, S] mask (True = may attend), or None when nothing is masked."""
  if mask is not None:
    return mask.astype(bool)
  out = None
  if causal:
    out = (jnp.arange(q_len)[:, None] >= jnp.arange(kv_len)[None, :])[None]
  if segment_ids is not None:
    if q_len != kv_len:
      raise ValueError("attention: segment_ids need T == S; pass an explicit mask for decoding")
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    out = same if out is None else out & same
  return out
