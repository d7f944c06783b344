"""study.py end to end on a test-sized study, its statistics against a hand computation, and
one-line errors for bad study files."""
from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diff_transformer import cli
from diff_transformer.errors import UserError, message_lines
from diff_transformer.params import heads_for, set_rank
from diff_transformer.study import (invocations, markdown, paired, run_metrics, runner,
                                    study_json, summarize)
from diff_transformer.study.definition import Study
from diff_transformer.stats import censored_median, holm, min_p, sign_flip_p
from tests.helpers.studies import CELLS_STUDY, TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]


def test_paired_interval_and_exact_p_match_a_hand_computation():
  variant = {0: 0.50, 1: 0.70, 2: 0.65, 3: 0.40}
  base = {0: 0.45, 1: 0.60, 2: 0.66, 3: 0.30, 9: 1.0}  # seed 9 has no partner: left out
  d = [0.05, 0.10, -0.01, 0.10]
  mean = sum(d) / 4
  sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
  half = 3.182446305284263 * sd / 2  # t(0.975, 3) * sd / sqrt(4)
  got = paired(variant, base)
  assert got["n"] == 4
  assert got["mean_diff"] == pytest.approx(mean)
  assert got["ci95_low"] == pytest.approx(mean - half) and got["ci95_high"] == pytest.approx(
      mean + half)
  # Of the 16 sign flips of (0.05, 0.10, -0.01, 0.10), |sum| >= 0.24 only for all-same-sign
  # ones: (+,+,+,+) 0.24 and its mirror; (+,+,-,+) gives 0.26 and its mirror. 4 / 16.
  assert got["p"] == pytest.approx(4 / 16)
  assert math.isnan(paired({0: 1.0}, {0: 0.5})["ci95_low"])
  assert paired({0: 1.0}, {0: 0.5})["p"] == 1.0  # one pair: both signs tie
  assert min_p(5) == 2 / 32 and sign_flip_p([1, 2, 3, 4, 5]) == 2 / 32
  s = summarize([1.0, 2.0, 4.0, float("nan")])
  assert s["n"] == 3 and s["mean"] == pytest.approx(7 / 3)
  assert s["std"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 +
                                              (4 - 7 / 3) ** 2) / 2))


