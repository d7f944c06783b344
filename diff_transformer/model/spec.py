"""ModelSpec: the model's hyper-parameters as a frozen (hashable, static) dataclass.

The single schema of the model: the config's `model` section is built from these fields and
defaults (`ModelSpec.config_section`), and `from_config` rejects a key that is not a field.
"""
from __future__ import annotations

import dataclasses
import typing

import jax.numpy as jnp
import ml_collections

from diff_transformer.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ModelSpec:
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
  dtype: str = "float32"  # compute dtype; parameters, softmax and norm statistics stay float32
  remat: str = "none"
  init_std: float = 0.02
  # Transformer: per-head RMSNorm of each head's output with one (d,) gain shared by the heads,
  # the Transformer's analog of DIFF's sub-layer norm (DIFF paper Table 6, "+ GroupNorm").
  head_norm: bool = False
  # DIFF V1 / Shared DIFF ablations (DIFF paper Table 6).
  subln: bool = True  # per-head RMSNorm with one (2d,) gain, then * (1 - lambda_init)
  lambda_init: float | None = None  # None = 0.8 - 0.6 exp(-0.3 l), l counted from 0
  lambda_std: float = 0.1
  # The multiplier after a per-head norm (DIFF's sub-layer norm, the Transformer's head_norm):
  # "rule": the variant's, (1 - lambda_init) for DIFF V1 / Shared DIFF and 1 for head_norm;
  # "layer_rule" (DIFF V1 / Shared DIFF): 1 - (0.8 - 0.6 exp(-0.3 l)) even where lambda_init is
  # a constant; or a positive number, fixed in every layer, written as text ("0.2").
  norm_out_scale: str = "rule"
  # Shared DIFF.
  rank: int = 0
  # matched: W + U V^T at DIFF V1's init scale (default, by ablation); fan_in: both factors
  # fan-in scaled (logits ~50x larger at init); lora: V^T zero (Q1 = Q2, K1 = K2)
  lowrank_init: str = "matched"
  # DIFF V2 ablations.
  v2_pairing: str = "interleaved"  # interleaved (even/odd, shares K/V) or halves (crosses groups)
  v2_lambda: str = "sigmoid"  # sigmoid, none (o1 - o2), linear (lambda without sigmoid)
  # Short causal depthwise convolution of this width on every block's attention input
  # (x + conv(x), before the variant's projections; the Zoology/Based associative-recall
  # recipe). 0 = off. Same for every variant, so comparisons stay fair.
  short_conv: int = 0

  @classmethod
  def config_section(cls) -> ml_collections.ConfigDict:
    """The config's `model` section: every field with its default (optional fields typed)."""
    c = ml_collections.ConfigDict()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
      if f.default is None:  # ml_collections needs the type to accept a later value
        kind = next(a for a in typing.get_args(hints[f.name]) if a is not type(None))
        c[f.name] = ml_collections.FieldReference(None, field_type=kind)
      else:
        c[f.name] = f.default
    return c

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict) -> "ModelSpec":
    values = model.to_dict()
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in values:
      if key not in fields:
        raise ConfigError(f"model.{key}: unknown key; known keys here: {', '.join(sorted(fields))}")
    return cls(**values)

  @property
  def fixed_norm_out_scale(self) -> float | None:
    """model.norm_out_scale as a number, or None where it names a rule."""
    try:
      return float(self.norm_out_scale)
    except ValueError:
      return None

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)
