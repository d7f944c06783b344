"""Attention variants: adding one is a new module plus one entry here (or one call to
`register_variant` from user code, or `model.variant=module:Class`); everything variant-specific
lives on the class, its own model.* keys on its `Options`. docs/adding_a_variant.md lists the
steps. The model spec is read from the config here, since its options depend on the variant."""
import dataclasses
import importlib
import typing

import jax
import ml_collections
import numpy as np
from flax import nnx

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention.base import Attention, Projected
from diff_transformer.model.attention.diff_v1 import DiffAttention
from diff_transformer.model.attention.diff_v2 import DiffV2Attention
from diff_transformer.model.attention.shared_diff import SharedDiffAttention
from diff_transformer.model.attention.transformer import TransformerAttention
from diff_transformer.model.roles import LayerConstant
from diff_transformer.model.spec import ModelSpec

__all__ = ["Attention", "LayerConstant", "Projected", "PAPER_VARIANTS", "VARIANTS", "DiffAttention",
           "DiffV2Attention", "SharedDiffAttention", "TransformerAttention", "known_variant",
           "recorded_variant", "register_variant", "unregister_variant", "variant_class",
           "variant_names", "make_spec", "model_section", "spec_from_config"]

VARIANTS: dict[str, type[Attention]] = {
    "transformer": TransformerAttention,
    "diff": DiffAttention,
    "shared_diff": SharedDiffAttention,
    "diff_v2": DiffV2Attention,
}
# What presets, sweeps, studies and AOT compiles cover: the papers' four, named here so that
# registering a variant never grows them silently (they take others only when listed).
PAPER_VARIANTS = ("transformer", "diff", "shared_diff", "diff_v2")


def register_variant(name: str, cls: type[Attention]) -> None:
  """Makes `model.variant=name` build `cls` everywhere (config checks, training, evaluation)."""
  if not (isinstance(cls, type) and issubclass(cls, Attention)):
    raise TypeError(f"variant '{name}': {cls!r} is not an Attention subclass")
  if "-" in name:  # preset and sweep names are <variant>-<size>
    raise ValueError(f"variant '{name}': names may not contain '-'")
  if name in VARIANTS and VARIANTS[name] is not cls:
    raise ValueError(f"variant '{name}' is already registered as {VARIANTS[name].__name__}")
  _check_options(name, cls)
  VARIANTS[name] = cls


def _check_options(name: str, cls: type[Attention]) -> None:
  """A variant's own keys share the config's `model` section with every other's: one that is a
  key every variant has, or another variant's key with another default, is refused here, when
  registering, not later in some config."""
  common = {f.name for f in ModelSpec.common_fields()}
  owned: dict[str, tuple] = {}  # key -> (default, its first owner)
  for other, known in VARIANTS.items():
    if known is not cls:
      for f in dataclasses.fields(known.Options):
        owned.setdefault(f.name, (f.default, other))
  for f in dataclasses.fields(cls.Options):
    if f.name in common:
      raise ValueError(f"variant '{name}': option {f.name} is a key every variant has "
                       f"(model.{f.name}); name it otherwise")
    if f.name in owned and owned[f.name][0] != f.default:
      default, other = owned[f.name]
      raise ValueError(f"variant '{name}': option {f.name} defaults to {f.default!r}, "
                       f"{other}'s to {default!r}")


def unregister_variant(name: str) -> None:
  VARIANTS.pop(name, None)


def variant_names() -> tuple[str, ...]:
  return tuple(VARIANTS)


def variant_class(name: str) -> type[Attention]:
  """The class of a registered name or of `module:Class` (imported and registered under that
  name, so a run can name a variant that lives outside this package); else ConfigError."""
  if name in VARIANTS:
    return VARIANTS[name]
  if ":" not in name:
    raise ConfigError(f"model.variant: unknown variant '{name}'; choose one of "
                      f"{', '.join(VARIANTS)}, or name a class as module:Class")
  module, _, attr = name.partition(":")
  try:
    cls = getattr(importlib.import_module(module), attr)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"model.variant: cannot import '{name}' ({type(e).__name__}: {e})") from None
  if not (isinstance(cls, type) and issubclass(cls, Attention)):
    raise ConfigError(f"model.variant: '{name}' is not an Attention subclass")
  try:
    register_variant(name, cls)
  except ValueError as e:  # its own keys clash with another variant's
    raise ConfigError(f"model.variant: {e}") from None
  return cls


