"""Tuned cells (study/tuning.py): a compared cell's setting of one key chosen on the grid seeds by
the grid's own judge, grown by x2 at a winning numeric end, an `around` cell searching its
reference's choice /2, x1, x2, and the decided cell trained and recorded as the chosen candidate.
The grid runs are replaced by records whose loss is a known function of (scale, lr)."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from configs.studies.lm_tuned import STUDY
from diff_transformer.errors import ConfigError
from diff_transformer.study import Tuned, pins, preamble, tuning

# The loss each candidate reaches: best lr 4e-3 for every cell; DIFF best at the smallest named
# scale 0.1 (so the grid grows to 0.05, which is worse), the Transformer at its rule.
SCALE_LOSS = {"diff": {"0.05": 1.62, "0.1": 1.60, "0.2": 1.61, "0.4": 1.63, "rule": 1.70},
              "transformer": {"0.25": 1.70, "0.5": 1.66, "rule": 1.65, "2": 1.67, "1": 1.651}}


def fake_loss(cell: str, lr: float) -> float:
  parent, _, value = cell.rpartition("@scale")
  base = SCALE_LOSS["transformer" if parent.startswith("transformer") else "diff"]
  return base.get(value, 1.9) + 0.01 * math.log(lr / 4e-3) ** 2 + 0.001 * ("@L4" in parent)


def run_fake(study, asked: list):
  def run_points(points):
    asked.extend(points)
    out = {}
    for point in points:
      p = study.parse(point)
      loss = fake_loss(p.variant, p.lr)
      out[point] = dict(loss=loss, final_loss=loss, unigram_entropy=5.0, val_accuracy=None)
    return out
  return run_points


@pytest.fixture(scope="module")
def tuned():
  study = STUDY.validate()
  asked: list[str] = []
  decided, grid = tuning.tune(study, run_fake(study, asked), math.nan)
  return study, decided, grid, asked


def test_the_best_scale_is_chosen_and_a_winning_end_grows(tuned):
  _, decided, grid, asked = tuned
  diff = grid["tuned"]["diff@tuned"]
  assert diff["value"] == "0.1" and diff["lr"] == 4e-3 and diff["grown"] == ["0.05"]
  assert any(p.startswith("diff@scale0.05-lr") for p in asked)  # the grown candidate ran
  assert grid["tuned"]["transformer@tuned"]["value"] == "rule"  # the rule sits at 1: no growth
  assert grid["tuned"]["transformer@tuned"]["grown"] == []
  assert decided.lr_source("diff@tuned") == "diff@scale0.1"
  config = decided.resolved_config("diff@tuned-s0", 4e-3)
  assert config.model.diff.norm_out_scale == "0.1" and config.model.variant == "diff"
  assert pins.tuned_args(decided, "diff@tuned-s0") == ("--config.model.diff.norm_out_scale=0.1",)


def test_an_around_cell_searches_its_references_choice(tuned):
  _, decided, grid, asked = tuned
  assert grid["tuned"]["diff@L4@tuned"]["resolved"] == ["0.05", "0.1", "0.2"]
  assert not any(p.startswith("diff@L4@scale0.4") for p in asked)  # outside /2, x1, x2
  # The Transformer's 2-layer choice is its rule (not a number): its own list, which is /2, x1,
  # x2 around 1.
  assert grid["tuned"]["transformer@L4@tuned"]["resolved"] == ["0.5", "rule", "2"]
  assert decided.resolved_config("diff@L4@tuned-s0", 4e-3).model.num_layers == 4


def test_the_decision_is_rebuilt_from_lr_grid_json(tuned):
  """study.py resolves the study from the written grid (a report from records alone)."""
  study, decided, grid, _ = tuned
  again = tuning.resolve(study, json.loads(json.dumps(grid)))
  assert again.decided_tuned == decided.decided_tuned
  assert [again.lr_source(v) for v in again.variants] == [decided.lr_source(v)
                                                          for v in decided.variants]
  assert again.points() == decided.points()


def test_an_incomplete_grid_decides_nothing():
  study = STUDY.validate()
  done = set(study.grid_points()[:-1])  # one grid run missing
  fake = run_fake(study, [])
  decided, grid = tuning.tune(study, lambda points: {p: r for p, r in fake(points).items()
                                                      if p in done}, math.nan)
  assert "shared_diff@tuned" not in decided.decided_tuned
  assert decided.is_tuned("shared_diff@tuned")
  assert not grid["tuned"]["shared_diff@tuned"]["complete"]


def test_the_report_of_an_unfinished_grid_marks_what_is_provisional(tmp_path):
  """One missing grid run: its candidate's row says provisional, its cell is not decided and
  none of its values is marked chosen."""
  study = STUDY.validate()
  missing = study.grid_points()[-1]
  fake = run_fake(study, [])
  _, grid = tuning.tune(study, lambda points: {p: r for p, r in fake(points).items()
                                               if p != missing}, math.nan)
  lines = preamble.tuned_values(dict(lr_grid=grid), tmp_path)
  cell = study.parse(missing).variant
  assert any(line.startswith("| shared_diff@tuned") and f"| {cell} |" in line
             and "provisional" in line for line in lines)
  assert "- `shared_diff@tuned`: not decided: a candidate's grid is not finished" in lines
  assert not any("**chosen**" in line for line in lines if line.startswith("| shared_diff@tuned"))


def test_a_tuned_cell_must_be_compared_and_its_around_named_first():
  extra = STUDY.tuned + (Tuned("x@tuned", "diff", "model.norm_out_scale", ("0.1",)),)
  with pytest.raises(ConfigError, match="tuned cell 'x@tuned' must be one of the compared"):
    dataclasses.replace(STUDY, tuned=extra).validate(design=False)
  reordered = (STUDY.tuned[4],) + STUDY.tuned[:4]
  with pytest.raises(ConfigError, match="tuned cell 'diff@L4@tuned'"):
    dataclasses.replace(STUDY, tuned=reordered).validate(design=False)


def test_the_report_shows_each_value_at_its_own_best_lr(tuned, tmp_path):
  """The tuned section: every value tried (the grown 0.05 too) with its own lr's grid mean, the
  choice marked, each cell's state, and the scale-loss plot written."""
  _, _, grid, _ = tuned
  lines = preamble.tuned_values(dict(lr_grid=grid), tmp_path)
  rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in lines
          if line.startswith("| diff@tuned") or line.startswith("| transformer@tuned")}
  assert set(rows) >= {("diff@tuned", v) for v in ("0.05", "0.1", "0.2", "0.4", "rule")}
  assert "**chosen**" in rows[("diff@tuned", "0.1")] and "| 1.6000 |" in rows[("diff@tuned", "0.1")]
  assert "| 1.6100 | complete" in rows[("diff@tuned", "0.2")]
  assert "**chosen**" in rows[("transformer@tuned", "rule")]
  assert "- `diff@tuned`: 0.1 at lr 0.004" in lines
  assert (tmp_path / "tuned.png").stat().st_size > 10_000


