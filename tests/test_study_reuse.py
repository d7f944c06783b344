"""A study's points stand on other studies' records (Study.reuse_from) only where a record was
trained under exactly the point's setting: checked on the committed output-scale study's records,
which the tuned study's DIFF V1 grid cells and a cell at its chosen (scale, lr) share."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from configs.studies import lm_scale, lm_tuned
from diff_transformer.errors import ConfigError
from diff_transformer.runs.record import differences
from diff_transformer.study import preamble, records, runner
from diff_transformer.study.named import Cell
from diff_transformer.study.points import COMPARED, GRID

ROOT = Path(__file__).resolve().parents[1]
SCALE_STUDY = ROOT / "docs" / "results" / "study_lm_scale"


def test_a_grid_point_takes_the_record_of_exactly_its_setting_under_any_name(tmp_path):
  study = dataclasses.replace(lm_tuned.STUDY, reuse_from=(str(SCALE_STUDY),))
  results = tmp_path / "results"
  # DIFF V1 at 0.2 is named alike in both studies; at the rule it is the other study's `diff`
  named = {"diff@scale0.2-lr0.00178-s1000": "diff@scale0.2-lr0.00178-s1000",
           "diff@scalerule-lr0.00267-s1001": "diff-lr0.00267-s1001"}
  # a report-only invocation names them reusable (not left to train) and writes nothing
  status = runner._run_points(study, GRID, "", tmp_path / "root", results, list(named), jobs=1,
                              train=False, retrain=False, population=1)
  assert status == dict.fromkeys(named, runner.REUSABLE) and not results.exists()
  status = runner._run_points(study, GRID, "", tmp_path / "root", results, list(named), jobs=1,
                              train=True, retrain=False, population=1)
  assert status == {p: f"reused (study_lm_scale/{source})" for p, source in named.items()}
  assert not (tmp_path / "root").exists()  # nothing trained
  for point, source in named.items():
    mine = GRID.read(study, results, point, runner.point_setting(study, point))
    theirs = json.loads((SCALE_STUDY / "records" / "lr_grid" / f"{source}.json").read_text())
    assert mine["point"] == point and mine["reused_from"] == f"study_lm_scale/{source}"
    assert {k: v for k, v in mine.items() if k not in ("point", "reused_from", "setting")} == {
        k: v for k, v in theirs.items() if k not in ("point", "setting")}
    assert not differences(mine["setting"], theirs["setting"])  # keys added since at defaults
  # no record of 0.1, nor of the 4x32 Transformer: those points would train
  pool = records.pool(study.reuse_from, grid=True)
  for point in ("diff@scale0.1-lr0.00178-s1000", "transformer@scalerule-lr0.00267-s1000"):
    assert records.same_setting(pool, runner.point_setting(study, point),
                                lambda r: GRID.accepts(study, r)) is None


def test_a_compared_point_takes_a_record_under_its_own_cell_name_and_the_report_says_so(
    tmp_path):
  """A new cell, DIFF V1 at 0.2 trained at lr 1.78e-3, is the other study's diff@scale0.2; at
  another lr, or on a seed that study never ran, it is not."""
  cell = Cell("diff@chosen", "diff", (("model.norm_out_scale", "0.2"),), own_lr=True)
  study = dataclasses.replace(lm_scale.STUDY, derived=lm_scale.STUDY.derived + (cell,),
                              variants=("diff@chosen",), comparisons=(), factorial=(),
                              reuse_from=(str(SCALE_STUDY),))
  points = ["diff@chosen-s3", "diff@chosen-s4"]
  lrs: dict[str, float | None] = {p: 1.78e-3 for p in points}
  status = runner._run_points(study, COMPARED, "", tmp_path / "root", tmp_path, points[:1],
                              jobs=1, train=True, retrain=False, population=1, lrs=lrs)
  assert status == {"diff@chosen-s3": "reused (study_lm_scale/diff@scale0.2-s3)"}
  record = json.loads(records.path(tmp_path, "diff@chosen-s3").read_text())
  assert record["variant"] == "diff@chosen" and record["seed"] == 3
  pool = records.pool(study.reuse_from, grid=False)
  for point, lr in (("diff@chosen-s4", 2.67e-3), ("diff@chosen-s99", 1.78e-3)):
    assert records.same_setting(pool, runner.point_setting(study, point, lr),
                                lambda r: True) is None
  result = dict(runs=[{k: v for k, v in record.items() if k != "setting"}], lr_grid={})
  assert preamble._reused(result) == [
      "Reused: 1 compared run and 0 grid runs are records of study_lm_scale, each taken because "
      "it was trained under exactly this point's setting (`reused_from` in the record)."]


def test_a_reuse_folder_without_records_is_refused_before_anything_runs(tmp_path):
  with pytest.raises(ConfigError, match=r"reuse_from \['.*nowhere'\]: no records/ folder"):
    dataclasses.replace(lm_tuned.STUDY, reuse_from=(str(tmp_path / "nowhere"),)).validate()