def known_variant(name: str) -> bool:
  """A registered name or an importable module:Class (what sweeps and studies accept)."""
  try:
    variant_class(name)
  except ConfigError:
    return False
  return True


def recorded_variant(name: str) -> str:
  """The name a run records so other programs can rebuild it: a variant registered from user
  code is recorded as module:Class (eval.py, export.py and lm-eval import it from there)."""
  cls = variant_class(name)
  if ":" in name or cls.__module__.startswith("diff_transformer.") or cls.__module__ == "__main__":
    return name  # built in, already a path, or not importable by another program
  return f"{cls.__module__}:{cls.__qualname__}"


def _option_fields() -> dict[str, tuple[dataclasses.Field, list[str]]]:
  """Every registered variant's own keys: name -> (field, the variants that own it)."""
  out: dict[str, tuple[dataclasses.Field, list[str]]] = {}
  for name, cls in VARIANTS.items():  # registering checked that shared keys share defaults
    for f in dataclasses.fields(cls.Options):
      out.setdefault(f.name, (f, []))[1].append(name)
  return out


def model_section() -> ml_collections.ConfigDict:
  """The config's `model` section: the keys every variant has, then each registered variant's
  own, each with its default (optional ones typed, so a later value is accepted)."""
  c = ml_collections.ConfigDict()
  fields: list[tuple[dataclasses.Field, type]] = [(f, ModelSpec) for f in ModelSpec.common_fields()]
  fields += [(f, VARIANTS[owners[0]].Options) for f, owners in _option_fields().values()]
  for f, owner in fields:
    if f.default is None:  # ml_collections needs the type to accept a later value
      hint = typing.get_type_hints(owner)[f.name]
      kind = next(a for a in typing.get_args(hint) if a is not type(None))
      c[f.name] = ml_collections.FieldReference(None, field_type=kind)
    else:
      c[f.name] = f.default
  return c


def make_spec(**values) -> ModelSpec:
  """The spec of flat model.* values: the keys every variant has, and the variant's own
  (its Options). Another variant's key is accepted only at its default (the config section
  holds every variant's keys); a key nobody owns is refused. One line each."""
  variant = values.get("variant", ModelSpec.variant)
  options_type = variant_class(variant).Options
  common = {f.name for f in ModelSpec.common_fields()}
  own = {f.name for f in dataclasses.fields(options_type)}
  others = _option_fields()
  top, options = {}, {}
  for key, value in values.items():
    if key in common:
      top[key] = value
    elif key in own:
      options[key] = value
    elif key in others:
      field, owners = others[key]
      if value != field.default:
        raise ConfigError(f"model.{key}: an option of {', '.join(owners)}, not of {variant} "
                          f"(leave it at {field.default!r})")
    else:
      known = sorted(common | set(others))
      raise ConfigError(f"model.{key}: unknown key; known keys here: {', '.join(known)}")
  return ModelSpec(**top, options=options_type(**options))


def spec_from_config(model: ml_collections.ConfigDict) -> ModelSpec:
  """The spec of the config's `model` section (make_spec's rules)."""
  return make_spec(**model.to_dict())


def kernel_inputs(spec: ModelSpec, seq_len: int, batch: int = 1):
  """The variant's kernel inputs (a Projected of ShapeDtypeStructs: q1, k1, v, q2, k2, lam) for
  `batch` rows of `seq_len` tokens, traced from its own `project` without any arrays."""
  x = jax.ShapeDtypeStruct((batch, seq_len, spec.d_model), spec.compute_dtype)
  positions = jax.ShapeDtypeStruct((batch, seq_len), np.int32)
  return jax.eval_shape(lambda x, pos: variant_class(spec.variant)(spec, 0, rngs=nnx.Rngs(0)).project(
      x, pos), x, positions)