def test_the_sign_flip_p_counts_every_sign_assignment():
  """Against a listing of all 2^n sign assignments, on fresh normal differences and on tied
  small integers; at 40 pairs of +-1 (too many to list) against the binomial count; more pairs
  than that are refused, not left to exhaust memory."""
  rng = np.random.default_rng()

  def listed(d: list[float]) -> float:
    observed = abs(sum(d))
    sums = [abs(sum(s * x for s, x in zip(signs, d)))
            for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(s >= observed - 1e-12 * max(1.0, observed) for s in sums) / 2 ** len(d)

  for n in range(1, 13):
    for d in (rng.normal(size=n), rng.integers(-2, 3, size=n).astype(float)):
      assert sign_flip_p(d) == listed([float(x) for x in d]), d
  d = np.where(rng.random(40) < 0.6, 1.0, -1.0)
  observed = abs(int(d.sum()))
  assert sign_flip_p(d) == sum(math.comb(40, j) for j in range(41)
                               if abs(2 * j - 40) >= observed) / 2 ** 40
  with pytest.raises(ValueError, match="at most 40 pairs, got 41"):
    sign_flip_p(np.ones(41))


def test_holm_matches_a_hand_computation():
  # Sorted 0.01, 0.02, 0.04, 0.30: x4, x3, x2, x1 = 0.04, 0.06, 0.08, 0.30 (running max kept).
  got = holm({"a": 0.04, "b": 0.01, "c": 0.30, "d": 0.02, "e": math.nan})
  assert got["b"] == pytest.approx(0.04) and got["d"] == pytest.approx(0.06)
  assert got["a"] == pytest.approx(0.08) and got["c"] == pytest.approx(0.30)
  assert math.isnan(got["e"])
  assert holm({"x": 0.5, "y": 0.4}) == {"x": 0.8, "y": 0.8}  # capped running max, not 1.0


def test_steps_to_90_keeps_a_run_that_never_reached_it():
  never = [(100, 0.2), (200, 0.6), (300, 0.858)]
  assert run_metrics.first_step(never, 0.9) == (300.0, False)  # censored at the last step
  assert run_metrics.first_step([(100, 0.5), (200, 0.93)], 0.9) == (200.0, True)
  assert run_metrics.still_rising(never, ceiling=1.0)
  assert not run_metrics.still_rising([(100, 0.9), (300, 0.905)], ceiling=1.0)
  runs = [dict(variant="diff_v2", steps_to_90=t, reached_90=r, still_rising=False)
          for t, r in ((150.0, True), (250.0, True), (300.0, False))]
  got = study_json.censoring(runs, "diff_v2")
  assert got["reached_90"] == "2/3" and got["steps_to_90_median"] == 250.0
  runs[1].update(steps_to_90=300.0, reached_90=False)  # most never reached: no median
  assert study_json.censoring(runs, "diff_v2")["steps_to_90_median"] is None
  assert censored_median([300.0, 100.0, 200.0], [True] * 3) == 200.0


def test_a_runs_time_counts_its_attempts_not_the_wait_between_them():
  """Each start logs a `flops` row; a run stopped at 17 and resumed 40 minutes later counts
  its two attempts' own time (a log from before the flops row counts from its first row)."""
  first = [dict(step=0, kind="flops", time=0.0), dict(step=1, kind="train", time=10.0),
           dict(step=17, kind="train", time=100.0)]
  second = [dict(step=17, kind="flops", time=2500.0), dict(step=17, kind="resume", time=2500.1),
            dict(step=1000, kind="val", time=2590.0)]
  assert run_metrics.train_seconds(first + second) == pytest.approx(190.0)
  assert run_metrics.train_seconds(first[1:] + second) == pytest.approx(180.0)
  assert math.isnan(run_metrics.train_seconds([]))


def test_informative_slices_use_the_highest_floor():
  floor = dict(random=0.0625, elimination=0.083, one_key=0.25, one_key_elimination=0.33)
  result = dict(chance={"a": floor, "b": floor},
                summary={"transformer": {"accuracy:a": dict(mean=0.40, std=0.1, n=5),
                                         "accuracy:b": dict(mean=0.60, std=0.1, n=5),
                                         "reached_90": "0/5"}})
  # 0.40 clears random + 0.1 but not the one-key-with-elimination floor + 0.1.
  assert study_json.informative_slices(result) == ["b"]


def study(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / "study.py"), *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        env={"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                             "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                             **{k: v for k, v in os.environ.items()
                                if k.startswith(("JAX_", "XLA_"))}})  # the session's cache, flags


