"""ModelSpec: the model's hyper-parameters as a frozen (hashable, static) dataclass.

The keys every variant has are its fields; a variant's own keys are its `Options`
(model/attention/), carried as `spec.options`. The config's `model` section is built from both
(model/attention/__init__.py `model_section`), and `spec_from_config` there reads it back.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import jax.numpy as jnp

from diff_transformer.kernels.cudnn import MAX_SEGMENTS

if TYPE_CHECKING:
  from _typeshed import DataclassInstance


# A variant's own options (its class's `Options`): ModelSpec[DiffOptions] types spec.options, so
# a misspelled knob (spec.options.lambda_inti) is a type error.
OptionsT = TypeVar("OptionsT", bound="DataclassInstance")


@dataclasses.dataclass(frozen=True)
class ModelSpec(Generic[OptionsT]):
  variant: str = "diff"  # a name registered in model/attention/__init__.py
  vocab_size: int = 8192
  # > 0: a run sets vocab_size to its tokenizer's ids rounded up to this multiple (the paper
  # presets: 128); the padded rows are recorded (tokenizer_record.json) and never in the data.
  vocab_multiple: int = 0
  d_model: int = 256
  num_layers: int = 4
  # Output heads. transformer: attention heads; diff/shared_diff: differential heads h (each has
  # two d-wide query sub-heads and a 2d-wide value); diff_v2: output heads h (2h query heads).
  num_heads: int = 4
  num_kv_heads: int | None = None  # None = num_heads (MHA)
  head_dim: int = 32
  ffn_dim: int = 704
  rope_theta: float = 10_000.0
  rope_pairs: str = "interleaved"  # interleaved (2i, 2i+1) as the official code; or "half"
  tie_embeddings: bool = False
  max_seq_len: int = 256
  kernel: str = "auto"  # kernels/auto.py: the exact path per platform and shapes
  # The documents (segment runs) a packed row may hold in cuDNN's packed layout: its batch and
  # softmax statistics grow with this cap; a batch with a row over it takes the padded layout
  # (kernels/cudnn.py). Other kernels ignore it.
  max_segments: int = MAX_SEGMENTS
  dtype: str = "float32"  # compute dtype; parameters, softmax and norm statistics stay float32
  remat: str = "none"
  # How the blocks run (a forward and KV-cache decoding): "scan" (one compiled block looped
  # over the stacked layers: compiles once, whatever the depth), "unroll" (each layer its own
  # code: on CPU a scanned train step took 1.13-1.25x an unrolled one at 2-4 layers,
  # benchmarks/results/layer_loop_cpu.json) or "auto" (unroll on CPU, scan elsewhere). The
  # parameters are stacked either way.
  layer_loop: str = "auto"
  init_std: float = 0.02
  # Short causal depthwise convolution of this width on every block's attention input
  # (x + conv(x), before the variant's projections; the Zoology/Based associative-recall
  # recipe). 0 = off. Same for every variant, so comparisons stay fair.
  short_conv: int = 0
  # The variant's own model.* keys: an instance of its class's `Options` (model/attention/),
  # filled in by `spec_from_config` / `make_spec` there.
  options: OptionsT = None  # type: ignore[assignment]  # required: __post_init__ says so

  def __post_init__(self):
    if self.options is None:  # a variant's module reads spec.options
      raise TypeError("ModelSpec: options missing; build specs with make_spec or "
                      "spec_from_config (model/attention/__init__.py)")

  @classmethod
  def common_fields(cls) -> tuple[dataclasses.Field, ...]:
    """The model.* keys every variant has (the variants' own are their Options)."""
    return tuple(f for f in dataclasses.fields(cls) if f.name != "options")

  def replace(self, **values: Any) -> "ModelSpec[OptionsT]":
    """This spec with some model.* values changed, its variant's own options among them (a new
    variant needs its own options: build it with make_spec)."""
    if "variant" in values:
      raise ValueError("ModelSpec.replace: a new variant needs its own options; use make_spec")
    own = {f.name for f in dataclasses.fields(self.options)}
    options = {k: values.pop(k) for k in list(values) if k in own}
    return dataclasses.replace(self, options=dataclasses.replace(self.options, **options),
                               **values)

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)
