"""Attention variants: adding one is a new module plus one entry here."""
from diff_transformer.model.attention.base import Attention, LayerConstant, Projected
from diff_transformer.model.attention.diff_v1 import DiffAttention
from diff_transformer.model.attention.diff_v2 import DiffV2Attention
from diff_transformer.model.attention.shared_diff import SharedDiffAttention
from diff_transformer.model.attention.transformer import TransformerAttention

__all__ = ["Attention", "LayerConstant", "Projected", "VARIANTS", "DiffAttention",
           "DiffV2Attention", "SharedDiffAttention", "TransformerAttention"]

VARIANTS: dict[str, type[Attention]] = {
    "transformer": TransformerAttention,
    "diff": DiffAttention,
    "shared_diff": SharedDiffAttention,
    "diff_v2": DiffV2Attention,
}
