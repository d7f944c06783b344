"""Parameter accounting on an abstract model (no parameter memory): per-module table and totals.

`paper_params` counts the way the papers do: non-embedding parameters plus ONE vocab x d_model
matrix, whether or not the LM head is tied.
"""
from __future__ import annotations

import collections
import copy
import functools
import math

import jax
import ml_collections
from flax import nnx

from diff_transformer.model import build_model
from diff_transformer.model.attention import section, spec_from_config, variant_class
from diff_transformer.model.spec import ModelSpec

EMBEDDING_MODULES = ("embed", "lm_head")


def abstract_model(spec: ModelSpec):
  """The model with ShapeDtypeStructs instead of arrays: seconds even for 13.1B presets."""
  return nnx.eval_shape(lambda: build_model(spec, nnx.Rngs(0)))


def param_shapes(model) -> dict[str, tuple[int, ...]]:
  state = nnx.state(model, nnx.Param)
  return {".".join(str(k) for k in names): tuple(v.shape)
          for path, v in jax.tree_util.tree_flatten_with_path(
              state, is_leaf=lambda x: hasattr(x, "shape"))[0]
          for names in [[getattr(p, "key", getattr(p, "name", p)) for p in path]]}


def count(spec: ModelSpec) -> dict:
  """{'params', 'non_embedding_params', 'embedding_params', 'paper_params', 'modules'}."""
  return copy.deepcopy(_count(spec))


@functools.lru_cache(maxsize=256)
def _count(spec: ModelSpec) -> dict:
  # A study resolves every point's config (each parameter-matched) on every run and report: one
  # abstract model per distinct spec, not per point.
  modules: dict[str, int] = collections.defaultdict(int)
  for name, shape in param_shapes(abstract_model(spec)).items():
    parts = name.split(".")
    key = ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]
    modules[key] += math.prod(shape)
  total = sum(modules.values())
  embedding = sum(n for k, n in modules.items() if k in EMBEDDING_MODULES)
  non_embedding = total - embedding
  return dict(params=total, non_embedding_params=non_embedding, embedding_params=embedding,
              paper_params=non_embedding + spec.vocab_size * spec.d_model, modules=dict(modules))


def format_table(counts: dict, num_layers: int) -> str:
  rows = [f"{'module':<34}{'params':>16}{'share':>8}"]
  total = counts["params"]
  for name, n in counts["modules"].items():
    label = f"{name} (all {num_layers} layers)" if name.startswith("blocks.") else name
    rows.append(f"{label:<34}{n:>16,}{100 * n / total:>7.1f}%")
  for key in ("params", "non_embedding_params", "paper_params"):
    rows.append(f"{key:<34}{counts[key]:>16,}")
  return "\n".join(rows)


def heads_for(variant: str, d_model: int, head_dim: int) -> int:
  """The papers' head rule at equal D and head width d, as the variant states it
  (`Attention.heads_for`): DIFF V1 / Shared DIFF have h = D / 2d differential heads; the
  parameter-matched Transformer 2h = D / d heads; DIFF V2 h = D / d output heads (2h query)."""
  return variant_class(variant).heads_for(d_model, head_dim)


def match_ffn(config: ml_collections.ConfigDict, target_params: int
              ) -> ml_collections.ConfigDict:
  """A copy of `config` whose SwiGLU width brings its total parameter count closest to
  `target_params` (within one FFN column per layer): how variants are parameter-matched to the
  Transformer in the benchmarks, sweeps and studies."""
  config = copy.deepcopy(config)
  m = config.model
  have = count(spec_from_config(m))["params"]
  per_column = 3 * m.d_model * m.num_layers  # gate, up and down of one FFN column
  m.ffn_dim = max(1, m.ffn_dim + round((target_params - have) / per_column))
  return config


def set_rank(model: ml_collections.ConfigDict, rank: int) -> None:
  """The low-rank width of the model section's variant where it has one (Shared DIFF's
  model.shared_diff.rank); other variants have none and are left as they are."""
  own = model.get(section(model.variant))
  if own is not None and "rank" in own:
    own.rank = rank


def matched_variant(config: ml_collections.ConfigDict, variant: str,
                    rank: int = 0) -> ml_collections.ConfigDict:
  """`config` (any variant) turned into `variant` at the same D, depth, head width and
  vocabulary, with heads by `heads_for` and parameters matched to the Transformer's."""
  base = copy.deepcopy(config)
  m = base.model
  m.variant, m.num_heads = "transformer", heads_for("transformer", m.d_model, m.head_dim)
  target = count(spec_from_config(m))["params"]
  out = copy.deepcopy(base)
  out.model.variant = variant
  out.model.num_heads = heads_for(variant, m.d_model, m.head_dim)
  set_rank(out.model, rank)
  return out if variant == "transformer" else match_ffn(out, target)