def test_quick_study_runs_end_to_end_and_resumes(tmp_path):
  """The quick form with command-line options: an lr grid, every variant at its best grid lr,
  floors per slice, censoring, exact p and Holm on every paired entry, the command recorded."""
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY)
  root = tmp_path / "root"
  args = [f"--study={file}", "--quick", "--set=data.task.num_keys=6",
          "--variants=transformer,diff_v2", "--seeds=1,2", "--name=tinyq", f"--root={root}"]
  result = study(tmp_path, *args)
  assert result.returncode == 0, result.stderr[-2000:]
  data = json.loads((root / "study.json").read_text())
  assert {"study", "runs", "summary", "paired", "chance", "lr_grid"} <= data.keys()
  assert data["study"]["name"] == "tinyq" and data["study"]["task_params"]["num_keys"] == 6
  for arg in args:  # an absolute root is not written into results that may be committed
    arg = "--root=<root>" if arg.startswith("--root=") else arg
    assert arg in data["study"]["command"] and arg in (root / "report.md").read_text()
  assert len(data["runs"]) == 4 and {r["seed"] for r in data["runs"]} == {1, 2}
  grid = data["lr_grid"]
  assert grid["lrs"] == [1e-3, 3e-3] and set(grid["chosen"]) == {"transformer", "diff_v2"}
  assert set(grid["table"]["diff_v2"]) == {"0.001", "0.003"} and grid["seeds"] == [1000]
  for run in data["runs"]:
    assert {"variant", "seed", "params", "final_loss", "accuracy", "answer_share",
            "abs_answer_share", "negative_mass", "noise_share", "logit_top1", "reached_90",
            "steps_to_90", "still_rising"} <= run.keys()
    assert run["steps"] == 4 and any(k.startswith("trained") for k in run["accuracy"])
    assert run["lr"] == grid["chosen"][run["variant"]]
    assert run["abs_answer_share"] >= abs(run["answer_share"]) - 1e-9
  for floors in data["chance"].values():
    assert set(floors) == {"random", "elimination", "one_key", "one_key_elimination"}
    assert floors["random"] <= floors["elimination"]
  for variant in ("transformer", "diff_v2"):
    assert data["summary"][variant]["reached_90"] in ("0/2", "1/2", "2/2")
  for metric, p in data["paired"]["diff_v2"].items():
    assert {"mean_diff", "p", "n", "family"} <= p.keys(), metric
    assert p["family"] != "descriptive" or p["p"] is None, metric  # no p for descriptive
  assert data["paired"]["diff_v2"]["steps_to_90"]["family"] == "primary"
  assert "n_determined" in data["paired"]["diff_v2"]["steps_to_90"]
  for metric in ("final_loss", "answer_share", "noise_share", "logit_top1"):
    p = data["paired"]["diff_v2"][metric]
    by_seed = {r["seed"]: r[metric] for r in data["runs"] if r["variant"] == "diff_v2"}
    base = {r["seed"]: r[metric] for r in data["runs"] if r["variant"] == "transformer"}
    diffs = [by_seed[s] - base[s] for s in (1, 2)]
    assert p["mean_diff"] == pytest.approx(sum(diffs) / 2)
  text = (root / "report.md").read_text()
  assert "Primary" in text and "floor: one_key" in text and (root / "learning_curves.png").is_file()
  # The same study under another --set is refused before anything trains, in one line naming
  # the key (in-process here: study.py prints such a line alone, tests/test_reliability.py); with
  # --retrain_changed those points train anew and the old workdirs are kept.
  def quick_tiny(num_keys: int) -> Study:
    return cli.load_definition(str(file), "study", "STUDY").validate().quick().with_options(
        sets=(f"data.task.num_keys={num_keys}",), seeds="1,2", name="tinyq").validate()
  with pytest.raises(UserError) as refused:
    runner.run(quick_tiny(7), str(file), root)
  assert len(message_lines(refused.value)) == 1
  assert "data.task.num_keys 6 -> 7" in str(refused.value)
  assert "--retrain_changed" in str(refused.value)
  changed = [a.replace("num_keys=6", "num_keys=7") for a in args]
  subset = [a.replace("transformer,diff_v2", "transformer").replace("1,2", "1") for a in changed]
  retrained = study(tmp_path, *subset, "--retrain_changed")
  assert retrained.returncode == 0, retrained.stderr[-2000:]
  assert len(list(root.glob("transformer-s1.setting-*"))) == 1
  assert json.loads((root / "records" / "transformer-s1.json").read_text())["setting"][
      "data.task.num_keys"] == 7
  for point in ("transformer-s1", "transformer-lr0.001-s1000"):  # the num_keys=6 records kept
    folder = root / "records" / ("lr_grid" if "-lr" in point else "")
    assert len(list(folder.glob(f"{point}.json.replaced-*"))) == 1
  (root / "records" / "transformer-s1.json").unlink()  # back to the num_keys=6 study below
  for old in root.rglob("*.json.replaced-*"):
    old.rename(old.with_name(old.name.split(".replaced-")[0]))
  # A rerun (what study.py does again, in-process here) trains and evaluates nothing; with the
  # workdirs gone, the records alone rebuild the same runs (a new machine with committed records).
  tiny = quick_tiny(6)
  for workdir in [root / p for p in tiny.points()] + [root / "lr_grid"]:
    shutil.rmtree(workdir)
  status, grid_again = runner.run(tiny, str(file), root)
  assert status == {p: "recorded" for p in tiny.grid_points() + tiny.points()}
  assert grid_again == data["lr_grid"]
  origin = {k: data["study"][k] for k in ("command", "wall_seconds", "invocations", "machine")}
  runs = runner.collect(tiny, root, grid_again)
  rebuilt = study_json.strict(study_json.build(tiny, runs, grid_again, [], origin))
  assert json.loads(json.dumps(rebuilt["runs"])) == data["runs"]
  assert rebuilt["paired"] == data["paired"] and rebuilt["summary"] == data["summary"]
  # Each invocation's time is kept (4 runs + 4 grid runs trained by the first), and a resumed
  # study's report lists them all.
  assert [c["trained"] for c in data["study"]["invocations"]] == [8]
  data["study"]["invocations"] = invocations.record_invocation(root, "rerun", 0.5, 0)
  assert [c["trained"] for c in data["study"]["invocations"]] == [8, 3, 0]  # + the retrain
  assert "Invocations on this root, in order: " in markdown.write(data, tmp_path).read_text()


