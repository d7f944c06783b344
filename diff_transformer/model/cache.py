"""KV cache for incremental decoding (what each variant keeps per token).

Per layer and token the cache holds the keys and values the kernel reads:
- transformer, diff_v2: h_kv keys of width d and h_kv values of width d;
- diff, shared_diff: 2 h_kv keys of width d ([K1; K2] along the head axis) and h_kv values of
  width 2d.
With model.short_conv = W > 0 it also keeps each row's last W - 1 attention inputs per layer
(`conv`), so the convolution decodes exactly. Arrays carry a leading layer axis (the decoder
scans its stacked blocks and carries the whole cache, each layer writing only its new entries).
`lengths[b]` is how many positions of row b are filled; a decode call writes its T tokens at
lengths[b] .. lengths[b]+T-1 and each query attends to the filled positions up to itself, so
rows may hold prompts of different lengths (right-padded prefill: pass the true lengths and the
padding is overwritten).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  # Head-major, so a layer's keys and values are the batched QK^T and PV products' operands as
  # they lie (a token-major cache is transposed whole by every decoding step).
  k: Array  # [L, B, cached key heads, S, d]
  v: Array  # [L, B, h_kv, S, value width]
  lengths: Array  # int32 [B]: filled positions per row
  # [L, B, short_conv - 1, D]: the last attention inputs of each row for model.short_conv
  # (width 0 when the model has no short convolution).
  conv: Array

  @property
  def max_len(self) -> int:
    return self.k.shape[3]

  @property
  def values_per_token(self) -> int:
    """Cached numbers per token over all layers (keys plus values)."""
    per_layer = lambda a: a.shape[2] * a.shape[4]
    return self.k.shape[0] * (per_layer(self.k) + per_layer(self.v))


Layout = tuple[tuple[int, int], tuple[int, int]]  # ((key heads, width), (value heads, width))


def init(spec, layout: Layout, batch: int, max_len: int) -> KVCache:
  """Empty arrays for `layout`, the variant's `Attention.cache_layout(spec)`."""
  (kh, kw), (vh, vw) = layout
  L = spec.num_layers
  conv_width = max(spec.short_conv - 1, 0)
  return KVCache(k=jnp.zeros((L, batch, kh, max_len, kw), spec.compute_dtype),
                 v=jnp.zeros((L, batch, vh, max_len, vw), spec.compute_dtype),
                 lengths=jnp.zeros((batch,), jnp.int32),
                 conv=jnp.zeros((spec.num_layers, batch, conv_width, spec.d_model),
                                spec.compute_dtype))


def write(cache_LBKSH: Array, layer: Array, new_BTKH: Array, start_B: Array) -> Array:
  """Writes layer `layer`'s T new entries of each row at the row's own start position, in the
  stacked cache itself: only the new entries move (a scatter XLA does in place), not the
  layer's whole cache. Positions past the cache's end are dropped."""
  B, T = new_BTKH.shape[:2]
  rows_B1 = jnp.arange(B)[:, None]
  positions_BT = start_B[:, None] + jnp.arange(T)[None, :]
  # (layer, row, :, position): the indexed axes come first, so the update is [B, T, K, H].
  return cache_LBKSH.at[layer, rows_B1, :, positions_BT].set(
      new_BTKH.astype(cache_LBKSH.dtype), mode="drop")


def layer_view(cache_LBKSH: Array, layer: Array) -> Array:
  """Layer `layer`'s entries as the kernels take them, [B, S, K, H] (a transpose XLA folds
  into the attention's products)."""
  return jnp.swapaxes(cache_LBKSH[layer], 1, 2)


def decode_mask(start_B: Array, q_len: int, max_len: int) -> Array:
  """bool [B, T, S]: query t of row b (at position start_b + t) sees cache positions <= it."""
  query_pos_BT = start_B[:, None] + jnp.arange(q_len)[None, :]
  return jnp.arange(max_len)[None, None, :] <= query_pos_BT[:, :, None]
