"""study.py end to end on a test-sized study, its statistics against a hand computation, and
one-line errors for bad study files."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diff_transformer import cli
from diff_transformer.errors import UserError, message_lines
from diff_transformer.study import paired, runner, summarize

ROOT = Path(__file__).resolve().parents[1]
TINY_STUDY = """
from configs import synthetic
from diff_transformer.study import Study

def make(variant):
  c = synthetic.get_config(f"{variant}-mqar_plain")
  c.train.steps = c.train.checkpoint_every = 6
  c.train.eval_every, c.train.eval_batches, c.train.global_batch_size = 3, 1, 8
  return c

STUDY = Study(name="tiny", make=make, seeds=(0, 1, 2), variants=("transformer", "diff_v2"),
              eval_rows=16, attention_rows=2, quick_seeds=(0, 1),
              quick_overrides=(("train.steps", 4), ("train.checkpoint_every", 4)))
get_config = STUDY.get_config
"""


def test_paired_interval_matches_a_hand_computation():
  variant = {0: 0.50, 1: 0.70, 2: 0.65, 3: 0.40}
  base = {0: 0.45, 1: 0.60, 2: 0.66, 3: 0.30, 9: 1.0}  # seed 9 has no partner: left out
  d = [0.05, 0.10, -0.01, 0.10]
  mean = sum(d) / 4
  sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
  half = 3.182446305284263 * sd / 2  # t(0.975, 3) * sd / sqrt(4)
  got = paired(variant, base)
  assert got["n"] == 4
  assert got["mean_diff_vs_transformer"] == pytest.approx(mean)
  assert got["ci95_low"] == pytest.approx(mean - half) and got["ci95_high"] == pytest.approx(
      mean + half)
  assert math.isnan(paired({0: 1.0}, {0: 0.5})["ci95_low"])
  s = summarize([1.0, 2.0, 4.0, float("nan")])
  assert s["n"] == 3 and s["mean"] == pytest.approx(7 / 3)
  assert s["std"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 +
                                              (4 - 7 / 3) ** 2) / 2))


def study(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / "study.py"), *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        env={"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                             "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                             **{k: v for k, v in os.environ.items()
                                if k.startswith(("JAX_", "XLA_"))}})  # the session's cache, flags


def test_quick_study_runs_end_to_end_and_resumes(tmp_path):
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY)
  root = tmp_path / "root"
  result = study(tmp_path, f"--study={file}", f"--root={root}", "--quick")
  assert result.returncode == 0, result.stderr[-2000:]
  data = json.loads((root / "study.json").read_text())
  assert {"study", "runs", "summary", "paired"} <= data.keys()
  assert len(data["runs"]) == 4 and {r["seed"] for r in data["runs"]} == {0, 1}
  for run in data["runs"]:
    assert {"variant", "seed", "params", "final_loss", "accuracy", "answer_share",
            "noise_share", "logit_top1"} <= run.keys()
    assert run["steps"] == 4 and any(k.startswith("trained") for k in run["accuracy"])
  for metric in ("final_loss", "answer_share", "noise_share", "logit_top1"):
    assert data["summary"]["diff_v2"][metric]["n"] == 2
    p = data["paired"]["diff_v2"][metric]
    assert {"mean_diff_vs_transformer", "ci95_low", "ci95_high"} <= p.keys()
    by_seed = {r["seed"]: r[metric] for r in data["runs"] if r["variant"] == "diff_v2"}
    base = {r["seed"]: r[metric] for r in data["runs"] if r["variant"] == "transformer"}
    assert p["mean_diff_vs_transformer"] == pytest.approx(
        sum(by_seed[s] - base[s] for s in (0, 1)) / 2)
  report = (root / "report.md").read_text()
  assert "Paired difference" in report and (root / "learning_curves.png").is_file()
  # A rerun (what study.py does again, in-process here) trains and evaluates nothing.
  tiny = cli.load_definition(str(file), "study", "STUDY").validate().quick()
  assert runner.run(tiny, str(file), root) == {p: "skipped" for p in tiny.points()}


BAD_STUDY_FILES = [
    ("STUDY = (", "tiny_study.py:1: "),
    ("x = 1", "defines no STUDY"),
    ("import nothing_here_at_all", "tiny_study.py:1: ModuleNotFoundError"),
    (TINY_STUDY.replace("seeds=(0, 1, 2)", "seeds=()"), "seeds must be distinct and non-empty"),
    (TINY_STUDY.replace('("transformer", "diff_v2")', '("transformer", "diff_v3")'),
     "variants must be a non-empty subset"),
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