def test_populations_group_a_cells_seeds_and_a_grid_cells_lrs_per_grid_seed(tmp_path):
  """What --population=N trains together: a compared cell's seeds; a grid cell's lrs on one
  grid seed (members may differ only in seed and lr), in programs of up to N members."""
  from diff_transformer.study.points import GRID  # this test's alone
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY)
  tiny = cli.load_definition(str(file), "study", "STUDY").validate()
  points = tiny.points()
  assert runner.populations(tiny, points, 1) == []  # one process per run
  programs = runner.populations(tiny, points, 2)
  assert sorted(map(sorted, programs)) == [
      ["diff_v2-s0", "diff_v2-s1"], ["diff_v2-s2"], ["transformer-s0", "transformer-s1"],
      ["transformer-s2"]]
  grid = ["transformer-lr0.001-s1000", "transformer-lr0.003-s1000", "transformer-lr0.001-s1001",
          "diff_v2-lr0.001-s1000"]
  assert sorted(map(sorted, runner.populations(tiny, grid, 8, GRID))) == [
      ["diff_v2-lr0.001-s1000"], ["transformer-lr0.001-s1000", "transformer-lr0.003-s1000"],
      ["transformer-lr0.001-s1001"]]


BAD_STUDY_FILES = [
    ("STUDY = (", "tiny_study.py:1: "),
    ("x = 1", "defines no STUDY"),
    ("import nothing_here_at_all", "tiny_study.py:1: ModuleNotFoundError"),
    (TINY_STUDY.replace("seeds=(0, 1, 2)", "seeds=()"), "seeds must be distinct and non-empty"),
    (TINY_STUDY.replace('("transformer", "diff_v2")', '("transformer", "diff_v3")'),
     "variants must be distinct, non-empty and registered"),
    (TINY_STUDY.replace('("train.steps", 4)', '("train.stepz", 4)'),
     "study override 'train.stepz': unknown config key"),
]


@pytest.mark.parametrize("text, message", BAD_STUDY_FILES)
def test_bad_study_files_are_one_user_error(tmp_path, text, message):
  """What study.py does with --quick before training: load the file, check it and its quick form
  (in-process; cli.run makes a UserError one line, as the next test sees end to end)."""
  file = tmp_path / "tiny_study.py"
  file.write_text(text)
  with pytest.raises(UserError) as e:
    cli.load_definition(str(file), "study", "STUDY").validate().quick().validate()
  assert len(message_lines(e.value)) == 1 and message in str(e.value), str(e.value)


def test_a_bad_study_file_is_one_line_from_the_cli(tmp_path):
  """The last check study.py makes before training (the quick form's overrides)."""
  text, message = BAD_STUDY_FILES[-1]
  file = tmp_path / "tiny_study.py"
  file.write_text(text)
  result = study(tmp_path, f"--study={file}", f"--root={tmp_path / 'root'}", "--quick")
  assert result.returncode != 0 and "Traceback" not in result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.parametrize("options, message", [
    (dict(sets=("data.task.num_keys",)), "--set: 'data.task.num_keys' is not key=value"),
    (dict(sets=("data.task.nope=3",)), "study override 'data.task.nope': unknown config key"),
    (dict(sets=("train.steps='many'",)), "study override 'train.steps'"),
    (dict(variants="transformer,diff_v3"), "variants must be distinct, non-empty and registered"),
    (dict(seeds="0,x"), "--seeds: '0,x' is not a comma-separated list of integers"),
])
def test_bad_command_line_options_are_one_user_error(tmp_path, options, message):
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY)
  with pytest.raises(UserError) as e:
    cli.load_definition(str(file), "study", "STUDY").quick().with_options(**options).validate()
  assert len(message_lines(e.value)) == 1 and message in str(e.value), str(e.value)


