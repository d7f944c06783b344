"""The decoder shared by all variants: embed -> L pre-norm blocks (scanned) -> RMSNorm -> LM
head."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer import kernels
from diff_transformer.model import cache as kv_cache
from diff_transformer.model.attention import variant_class
from diff_transformer.model.layers import RMSNorm, ShortConv, SwiGLU, dense
from diff_transformer.model.roles import Embedding, declare
from diff_transformer.model.spec import ModelSpec
from diff_transformer.sharding import (ACT_EMBED, BATCH, EMBED, LAYERS, LENGTH, VOCAB,
                                       constrain)

Array = jax.Array
ACT = (BATCH, LENGTH, ACT_EMBED)


class Block(nnx.Module):
  """y = x + Attn(RMSNorm(x)); x' = y + SwiGLU(RMSNorm(y)). With model.short_conv > 0 the
  attention input is RMSNorm(x) + conv(RMSNorm(x)) (layers.ShortConv)."""

  def __init__(self, spec: ModelSpec, layer_idx, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(spec.d_model)
    self.conv = ShortConv(spec.d_model, spec.short_conv, rngs=rngs) if spec.short_conv else None
    self.attn = variant_class(spec.variant)(spec, layer_idx, rngs=rngs)
    self.mlp_norm = RMSNorm(spec.d_model)
    self.mlp = SwiGLU(spec.d_model, spec.ffn_dim, dtype=spec.compute_dtype, std=spec.init_std,
                      rngs=rngs)

  def __call__(self, x_BTD, positions_BT, segment_ids_BT, capture: bool = False,
               metric_weights_BT=None):
    """(output, aux): aux is the analysis tensors with capture, the attention's training
    metrics with metric_weights_BT, else None."""
    attn_in_BTD = self.attn_norm(x_BTD)
    if self.conv is not None:
      attn_in_BTD = self.conv(attn_in_BTD, segment_ids_BT)
    aux = None
    if metric_weights_BT is not None:
      y_BTD, aux = self.attn(attn_in_BTD, positions_BT, segment_ids_BT,
                             metric_weights_BT=metric_weights_BT)
    elif capture:
      y_BTD, maps = self.attn(attn_in_BTD, positions_BT, segment_ids_BT, return_maps=True)
      aux = dict(hidden=x_BTD, attn_in=attn_in_BTD, **maps)
    else:
      y_BTD = self.attn(attn_in_BTD, positions_BT, segment_ids_BT)
    return self._mlp(x_BTD + y_BTD), aux

  def decode(self, x_BTD, positions_BT, cache_k, cache_v, layer, conv_state, start_B,
             advance_B, mask_BTS):
    """cache_k / cache_v: every layer's (this block writes and reads row `layer`)."""
    attn_in_BTD = self.attn_norm(x_BTD)
    if self.conv is not None:
      attn_in_BTD, conv_state = self.conv.step(attn_in_BTD, conv_state, advance_B)
    y_BTD, cache_k, cache_v = self.attn.decode(attn_in_BTD, positions_BT, cache_k, cache_v,
                                               layer, start_B, mask_BTS)
    return self._mlp(x_BTD + y_BTD), cache_k, cache_v, conv_state

  def _mlp(self, y_BTD):
    y_BTD = constrain(y_BTD, ACT)
    return constrain(y_BTD + self.mlp(self.mlp_norm(y_BTD)), ACT)


