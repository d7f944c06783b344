"""Attention variants: adding one is a new module plus one entry here (or one call to
`register_variant` from user code, or `model.variant=module:Class`); everything variant-specific
lives on the class, its own model.* keys on its `Options`. docs/adding_a_variant.md lists the
steps. The model spec is read from the config here, since its options depend on the variant."""
import dataclasses
import importlib
import re
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
           "variant_names", "make_spec", "model_section", "nested", "nested_key",
           "other_sections_changed", "section", "set_model", "spec_from_config"]

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
  if name in {f.name for f in ModelSpec.common_fields()}:
    raise ValueError(f"variant '{name}': model.{name} is a key every variant has; name it "
                     "otherwise")
  VARIANTS[name] = cls


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


def _option_names(options: type) -> frozenset[str]:
  """The field names of a variant's Options (its own keys)."""
  return frozenset(f.name for f in dataclasses.fields(options))


def section(variant: str) -> str:
  """The config section of a variant's own keys: model.<variant>, a `module:Class` name with
  every character that a key cannot hold as '_'."""
  return re.sub(r"\W", "_", variant)


def _with_defaults(c: ml_collections.ConfigDict, fields, owner: type) -> ml_collections.ConfigDict:
  """`fields` of `owner` into `c` with their defaults (optional ones typed, so a later value is
  accepted)."""
  for f in fields:
    if f.default is None:  # ml_collections needs the type to accept a later value
      hint = typing.get_type_hints(owner)[f.name]
      kind = next(a for a in typing.get_args(hint) if a is not type(None))
      c[f.name] = ml_collections.FieldReference(None, field_type=kind)
    else:
      c[f.name] = f.default
  return c


def model_section() -> ml_collections.ConfigDict:
  """The config's `model` section: the keys every variant has, then a section per registered
  variant holding its own (model.diff.lambda_init, model.transformer.head_norm, ...); a run
  reads its variant's section alone."""
  c = _with_defaults(ml_collections.ConfigDict(), ModelSpec.common_fields(), ModelSpec)
  for name, cls in VARIANTS.items():
    c[section(name)] = _with_defaults(ml_collections.ConfigDict(),
                                      dataclasses.fields(cls.Options), cls.Options)
  return c


def make_spec(**values) -> ModelSpec:
  """The spec of the keys every variant has and the variant's own (its Options), given flat;
  another key is refused in one line."""
  variant = values.get("variant", ModelSpec.variant)
  options_type = variant_class(variant).Options
  common = {f.name for f in ModelSpec.common_fields()}
  own = _option_names(options_type)
  unknown = sorted(values.keys() - common - own)
  if unknown:
    raise ConfigError(f"model.{unknown[0]}: not a key of every variant nor an option of "
                      f"{variant} (its own: {', '.join(sorted(own)) or 'none'})")
  top = {k: v for k, v in values.items() if k in common}
  options = {k: v for k, v in values.items() if k in own}
  return ModelSpec(**top, options=options_type(**options))


def set_model(model: ml_collections.ConfigDict, **values) -> ml_collections.ConfigDict:
  """Sets model.* values given flat (as make_spec takes them): the keys every variant has, and
  the variant's own options into its section (`variant`, if given, first); returns `model`."""
  if "variant" in values:
    model.variant = values["variant"]
  for key, value in values.items():
    name = nested_key(f"model.{key}", model.variant)
    if name is None:
      raise ConfigError(f"model.{key}: not an option of {model.variant}")
    *path, last = name.split(".")[1:]
    (model[path[0]] if path else model)[last] = value
  return model


def spec_from_config(model: ml_collections.ConfigDict) -> ModelSpec:
  """The spec of the config's `model` section: the keys every variant has and its variant's own
  section (the other variants' sections are not read; config.validate refuses them changed)."""
  values = model.to_dict()
  variant = values.get("variant", ModelSpec.variant)
  options = values.pop(section(variant), {})
  sections = {section(name) for name in VARIANTS}
  values = {k: v for k, v in values.items() if k not in sections}
  flat = sorted(values.keys() & options.keys())
  if flat:
    raise ConfigError(f"model.{flat[0]}: an option of {variant}: set model.{section(variant)}."
                      f"{flat[0]}")
  return make_spec(**values, **options)


def other_sections_changed(model: ml_collections.ConfigDict) -> str | None:
  """The first key of another variant's section set away from its default (a run reads its own
  variant's section alone, so such a value would be ignored), or None."""
  for name, cls in VARIANTS.items():
    key = section(name)
    if name == model.variant or key not in model:
      continue
    for f in dataclasses.fields(cls.Options):
      if f.name in model[key] and model[key][f.name] != f.default:
        return f"model.{key}.{f.name}"
  return None


# Records and configs written before each variant's keys had a section of their own named them
# flat (model.norm_out_scale); study definitions still may (one key for cells of several
# variants). The one table from those names to today's.
def nested_key(key: str, variant: str) -> str | None:
  """Today's name of `key` for a run of `variant`: model.<option> of the variant's own ->
  model.<variant>.<option>; another variant's option -> None (it never applied); else `key`."""
  head, _, option = key.partition(".")
  if head != "model" or "." in option:
    return key
  if option in _option_names(variant_class(variant).Options):
    return f"model.{section(variant)}.{option}"
  if any(option in _option_names(cls.Options) for cls in VARIANTS.values()):
    return None
  return key


def nested(flat: dict) -> dict:
  """A flat setting or config ({"model.norm_out_scale": ..}) in today's names (nested_key),
  without the keys its variant never reads (other variants' options, flat or in their sections)."""
  variant = flat.get("model.variant", ModelSpec.variant)
  if not isinstance(variant, str) or not known_variant(variant):
    return dict(flat)
  others = {f"model.{section(name)}." for name in VARIANTS if name != variant}
  out = {}
  for key, value in flat.items():
    new = nested_key(key, variant)
    if new is not None and not any(new.startswith(o) for o in others):
      out[new] = value
  return out


def kernel_inputs(spec: ModelSpec, seq_len: int, batch: int = 1):
  """The variant's kernel inputs (a Projected of ShapeDtypeStructs: q1, k1, v, q2, k2, lam) for
  `batch` rows of `seq_len` tokens, traced from its own `project` without any arrays."""
  x = jax.ShapeDtypeStruct((batch, seq_len, spec.d_model), spec.compute_dtype)
  positions = jax.ShapeDtypeStruct((batch, seq_len), np.int32)
  layer = lambda: variant_class(spec.variant)(spec, 0, rngs=nnx.Rngs(0))
  return jax.eval_shape(lambda x, pos: layer().project(x, pos), x, positions)