def test_a_value_still_winning_at_the_grown_end_is_reported_not_bracketed(tmp_path):
  """DIFF keeps improving as its scale shrinks: the grid grows once to 0.05, which wins; the
  choice is final (growth spent) and the report says the value is not bracketed."""
  study = STUDY.validate()
  fake = run_fake(study, [])

  def smaller_is_better(points):
    out = fake(points)
    for point, record in out.items():
      p = study.parse(point)
      value = p.variant.rpartition("@scale")[2]
      if point.startswith("diff@scale") and value != "rule":
        record["loss"] = 1.55 + 0.1 * float(value) + 0.01 * math.log(p.lr / 4e-3) ** 2
    return out

  _, grid = tuning.tune(study, smaller_is_better, math.nan)
  diff = grid["tuned"]["diff@tuned"]
  assert (diff["value"], diff["grown"], diff["at_end"]) == ("0.05", ["0.05"], True)
  assert not grid["tuned"]["transformer@tuned"]["at_end"]  # its rule, at 1, lies inside
  limits = preamble.limits(dict(study={}, lr_grid=grid))
  assert any(line.startswith("**Tuned value not bracketed**: diff@tuned (`model.norm_out_scale`"
                             " 0.05)") for line in limits)
  lines = preamble.tuned_values(dict(lr_grid=grid), tmp_path)
  assert "- `diff@tuned`: 0.05 at lr 0.004 (an end of the values tried: not bracketed)" in lines
  assert "- `transformer@tuned`: rule at lr 0.004" in lines
