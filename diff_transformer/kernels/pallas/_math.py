"""Block math shared by the TPU (grid-loop) and Triton (in-kernel loop) variants.

Every helper works on one (block_q, block_k) tile with float32 statistics held as (block_q, 1)
columns, so the two kernel bodies differ only in how they fetch blocks and carry state.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Finite "minus infinity": exp(MASK - real) == 0 and MASK - MASK never produces NaN.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Static kernel parameters (hashable: used as a custom_vjp nondiff argument)."""
  seq_len: int          # true T before padding
  block_q: int
  block_k: int
  scale: float
  causal: bool
  backend: str          # "tpu" (Mosaic-style grid loop) or "triton" (in-kernel loop)
  interpret: object     # False, True or a pltpu.InterpretParams
  num_warps: int = 4
  num_stages: int = 2

  def padded(self, length: int) -> bool:
    return length != self.seq_len


def kernel_name(kernel) -> str:
  """The compiled kernel's name ("diff_attention_fwd_kernel", ...): profiles tell ours apart."""
  return "diff_attention_" + getattr(kernel, "func", kernel).__name__.strip("_")


def dot(a: Array, b: Array, *, trans_a: bool = False, trans_b: bool = False) -> Array:
  """a @ b with optional transposes and float32 accumulation."""
  contract = ((0 if trans_a else 1,), (1 if trans_b else 0,))
  return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


def tile_mask(rows: Array, cols: Array, cfg: KernelConfig, kv_padded: bool,
              q_seg: Array | None, kv_seg: Array | None) -> Array | None:
  """Boolean (bq, bk) mask from absolute row (bq,1)/(bq,bk) and column (1,bk)/(bq,bk) indices."""
  mask = None

  def both(a, b):
    return b if a is None else a & b

  if cfg.causal:
    mask = both(mask, rows >= cols)
  if kv_padded:  # padded keys never attend; padded query rows are sliced off outside.
    mask = both(mask, cols < cfg.seq_len)
  if q_seg is not None:
    mask = both(mask, q_seg == kv_seg)
  return mask


def logits(q: Array, k: Array, scale: float, mask: Array | None) -> Array:
  s = dot(q, k, trans_b=True) * scale
  return s if mask is None else jnp.where(mask, s, MASK_VALUE)


def online_update(s: Array, v: Array, m_prev: Array, l_prev: Array, acc_prev: Array):
  """One flash step: fold logits s (already masked) and values v into (m, l, acc)."""
  m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
  p = jnp.exp(s - m_new)
  alpha = jnp.exp(m_prev - m_new)
  l_new = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
  acc_new = alpha * acc_prev + dot(p.astype(v.dtype), v)
  return m_new, l_new, acc_new


def probs(s: Array, lse: Array) -> Array:
  """Recomputed softmax tile from masked logits and the saved log-sum-exp column."""
  return jnp.exp(s - lse)


def grad_logits(p: Array, dp: Array, delta: Array, scale: float) -> Array:
  """dL/d(q.k) for one map: scale * P * (dP - rowsum(dO * O))."""
  return (p * (dp - delta)) * scale
