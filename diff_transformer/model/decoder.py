"""The decoder shared by all variants: embed -> L pre-norm blocks (scanned) -> RMSNorm -> LM head."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer.model.attention import VARIANTS
from diff_transformer.model.layers import RMSNorm, SwiGLU, dense
from diff_transformer.model.spec import ModelSpec
from diff_transformer.sharding import constrain

Array = jax.Array
ACT = ("batch", "length", "act_embed")


class Block(nnx.Module):
  """y = x + Attn(RMSNorm(x)); x' = y + SwiGLU(RMSNorm(y))."""

  def __init__(self, spec: ModelSpec, layer_idx, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(spec.d_model)
    self.attn = VARIANTS[spec.variant](spec, layer_idx, rngs=rngs)
    self.mlp_norm = RMSNorm(spec.d_model)
    self.mlp = SwiGLU(spec.d_model, spec.ffn_dim, dtype=spec.compute_dtype, std=spec.init_std,
                      rngs=rngs)

  def __call__(self, x_BTD, positions_BT, segment_ids_BT, capture: bool = False):
    attn_in_BTD = self.attn_norm(x_BTD)
    aux = None
    if capture:
      y_BTD, maps = self.attn(attn_in_BTD, positions_BT, segment_ids_BT, return_maps=True)
      aux = dict(hidden=x_BTD, attn_in=attn_in_BTD, **maps)
    else:
      y_BTD = self.attn(attn_in_BTD, positions_BT, segment_ids_BT)
    x_BTD = constrain(x_BTD + y_BTD, ACT)
    x_BTD = constrain(x_BTD + self.mlp(self.mlp_norm(x_BTD)), ACT)
    return x_BTD, aux


def _remat_policy(name: str):
  return {"full": None, "dots_saveable": jax.checkpoint_policies.dots_saveable,
          "dots_with_no_batch_dims_saveable":
              jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


class Decoder(nnx.Module):
  def __init__(self, spec: ModelSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    init = nnx.with_partitioning(nnx.initializers.normal(spec.init_std), ("vocab", "embed"))
    self.embed = nnx.Embed(spec.vocab_size, spec.d_model, dtype=spec.compute_dtype,
                           param_dtype=jnp.float32, embedding_init=init, rngs=rngs)

    @nnx.split_rngs(splits=spec.num_layers)
    @nnx.vmap(in_axes=(0, 0), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make_blocks(rngs, layer_idx):
      return Block(spec, layer_idx, rngs=rngs)

    self.blocks = make_blocks(rngs, jnp.arange(spec.num_layers))
    self.final_norm = RMSNorm(spec.d_model)
    if not spec.tie_embeddings:
      self.lm_head = dense(spec.d_model, spec.vocab_size, ("embed", "vocab"),
                           dtype=spec.compute_dtype, std=spec.init_std, rngs=rngs)

  def __call__(self, tokens_BT: Array, positions_BT: Array | None = None,
               segment_ids_BT: Array | None = None, *, capture: bool = False):
    """float32 logits [B, T, V]; with capture=True also per-layer stacked analysis tensors
    (hidden states, attention inputs, A1/A2/lambda/logits maps), each with a leading L axis."""
    if positions_BT is None:
      positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
    x_BTD = constrain(self.embed(tokens_BT), ACT)

    def body(x_BTD, block):
      return block(x_BTD, positions_BT, segment_ids_BT, capture)

    if self.spec.remat != "none":
      body = nnx.remat(body, policy=_remat_policy(self.spec.remat))
    x_BTD, aux = nnx.scan(body, in_axes=(nnx.Carry, 0), out_axes=(nnx.Carry, 0))(x_BTD, self.blocks)
    x_BTD = self.final_norm(x_BTD)
    if self.spec.tie_embeddings:
      logits_BTV = self.embed.attend(x_BTD)
    else:
      logits_BTV = self.lm_head(x_BTD)
    logits_BTV = constrain(logits_BTV.astype(jnp.float32), ("batch", "length", "vocab"))
    return (logits_BTV, aux) if capture else logits_BTV