def _remat_policy(name: str):
  return {"full": None, "dots_saveable": jax.checkpoint_policies.dots_saveable,
          "dots_with_no_batch_dims_saveable":
              jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


def unrolled(spec: ModelSpec) -> bool:
  """Whether the blocks run unrolled (model.layer_loop; "auto": on CPU, where the loop over the
  stacked layers measured slower, and not where a deep preset would compile every layer)."""
  if spec.layer_loop == "auto":
    return kernels.auto.target() == "cpu"
  return spec.layer_loop == "unroll"


class Decoder(nnx.Module):
  def __init__(self, spec: ModelSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    init = nnx.with_partitioning(nnx.initializers.normal(spec.init_std), (VOCAB, EMBED))
    self.embed = nnx.Embed(spec.vocab_size, spec.d_model, dtype=spec.compute_dtype,
                           param_dtype=jnp.float32, embedding_init=init, rngs=rngs)
    declare(self.embed, "embedding", Embedding)

    @nnx.split_rngs(splits=spec.num_layers)
    @nnx.vmap(in_axes=(0, 0), out_axes=0, transform_metadata={nnx.PARTITION_NAME: LAYERS})
    def make_blocks(rngs, layer_idx):
      return Block(spec, layer_idx, rngs=rngs)

    self.blocks = make_blocks(rngs, jnp.arange(spec.num_layers))
    self.final_norm = RMSNorm(spec.d_model)
    if not spec.tie_embeddings:
      self.lm_head = dense(spec.d_model, spec.vocab_size, (EMBED, VOCAB),
                           dtype=spec.compute_dtype, std=spec.init_std, rngs=rngs)

  def __call__(self, tokens_BT: Array, positions_BT: Array | None = None,
               segment_ids_BT: Array | None = None, *, capture: bool = False,
               metric_weights_BT: Array | None = None):
    """float32 logits [B, T, V]; with capture=True also per-layer stacked analysis tensors
    (hidden states, attention inputs, A1/A2/lambda maps), with metric_weights_BT (the real
    tokens) the attention's training metrics (e.g. lambda), each with a leading L axis."""
    if positions_BT is None:
      positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    x_BTD = constrain(self.embed(tokens_BT), ACT)

    def body(x_BTD, block):
      return block(x_BTD, positions_BT, segment_ids_BT, capture, metric_weights_BT)

    if self.spec.remat != "none":
      body = nnx.remat(body, policy=_remat_policy(self.spec.remat))
    x_BTD, aux = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0),
                          unroll=unrolled(self.spec))(x_BTD, self.blocks)
    logits_BTV = self._logits(x_BTD)
    return (logits_BTV, aux) if capture or metric_weights_BT is not None else logits_BTV

  def init_cache(self, batch: int, max_len: int) -> kv_cache.KVCache:
    """An empty KV cache for `batch` rows of up to `max_len` tokens (see model/cache.py)."""
    return kv_cache.init(self.spec, variant_class(self.spec.variant).cache_layout(self.spec),
                         batch, max_len)

  def decode(self, tokens_BT: Array, cache: kv_cache.KVCache, lengths_B: Array | None = None
             ) -> tuple[Array, kv_cache.KVCache]:
    """Incremental forward: float32 logits [B, T, V] for T new tokens and the updated cache.

    Row b's tokens go to positions cache.lengths[b] + t and attend to everything cached before
    them (an explicit mask over the cache, through the 'xla' path). Start a prompt with
    `prefill`, then decode one token at a time (or a chunk). For right-padded tokens pass their
    true `lengths_B`: the cache then advances by those lengths, the padding is overwritten by
    the next call, and the logits at lengths_B - 1 predict each row's next token. The caller
    keeps cache.lengths + T <= cache.max_len (writes beyond it are dropped).
    """
    return self._cached_forward(tokens_BT, cache, lengths_B, fresh=False)

  def prefill(self, tokens_BT: Array, max_len: int, lengths_B: Array | None = None
              ) -> tuple[Array, kv_cache.KVCache]:
    """`decode` of a prompt into a new cache of `max_len` positions. Nothing is cached before
    it, so the prompt attends causally within itself through the model's own kernel, as in
    training (cuDNN or Pallas on a GPU), with no mask over the cache. Right padding is as
    `decode` says: causal attention never lets a real token see the padding after it."""
    B, T = tokens_BT.shape
    if T > max_len:
      raise ValueError(f"prefill: a prompt of {T} tokens does not fit a cache of {max_len}")
    return self._cached_forward(tokens_BT, self.init_cache(B, max_len), lengths_B, fresh=True)

  def _cached_forward(self, tokens_BT, cache, lengths_B, fresh: bool):
    start_B = cache.lengths
    q_len = tokens_BT.shape[1]
    positions_BT = start_B[:, None] + jnp.arange(q_len, dtype=jnp.int32)[None, :]
    # fresh: the cache is empty, so the new tokens are all there is to attend to (causally).
    mask_BTS = None if fresh else kv_cache.decode_mask(start_B, q_len, cache.max_len)
    x_BTD = constrain(self.embed(tokens_BT), ACT)
    advance_B = jnp.full_like(start_B, q_len) if lengths_B is None else lengths_B

    # The stacked caches ride in the carry and each layer writes its new entries into them in
    # place: as scan outputs, every step would rebuild (and first zero) the whole cache.
    def body(carry, block, conv_state):
      x_BTD, k, v, layer = carry
      x_BTD, k, v, conv_state = block.decode(x_BTD, positions_BT, k, v, layer, conv_state,
                                             start_B, advance_B, mask_BTS)
      return (x_BTD, k, v, layer + 1), conv_state

    (x_BTD, k, v, _), conv = nnx.scan(body, in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0),
                                      unroll=unrolled(self.spec))(
        (x_BTD, cache.k, cache.v, jnp.int32(0)), self.blocks, cache.conv)
    return self._logits(x_BTD), kv_cache.KVCache(k=k, v=v, conv=conv,
                                                 lengths=start_B + advance_B)

  def _logits(self, x_BTD: Array) -> Array:
    x_BTD = self.final_norm(x_BTD)
    if self.spec.tie_embeddings:
      logits_BTV = self.embed.attend(x_BTD)
    else:
      logits_BTV = self.lm_head(x_BTD)
    return constrain(logits_BTV.astype(jnp.float32), (BATCH, LENGTH, VOCAB))
