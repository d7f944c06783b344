"""The confirmatory 4-layer study (configs/studies/lm_confirm4.py) against its committed records:
the design as it was named before its runs, every record at the setting its point trains with,
every compared run at its cell's choice, and the pre-named pair over all 16 seeds once they are
recorded. The study runs in parts; what is not recorded yet is waiting, never a stand-in."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from diff_transformer import cli
from diff_transformer.model.attention import nested
from diff_transformer.study import preamble, runner
from diff_transformer.study.runner import REPORT_ONLY, REUSABLE, WAITING

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "results" / "study_lm_confirm4"
PAIR = ("diff@L4@tuned", "transformer@L4@tuned")
SEEDS = tuple(range(10, 26))


def _study(name: str):
  return cli.load_definition(str(ROOT / "configs" / "studies" / f"{name}.py"), "study",
                             "STUDY").validate()


@pytest.fixture(scope="module")
def confirm4(tmp_path_factory):
  """(study, status per point, lr grid) read from a copy of the committed records, nothing
  trained."""
  study = _study("lm_confirm4")
  results = tmp_path_factory.mktemp("confirm4") / "results"
  shutil.copytree(COMMITTED, results)
  status, grid = runner.run(study, "", results.parent / "root", results, train=False)
  return study, status, grid, results


def test_the_design_is_the_one_named_before_its_runs():
  study, tuned = _study("lm_confirm4"), _study("lm_tuned")
  assert study.comparisons == (PAIR,) and study.primary == "loss"
  assert study.seeds == SEEDS
  assert not set(SEEDS) & set(study.lr_grid_seeds)  # no compared seed chose a setting
  assert not set(SEEDS) & set(tuned.seeds)  # the runs that raised the question are not counted
  assert study.lr_grid_seeds == (1000, 1001, 1002, 1003)
  assert {t.name: t.values for t in study.tuned} == {
      "transformer@L4@tuned": ("0.0625", "0.125", "0.25"), "diff@L4@tuned": ("0.05", "0.1", "0.2")}
  assert tuple(study.lr_grid) == (5.29e-4, 7.93e-4, 1.19e-3, 1.78e-3)


def test_every_committed_record_is_one_the_study_would_write(confirm4):
  """Each record in the results is read as recorded (its setting is exactly its point's); a point
  without one waits for its grid, is left to train, or is one whose very setting a record of the
  tuned study holds (taken when the study next runs), and says so."""
  study, status, grid, results = confirm4
  on_disk = {p.stem for p in (COMMITTED / "records").rglob("*.json")}
  assert on_disk and on_disk <= {p for p, why in status.items() if why == "recorded"}
  assert set(status.values()) <= {"recorded", WAITING, REPORT_ONLY, REUSABLE}, set(status.values())


def test_every_compared_run_is_at_its_cells_choice(confirm4):
  """A compared record's lr and output scale are its tuned cell's choice on the grid seeds."""
  study, status, grid, results = confirm4
  for variant in PAIR:
    for seed in SEEDS:
      point = f"{variant}-s{seed}"
      path = results / "records" / f"{point}.json"
      if status[point] != "recorded":
        assert not path.exists()
        continue
      record, chosen = json.loads(path.read_text()), grid["tuned"][variant]
      assert record["lr"] == chosen["lr"]
      own = nested(record["setting"])  # records of older code name the options flat
      assert own[f"model.{own['model.variant']}.norm_out_scale"] == float(chosen["value"])


def test_the_pair_counts_every_seed_once_all_are_recorded(confirm4):
  """The report's pair is over exactly the recorded seeds (16 once the study is done), and a
  choice at an end of its grid is flagged in the report's first lines."""
  study, status, grid, results = confirm4
  if not grid.get("tuned") or any(status[f"{v}-s{s}"] != "recorded" for v in PAIR for s in SEEDS):
    pytest.skip("the confirmatory study is still training (records/ holds part of its grid)")
  result = json.loads((COMMITTED / "study.json").read_text())
  assert result["paired"][f"{PAIR[0]} vs {PAIR[1]}"]["loss"]["n"] == len(SEEDS)
  ends = [v for v, t in grid["tuned"].items() if t.get("at_end")]
  limits = " ".join(preamble.limits(result))
  assert all(v in limits for v in ends)


def test_the_status_line_counts_the_committed_records():
  """docs/results/README.md says how far the study is: its counts are the records'."""
  text = " ".join((ROOT / "docs" / "results" / "README.md").read_text().split())
  found = re.search(r"Status: (\d+) grid records committed \((\d+) of them the tuned study's, "
                    r"reused\), (\d+) of 32 compared runs", text)
  assert found, "the confirmatory study's status line is missing"
  grid = [json.loads(p.read_text()) for p in (COMMITTED / "records" / "lr_grid").glob("*.json")]
  compared = list((COMMITTED / "records").glob("*.json"))
  assert [int(g) for g in found.groups()] == [
      len(grid), sum("reused_from" in r for r in grid), len(compared)]