def test_sized_study_points_and_a_grid_at_one_size():
  """Points of a study with sizes; lr_grid_size runs the grid at one size and every size of a
  variant trains at that cell's lr; grid points pin their lr and grid seed in the name."""
  from configs import default

  def make(variant, size):
    c = default.get_config()
    c.model.variant, c.model.d_model = variant, int(size[1:])
    c.model.num_heads = heads_for(variant, c.model.d_model, c.model.head_dim)
    set_rank(c.model, 8)
    return c

  s = Study(name="sized", make=make, sizes=("d64", "d128"), primary="loss@d128",
            lr_grid=(2e-3, 4e-3),
            lr_grid_steps=50, lr_grid_size="d64").validate()
  assert s.parse("shared_diff-d128-s3") == ("shared_diff", "d128", 3, None)
  seed = s.lr_grid_seeds[0]
  assert s.parse(f"diff_v2-d64-lr0.004-s{seed}") == ("diff_v2", "d64", seed, 0.004)
  assert {p.split("-")[1] for p in s.grid_points()} == {s.lr_grid_size}
  assert len(s.grid_points()) == len(s.variants) * len(s.lr_grid) * len(s.lr_grid_seeds)
  assert s.grid_cell("diff-d128-s0") == s.grid_cell("diff-d64-s4") == f"diff-{s.lr_grid_size}"
  grid = s.get_config(f"diff-d64-lr0.004-s{seed}")
  assert grid.train.lr == 0.004 and grid.train.seed == grid.data.seed == seed
  assert grid.train.steps == s.lr_grid_steps
  for bad in ("diff-d32-s0", "diff-d64-lr0.004-s0", f"diff-d64-s{seed}x", "diff-d64-lrx-s0"):
    with pytest.raises(UserError, match=f"unknown point '{re.escape(bad)}'"):
      s.parse(bad)


def test_a_study_of_derived_cells_and_named_pairs_runs_reports_and_rebuilds(tmp_path):
  """Cells beyond the variants: an ablation trains at its parent's grid lr, a cell with its own
  grid at its own; the primary family is the pre-named pairs (Holm over them), each a - b over
  the same seeds, beside its published figure; the records alone rebuild the same result."""
  file = tmp_path / "cells_study.py"
  file.write_text(CELLS_STUDY)
  root = tmp_path / "root"
  result = study(tmp_path, f"--study={file}", "--quick", f"--root={root}")
  assert result.returncode == 0, result.stderr[-2000:]
  data = json.loads((root / "study.json").read_text())
  grid = data["lr_grid"]
  assert set(grid["chosen"]) == {"transformer", "transformer@warm1"}
  lr = {r["variant"]: r["lr"] for r in data["runs"]}
  assert lr["transformer@wd0"] == grid["chosen"]["transformer"] == lr["transformer"]
  assert lr["transformer@warm1"] == grid["chosen"]["transformer@warm1"]
  setting = json.loads((root / "records" / "transformer@warm1-s0.json").read_text())["setting"]
  assert setting["train.weight_decay"] == 0.0 and setting["train.warmup_steps"] == 1
  pairs = ["transformer@wd0 vs transformer", "transformer@warm1 vs transformer@wd0"]
  assert list(data["paired"]) == pairs and data["study"]["design"]["primary"]["comparisons"] == 2
  by = {(r["variant"], r["seed"]): r["final_loss"] for r in data["runs"]}
  entry = data["paired"]["transformer@warm1 vs transformer@wd0"]["final_loss"]
  assert entry["mean_diff"] == pytest.approx(
      by["transformer@warm1", 0] - by["transformer@wd0", 0])
  primary = [data["paired"][p]["final_loss"] for p in pairs]
  assert all(e["family"] == "primary" and e["p_holm"] >= e["p"] for e in primary)
  cells = data["study"]["cells"]
  assert cells["transformer@wd0"]["lr_from"] == "transformer"
  assert cells["transformer"]["parent"] is None
  text = (root / "report.md").read_text()
  assert "## Cells" in text and "2 pre-named pairs (a - b), Holm over 2" in text
  assert "![pre-named pairs](pairs.png)" in text and (root / "pairs.png").is_file()
  assert "| transformer@wd0 - transformer |" in text and "-0.500" in text
  assert "a test figure" in text
  assert cells["transformer@wd0"]["published"] == 7.25 and "| 7.25 |" in text
  # The records alone rebuild the same pairs (workdirs gone: committed records on a new machine).
  tiny = cli.load_definition(str(file), "study", "STUDY").validate().quick()
  for workdir in [root / p for p in tiny.points()] + [root / "lr_grid"]:
    shutil.rmtree(workdir)
  status, grid_again = runner.run(tiny, str(file), root, train=False)
  assert set(status.values()) == {"recorded"} and grid_again == grid
  origin = {k: data["study"][k] for k in ("command", "wall_seconds", "invocations", "machine")}
  rebuilt = study_json.strict(study_json.build(tiny, runner.collect(tiny, root, grid_again),
                                               grid_again, [], origin))
  assert rebuilt["paired"] == data["paired"] and rebuilt["study"]["cells"] == cells
