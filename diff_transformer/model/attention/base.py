"""What every attention variant shares: project -> kernel -> output, and the analysis path.

A variant subclasses `Attention` and defines `project` (inputs to the kernel contract of
kernels/common.py, RoPE applied) and `output` (heads back to d_model). Everything else (kernel
choice, packing masks, attention maps for analysis, KV-cache decoding) lives here once.

What the rest of the code asks of a variant is a class method here, overridden where the variant
differs: its head rule (`heads_for`, `query_heads`), its config checks (`check`, raising
ConfigError), its attention FLOPs, its KV-cache layout and its training metrics (`metrics`).
Its own knobs are its `Options`: a frozen dataclass whose fields are `model.*` keys, with
their defaults and their `check`; the model spec carries them as `spec.options`. Adding a
variant is its module plus one entry in the registry (model/attention/__init__.py).
docs/semantics.md states each variant's semantics and the tensor-name legend (x_BTD, o_BTNH).
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Generic, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer import kernels
from diff_transformer.errors import ConfigError
from diff_transformer.kernels import reference
from diff_transformer.model import cache as kv_cache
from diff_transformer.model.layers import dense, rope
from diff_transformer.model.spec import ModelSpec

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Projected:
  """Kernel inputs (see kernels/common.py) for one attention call."""
  q1: Array
  k1: Array
  v: Array
  q2: Array | None = None
  k2: Array | None = None
  lam: Array | None = None
  out_lam: Array | None = None  # lambda applied by the variant's output() instead of the kernel


@dataclasses.dataclass(frozen=True)
class VariantOptions:
  """A variant's own keys, its config section model.<variant>.* (none here); a subclass adds
  fields with their defaults."""

  @property
  def fixed_norm_out_scale(self) -> float | None:
    """A variant without model.norm_out_scale has no fixed multiplier (NormOutOptions has)."""
    return None

  def check(self, at: str) -> None:
    """Raises ConfigError (one line naming the field) for a value this variant cannot take."""


@dataclasses.dataclass(frozen=True)
class NormOutOptions(VariantOptions):
  """model.norm_out_scale, the attention branch's multiplier before W_O (after the per-head output
  norm where the variant has one, which gave the key its name): "rule" is the variant's own (1
  where it has none), a positive number (written as text, "0.2") is fixed in every layer. A
  variant with other named rules lists them in NORM_OUT_RULES. Under Adam a fixed multiplier s
  is W_O's initial scale and learning rate times s (docs/semantics.md)."""
  norm_out_scale: str = "rule"
  NORM_OUT_RULES: ClassVar[tuple[str, ...]] = ("rule",)

  @property
  def fixed_norm_out_scale(self) -> float | None:
    """model.norm_out_scale as a number, or None where it names a rule."""
    try:
      return float(self.norm_out_scale)
    except ValueError:
      return None

  def check(self, at: str) -> None:
    if self.norm_out_scale == "rule":
      return
    fixed = self.fixed_norm_out_scale
    if self.norm_out_scale not in self.NORM_OUT_RULES and not (
        fixed is not None and 0 < fixed < float("inf")):
      raise ConfigError(f"{at}.norm_out_scale: '{self.norm_out_scale}' is not a positive number "
                        f"or one of {', '.join(self.NORM_OUT_RULES)} here")


def lambda_init_value(layer_idx, constant: float | None):
  """0.8 - 0.6 exp(-0.3 l) with l counted from 0 (first layer 0.2), or the ablation's constant."""
  if constant is not None:
    return jnp.asarray(constant, jnp.float32)
  return 0.8 - 0.6 * jnp.exp(-0.3 * jnp.asarray(layer_idx, jnp.float32))


O = TypeVar("O", bound=VariantOptions)  # the variant's Options: Attention[DiffOptions]


