"""Attention variants: adding one is a new module plus one entry here (or one call to
`register_variant` from user code); everything variant-specific lives on the class."""
from diff_transformer.errors import ConfigError
from diff_transformer.model.attention.base import Attention, LayerConstant, Projected
from diff_transformer.model.attention.diff_v1 import DiffAttention
from diff_transformer.model.attention.diff_v2 import DiffV2Attention
from diff_transformer.model.attention.shared_diff import SharedDiffAttention
from diff_transformer.model.attention.transformer import TransformerAttention

__all__ = ["Attention", "LayerConstant", "Projected", "VARIANTS", "DiffAttention",
           "DiffV2Attention", "SharedDiffAttention", "TransformerAttention", "register_variant",
           "unregister_variant", "variant_class", "variant_names"]

VARIANTS: dict[str, type[Attention]] = {
    "transformer": TransformerAttention,
    "diff": DiffAttention,
    "shared_diff": SharedDiffAttention,
    "diff_v2": DiffV2Attention,
}


def register_variant(name: str, cls: type[Attention]) -> None:
  """Makes `model.variant=name` build `cls` everywhere (config checks, training, evaluation)."""
  if not (isinstance(cls, type) and issubclass(cls, Attention)):
    raise TypeError(f"variant '{name}': {cls!r} is not an Attention subclass")
  if "-" in name:  # preset and sweep names are <variant>-<size>
    raise ValueError(f"variant '{name}': names may not contain '-'")
  if name in VARIANTS and VARIANTS[name] is not cls:
    raise ValueError(f"variant '{name}' is already registered as {VARIANTS[name].__name__}")
  VARIANTS[name] = cls


def unregister_variant(name: str) -> None:
  VARIANTS.pop(name, None)


def variant_names() -> tuple[str, ...]:
  return tuple(VARIANTS)


def variant_class(name: str) -> type[Attention]:
  """The registered class, or ConfigError naming model.variant."""
  if name not in VARIANTS:
    raise ConfigError(f"model.variant: unknown variant '{name}'; choose one of "
                      f"{', '.join(VARIANTS)}")
  return VARIANTS[name]
