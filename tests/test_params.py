"""Parameter counts of every preset against closed forms written from the papers' formulas
(README 'The variants')."""
import dataclasses

import pytest

from configs import scaling
from diff_transformer import params
from diff_transformer.model.spec import ModelSpec
from diff_transformer.model.attention import spec_from_config, variant_class
from tests.helpers.variant_table import VARIANTS, entry


def closed_form(s: ModelSpec) -> int:
  D, L, V, F = s.d_model, s.num_layers, s.vocab_size, s.ffn_dim
  per_layer = entry(s.variant).attention_params(s) + 3 * D * F + 2 * D
  return L * per_layer + D + V * D * (1 if s.tie_embeddings else 2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_matches_closed_form(variant):  # GQA, tiny: the registry, not the presets
  s = entry(variant).tiny
  assert params.count(s)["params"] == closed_form(s)


def spec(name):
  return spec_from_config(scaling.get_config(name).model)


@pytest.fixture(scope="module")
def counts():
  return {n: params.count(spec(n)) for n in scaling.preset_names()}


def test_every_preset_matches_closed_form(counts):
  for name, c in counts.items():
    assert c["params"] == closed_form(spec(name)), name
    s = spec(name)
    assert c["paper_params"] == c["non_embedding_params"] + s.vocab_size * s.d_model


def test_diff_and_transformer_are_parameter_matched(counts):
  for size in scaling.DIFF_ROWS:
    a, b = counts[f"diff-{size}"]["params"], counts[f"transformer-{size}"]["params"]
    assert abs(a - b) / b < 1e-3, size


@pytest.mark.parametrize("size", list(scaling.NOMINAL))
def test_paper_params_within_3_percent_of_nominal(counts, size):
  for variant in ("diff", "transformer"):
    assert abs(counts[f"{variant}-{size}"]["paper_params"] / scaling.NOMINAL[size] - 1) < 0.03


def test_shared_diff_has_fewer_parameters(counts):
  # Same-named rows: Table 3 keeps 830M and 1.4B at DIFF's width and depth (and 3B is narrower).
  for size in ("830m", "1.4b", "3b"):
    assert counts[f"shared_diff-{size}"]["params"] < counts[f"diff-{size}"]["params"], size
  # At equal D, L, h, d (every Table 3 row), sharing the base Q/K always saves parameters.
  for size in scaling.SHARED_ROWS:
    s = spec(f"shared_diff-{size}")
    same_shape_diff = dataclasses.replace(s, variant="diff",
                                          options=variant_class("diff").Options())
    assert closed_form(s) < closed_form(same_shape_diff), size


def test_dry_run_last_line_is_json(capsys):
  import json
  import train
  summary = train.dry_run(scaling.get_config("diff-13.1b"))
  last = capsys.readouterr().out.strip().splitlines()[-1]
  assert json.loads(last) == summary
  assert summary["variant"] == "diff" and abs(summary["paper_params"] / 13.1e9 - 1) < 0.03