class Attention(nnx.Module, Generic[O]):
  # How the analysis suites name the map the variant attends with.
  map_name = "A"
  # The Hugging Face target it exports to and imports from (interop/weights.py TARGETS); None:
  # none (export and import refuse it in one line).
  hf_target: str | None = None
  # The variant's own model.* keys, their defaults and checks (spec.options is one of these).
  Options: type[VariantOptions] = VariantOptions

  def __init__(self, spec: ModelSpec[O], layer_idx, *, rngs: nnx.Rngs):
    del layer_idx, rngs
    self.spec: ModelSpec[O] = spec
    self.kernel = spec.kernel
    # Analysis option: dynamic absmax quantisation of the attention logits to this many bits
    # (reference kernel only; evaluation sets it on a copy of the model, training never does).
    self.logit_bits: int | None = None

  @classmethod
  def cache_layout(cls, spec: ModelSpec) -> tuple[tuple[int, int], tuple[int, int]]:
    """((key heads, key width), (value heads, value width)) a KV cache keeps per token."""
    return (spec.kv_heads, spec.head_dim), (spec.kv_heads, spec.head_dim)

  @classmethod
  def heads_for(cls, d_model: int, head_dim: int) -> int:
    """model.num_heads at width D and head width H in the papers' parameter-matched setups."""
    return d_model // head_dim

  @classmethod
  def query_heads(cls, spec: ModelSpec) -> int:
    """Query heads per kernel map; the kv heads must divide them (GQA groups)."""
    return spec.num_heads

  @classmethod
  def check(cls, spec: ModelSpec) -> None:
    """Raises ConfigError (one line naming the field) for settings this variant cannot build."""
    if spec.num_heads * spec.head_dim != spec.d_model:
      raise ConfigError(f"model.head_dim: num_heads * head_dim = {spec.num_heads * spec.head_dim}"
                        f" must equal d_model = {spec.d_model} for {spec.variant}"
                        f"{cls.heads_fix(spec)}")

  @classmethod
  def heads_fix(cls, spec: ModelSpec) -> str:
    """The fix a head-count error names: this variant's head count at the same D and d (the
    papers' parameter-matched rule), e.g. after switching --config.model.variant."""
    heads = cls.heads_for(spec.d_model, spec.head_dim)
    return (f"; at head_dim {spec.head_dim} set --config.model.num_heads={heads} (this variant's "
            "parameter-matched head count)" if heads > 0 else "")

  @classmethod
  def attention_flops(cls, spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of one layer's score and value matmuls against all `seq_len`
    keys (callers halve it for causal attention): QK^T and AV for N query heads of width H."""
    return 2 * seq_len * spec.num_heads * spec.head_dim * 2

  def metrics(self, p: Projected, weights_BT: Array) -> dict[str, Array]:
    """Scalars of this layer logged during training (e.g. lambda), from the forward's own
    projections; `weights_BT` marks the real tokens."""
    del p, weights_BT
    return {}

  def project(self, x_BTD: Array, positions_BT: Array) -> Projected:
    raise NotImplementedError

  def output(self, o_BTNH: Array, p: Projected) -> Array:
    raise NotImplementedError

  def __call__(self, x_BTD: Array, positions_BT: Array, segment_ids_BT: Array | None = None,
               *, return_maps: bool = False, metric_weights_BT: Array | None = None):
    """The output [B, T, D]; with return_maps also the analysis maps, with metric_weights_BT
    also this layer's `metrics` (the one forward computes both)."""
    p = self.project(x_BTD, positions_BT)
    if return_maps:
      o_BTNH, maps = reference.attention_maps(p.q1, p.k1, p.v, p.q2, p.k2, p.lam,
                                              segment_ids=segment_ids_BT,
                                              logit_bits=self.logit_bits)
      return self.output(o_BTNH, p), maps
    o_BTNH = self._attend(p.q1, p.k1, p.v, p.q2, p.k2, p.lam, segment_ids=segment_ids_BT)
    out_BTD = self.output(o_BTNH, p)
    if metric_weights_BT is not None:
      return out_BTD, self.metrics(p, metric_weights_BT)
    return out_BTD

  def decode(self, x_BTD: Array, positions_BT: Array, cache_k: Array, cache_v: Array,
             layer: Array, start_B: Array, mask_BTS: Array | None
             ) -> tuple[Array, Array, Array]:
    """Writes this step's keys/values into the stacked caches (all layers, model/cache.py) at
    (layer, start_B) and attends over this layer's; with mask_BTS None (a prefill into an empty
    cache) the new tokens attend causally among themselves through the model's kernel.

    Returns (output, cache_k, cache_v). Keys are cached after RoPE; separate K1/K2 (DIFF V1,
    Shared DIFF) are stacked along the head axis, so the cache is [K1; K2] with h_kv values.
    """
    p = self.project(x_BTD, positions_BT)
    keys = p.k1 if p.k2 is None else jnp.concatenate([p.k1, p.k2], axis=2)
    cache_k = kv_cache.write(cache_k, layer, keys, start_B)
    cache_v = kv_cache.write(cache_v, layer, p.v, start_B)
    if mask_BTS is None:
      o_BTNH = self._attend(p.q1, p.k1, p.v, p.q2, p.k2, p.lam)
    else:
      layer_k, layer_v = kv_cache.layer_view(cache_k, layer), kv_cache.layer_view(cache_v, layer)
      k1, k2 = (layer_k, None) if p.k2 is None else jnp.split(layer_k, 2, axis=2)
      o_BTNH = self._attend(p.q1, k1, layer_v, p.q2, k2, p.lam, mask=mask_BTS)
    return self.output(o_BTNH, p), cache_k, cache_v

  def _attend(self, q1, k1, v, q2, k2, lam, **kw) -> Array:
    if self.logit_bits is not None:
      return reference.attention(q1, k1, v, q2, k2, lam, logit_bits=self.logit_bits, **kw)
    return kernels.attention(q1, k1, v, q2, k2, lam, implementation=self.kernel,
                             max_segments=self.spec.max_segments, **kw)

  # Helpers for the variants.
  def _dense(self, d_in: int, d_out: int, names, rngs, **kw) -> nnx.Linear:
    return dense(d_in, d_out, names, dtype=self.spec.compute_dtype, rngs=rngs,
                 std=kw.pop("std", self.spec.init_std), **kw)

  def _heads(self, x_BTF: Array, heads: int) -> Array:
    return x_BTF.reshape(*x_BTF.shape[:2], heads, x_BTF.shape[-1] // heads)

  def _rope(self, x_BTNH: Array, positions_BT: Array) -> Array:
    return rope(x_BTNH, positions_BT, self.spec.rope_theta, self.spec.rope_pairs)

  def _norm_out_scale(self, rule) -> Array:
    """The attention branch's multiplier before W_O: the variant's `rule`, or
    model.norm_out_scale's fixed number."""
    fixed = self.spec.options.fixed_norm_out_scale
    return rule if fixed is None else jnp.asarray(fixed, jnp.float32)

  def _scaled(self, o_BTNH: Array, rule=None) -> Array:
    """o times the branch's multiplier, in the compute dtype: the variant's `rule` (None: no
    multiplier of its own, as for heads without a norm) or model.norm_out_scale's number."""
    if rule is None and self.spec.options.fixed_norm_out_scale is None:
      return o_BTNH
    scale = self._norm_out_scale(1.0 if rule is None else rule)
    return (o_BTNH * scale).astype(self.spec.compute_dtype)

  def _merge(self, o_BTNH: Array) -> Array:
    return o_BTNH.reshape(*o_BTNH.shape[:2], math.prod(o_BTNH.shape[2:]))
