"""Model: decoder, attention variants, layers. Build one with `build_model(config.model, rngs)`."""
from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from diff_transformer.model.decoder import Block, Decoder
from diff_transformer.model.spec import ModelSpec
from diff_transformer.model.attention import spec_from_config

__all__ = ["Block", "Decoder", "ModelSpec", "build_model", "split_params"]


def build_model(model_config: ml_collections.ConfigDict | ModelSpec, rngs: nnx.Rngs) -> Decoder:
  """Parameters are created sharded by the logical rules when a mesh is set, plain otherwise."""
  spec = model_config if isinstance(model_config, ModelSpec) else spec_from_config(model_config)
  with nnx.use_eager_sharding(not jax.sharding.get_abstract_mesh().empty):
    return Decoder(spec, rngs=rngs)


def split_params(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
  """(graph, parameters, constants): the trained nnx.Param variables apart from every other
  variable (the fixed tables a model carries), as train states and checkpoints hold them."""
  graphdef, params, constants = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]
  return graphdef, params, constants
