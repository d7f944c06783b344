"""What a model variable is for, declared by its type (flax's variable-types-as-filters idiom).

The optimizer reads these types, never a parameter's name, so a new variant declares its own
parameters' roles where it creates them and nothing else has to learn their names. A role
carries its own behaviour: `decay_flag`, the train config key that decides whether AdamW decays
it, or `decay`, a fixed answer; a new role is one class (anywhere), nothing else:

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
  decay_flag = "decay_norms"


class Lambda(nnx.Param):
  """A differential-attention lambda parameter."""
  decay_flag = "decay_lambda"


class Embedding(nnx.Param):
  """The token embedding table."""
  decay_flag = "decay_embeddings"


class LayerConstant(nnx.Variable):
  """A per-layer constant (e.g. lambda_init): saved with the model, never trained."""


def decayed(variable: nnx.Variable, train_config) -> bool:
  """Whether AdamW decays this parameter: its role's `decay_flag` in `train_config` when the
  role names one, else its role's fixed `decay` (a plain nnx.Param, a weight: True)."""
  kind = type(variable)
  flag = getattr(kind, "decay_flag", None)
  if flag is not None:
    return bool(train_config[flag])
  return bool(getattr(kind, "decay", True))


def declare(module: nnx.Module, name: str, kind: type[nnx.Param]) -> None:
  """Re-types a parameter a library layer created as nnx.Param (e.g. nnx.Linear's kernel),
  keeping its value and metadata."""
  old = getattr(module, name)
  setattr(module, name, kind(old[...], **old.get_metadata()))
