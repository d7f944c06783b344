"""KV cache for incremental decoding (what each variant keeps per token).

Per layer and token the cache holds the keys and values the kernel reads:
- transformer, diff_v2: h_kv keys of width d and h_kv values of width d;
- diff, shared_diff: 2 h_kv keys of width d ([K1; K2] along the head axis) and h_kv values of
  width 2d.
With model.short_conv = W > 0 it also keeps each row's last W - 1 attention inputs per layer
(`conv`), so the convolution decodes exactly. Arrays carry a leading layer axis (the decoder scans its stacked blocks). `lengths[b]` is how many
positions of row b are filled; a decode call writes its T tokens at lengths[b] .. lengths[b]+T-1
and each query attends to the filled positions up to itself, so rows may hold prompts of
different lengths (right-padded prefill: pass the true lengths and the padding is overwritten).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  k: Array  # [L, B, S, cached key heads, d]
  v: Array  # [L, B, S, h_kv, value width]
  lengths: Array  # int32 [B]: filled positions per row
  # [L, B, short_conv - 1, D]: the last attention inputs of each row for model.short_conv
  # (width 0 when the model has no short convolution).
  conv: Array

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  @property
  def values_per_token(self) -> int:
    """Cached numbers per token over all layers (keys plus values)."""
    return self.k.shape[0] * (math.prod(self.k.shape[3:]) + math.prod(self.v.shape[3:]))


Layout = tuple[tuple[int, int], tuple[int, int]]  # ((key heads, width), (value heads, width))


def init(spec, layout: Layout, batch: int, max_len: int) -> KVCache:
  """Empty arrays for `layout`, the variant's `Attention.cache_layout(spec)`."""
  (kh, kw), (vh, vw) = layout
  shape = (spec.num_layers, batch, max_len)
  conv_width = max(spec.short_conv - 1, 0)
  return KVCache(k=jnp.zeros(shape + (kh, kw), spec.compute_dtype),
                 v=jnp.zeros(shape + (vh, vw), spec.compute_dtype),
                 lengths=jnp.zeros((batch,), jnp.int32),
                 conv=jnp.zeros((spec.num_layers, batch, conv_width, spec.d_model),
                                spec.compute_dtype))


def write(cache_BSKH: Array, new_BTKH: Array, start_B: Array) -> Array:
  """Writes each row's T new entries at its own start position."""
  put = lambda c, x, i: jax.lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), i, axis=0)
  return jax.vmap(put)(cache_BSKH, new_BTKH, start_B)


def decode_mask(start_B: Array, q_len: int, max_len: int) -> Array:
  """bool [B, T, S]: query t of row b (at position start_b + t) sees cache positions <= it."""
  query_pos_BT = start_B[:, None] + jnp.arange(q_len)[None, :]
  return jnp.arange(max_len)[None, None, :] <= query_pos_BT[:, :, None]
