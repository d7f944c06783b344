"""The per-variant table of the tests: a tiny spec, a float64 oracle and closed forms per variant.

Every variant-parametrised test iterates the registry (`VARIANTS`) and looks its variant up here
with `entry(variant)`; a registered variant without an entry fails those tests with
"add variant X to tests/helpers/variant_table.py TABLE" instead of taking another variant's branch.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest

from tests.helpers import np_reference as ref
from diff_transformer.model.attention import PAPER_VARIANTS, variant_names
from diff_transformer.model.attention import make_spec
from diff_transformer.model.spec import ModelSpec

BASE = dict(vocab_size=97, d_model=32, num_layers=2, ffn_dim=64, max_seq_len=64)
Mesh = tuple[int, int, int]


@dataclasses.dataclass(frozen=True)
class Entry:
  tiny: ModelSpec  # a small GQA spec (model, decoding and kernel tests)
  numerics: tuple[int, int]  # (num_heads, head_dim) at d_model 64 for the float64 comparison
  # float64 output of the attention sub-layer from its weights (tests/helpers/np_reference.py)
  oracle: Callable[[ModelSpec, dict, np.ndarray, np.ndarray | None, int], np.ndarray]
  attention_params: Callable[[ModelSpec], int]  # one layer's attention, closed form
  # per layer and token: ((key heads, key width), (value heads, value width)) in the KV cache
  cache: Callable[[ModelSpec], tuple[tuple[int, int], tuple[int, int]]]
  learning_heads: tuple[int, int]  # (num_heads, num_kv_heads) at d_model 64, head_dim 16
  # (data, fsdp, tensor) meshes where tests/test_training_sharding.py compiles and compares the
  # sharded step, and the one where it initialises the state sharded in place
  equality_meshes: tuple[Mesh, ...]
  init_mesh: Mesh
  # the parameters AdamW leaves undecayed with decay_norms/lambda/embeddings off, beyond the
  # embedding and the norm gains every variant has (tests/test_training_units.py)
  undecayed: frozenset[str]
  # Float32 against float64: the sub-layer RMSNorm divides each head by the RMS of
  # A1 V - lambda A2 V, small where the two terms nearly cancel, so rounding is amplified by up
  # to ~35x there (measured: max 3.2e-5 over 80 random draws, median 9e-7); a semantic slip
  # (pairing, scale, lambda, mask) moves the output by orders of magnitude more.
  tolerance: float = 1e-5
  # whether its train rows log lambda per layer (lambda/l0 ..., lambda/mean; Attention.metrics)
  logs_lambda: bool = True
  # its own model.* options in the learning test (tests/test_training_learning.py)
  learning_options: tuple[tuple[str, object], ...] = ()


def _out_scale(s: ModelSpec):
  """The oracle's out_scale: None for the rule, else the number or the rule's name."""
  if s.options.norm_out_scale == "rule":
    return None
  return s.options.fixed_norm_out_scale or s.options.norm_out_scale


def _diff_v1(shared: bool):
  def oracle(s, w, x, seg, layer):
    return ref.diff_v1(x, w, h=s.num_heads, K=s.kv_heads, d=s.head_dim, layer=layer, seg=seg,
                       subln=s.options.subln, shared=shared, lam_init=s.options.lambda_init,
                       out_scale=_out_scale(s))
  return oracle


def _diff_params(s: ModelSpec) -> int:
  D, h, K, d = s.d_model, s.num_heads, s.kv_heads, s.head_dim
  return D * 2 * h * d + D * 2 * K * d + D * K * 2 * d + 2 * h * d * D + 4 * d + 2 * d


def _shared_params(s: ModelSpec) -> int:
  D, h, K, d, r = s.d_model, s.num_heads, s.kv_heads, s.head_dim, s.options.rank
  return (D * h * d + D * K * d + 2 * (D * r + r * h * d) + 2 * (D * r + r * K * d)
          + D * K * 2 * d + 2 * h * d * D + 4 * d + 2 * d)


def _two_keys_wide_value(s: ModelSpec):
  return (2 * s.kv_heads, s.head_dim), (s.kv_heads, 2 * s.head_dim)


def _one_key_one_value(s: ModelSpec):
  return (s.kv_heads, s.head_dim), (s.kv_heads, s.head_dim)


DIFF_UNDECAYED = frozenset({"blocks/attn/lambda_q1", "blocks/attn/lambda_k1",
                            "blocks/attn/lambda_q2", "blocks/attn/lambda_k2",
                            "blocks/attn/subln_scale"})

TABLE: dict[str, Entry] = {
    "transformer": Entry(
        tiny=make_spec(variant="transformer", num_heads=4, num_kv_heads=2, head_dim=8, **BASE),
        numerics=(8, 8),
        oracle=lambda s, w, x, seg, layer: ref.transformer(x, w, N=s.num_heads, K=s.kv_heads,
                                                           d=s.head_dim, seg=seg,
                                                           head_norm=s.options.head_norm,
                                                           out_scale=_out_scale(s)),
        attention_params=lambda s: (2 * s.d_model * s.num_heads * s.head_dim
                                    + 2 * s.d_model * s.kv_heads * s.head_dim),
        cache=_one_key_one_value, learning_heads=(4, 2),
        equality_meshes=((8, 1, 1), (2, 2, 2)), init_mesh=(8, 1, 1), undecayed=frozenset(),
        logs_lambda=False),
    "diff": Entry(
        tiny=make_spec(variant="diff", num_heads=2, num_kv_heads=1, head_dim=8, **BASE),
        numerics=(4, 8), oracle=_diff_v1(shared=False), attention_params=_diff_params,
        cache=_two_keys_wide_value, learning_heads=(2, 1),
        equality_meshes=((8, 1, 1), (2, 2, 2)), init_mesh=(2, 2, 2), undecayed=DIFF_UNDECAYED,
        tolerance=1e-4),
    "shared_diff": Entry(
        tiny=make_spec(variant="shared_diff", num_heads=2, num_kv_heads=1, head_dim=8, rank=4,
                       **BASE),
        numerics=(4, 8), oracle=_diff_v1(shared=True), attention_params=_shared_params,
        cache=_two_keys_wide_value, learning_heads=(2, 1),
        equality_meshes=((2, 2, 2), (1, 4, 2)), init_mesh=(1, 4, 2), undecayed=DIFF_UNDECAYED,
        tolerance=1e-4, learning_options=(("rank", 8),)),
    "diff_v2": Entry(
        tiny=make_spec(variant="diff_v2", num_heads=4, num_kv_heads=2, head_dim=8, **BASE),
        numerics=(4, 16),
        oracle=lambda s, w, x, seg, layer: ref.diff_v2(x, w, h=s.num_heads, K=s.kv_heads,
                                                       d=s.head_dim, seg=seg,
                                                       pairing=s.options.v2_pairing,
                                                       lam_mode=s.options.v2_lambda,
                                                       out_scale=_out_scale(s)),
        attention_params=lambda s: (s.d_model * 2 * s.num_heads * s.head_dim
                                    + 2 * s.d_model * s.kv_heads * s.head_dim
                                    + s.num_heads * s.head_dim * s.d_model
                                    + s.d_model * s.num_heads),
        cache=_one_key_one_value, learning_heads=(4, 2),
        equality_meshes=((2, 2, 2), (1, 4, 2)), init_mesh=(2, 2, 2),
        undecayed=frozenset({"blocks/attn/wlambda/kernel"})),
}

# The registry at collection time: a variant added to the package appears in every
# parametrised test below and fails there until it has its entry.
VARIANTS: tuple[str, ...] = variant_names()
assert set(PAPER_VARIANTS) <= set(VARIANTS)


def entry(variant: str) -> Entry:
  if variant not in TABLE:
    pytest.fail(f"add variant {variant} to tests/helpers/variant_table.py TABLE (a tiny spec, a "
                "float64 oracle, the closed-form attention parameter count, KV-cache layout and "
                "undecayed parameters)",
                pytrace=False)
  return TABLE[variant]


def tiny(variant: str) -> ModelSpec:
  return entry(variant).tiny
