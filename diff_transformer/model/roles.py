"""What a model variable is for, declared by its type (flax's variable-types-as-filters idiom).

The optimizer reads these types, never a parameter's name, so a new variant declares its own
parameters' roles where it creates them and nothing else has to learn their names:

- `nnx.Param`: a weight (matrices, convolution taps): always weight-decayed.
- `Gain`: a normalisation gain (RMSNorm scale, DIFF's sub-layer norm): decayed only with
  train.decay_norms.
- `Lambda`: a differential-attention lambda parameter (DIFF V1 / Shared DIFF's re-parameterised
  vectors, DIFF V2's lambda projection): decayed only with train.decay_lambda.
- `Embedding`: the token embedding table (also the LM head when tied): decayed only with
  train.decay_embeddings.
- `LayerConstant`: not a parameter at all: saved with the model, never trained.
"""
from __future__ import annotations

from flax import nnx


class Gain(nnx.Param):
  """A normalisation gain."""


class Lambda(nnx.Param):
  """A differential-attention lambda parameter."""


class Embedding(nnx.Param):
  """The token embedding table."""


class LayerConstant(nnx.Variable):
  """A per-layer constant (e.g. lambda_init): saved with the model, never trained."""


ROLES = {Gain: "norm", Lambda: "lambda", Embedding: "embedding"}


def role(variable: nnx.Variable) -> str:
  """'norm', 'lambda', 'embedding' or 'weight' (a plain nnx.Param)."""
  return next((name for kind, name in ROLES.items() if isinstance(variable, kind)), "weight")


def declare(module: nnx.Module, name: str, kind: type[nnx.Param]) -> None:
  """Re-types a parameter a library layer created as nnx.Param (e.g. nnx.Linear's kernel),
  keeping its value and metadata."""
  old = getattr(module, name)
  setattr(module, name, kind(old[...], **old.get_metadata()))
