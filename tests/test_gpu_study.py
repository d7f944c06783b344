"""The GPU study command's CPU mode (tools/gpu_study.sh --cpu): a study stopped at its deadline
exits 0 with a tarball of what it recorded (a refused one exits with the study's status 2); a later
call on the same results folder finishes and its tarball holds the records, so the command a
time-limited GPU job runs cannot rot between jobs."""
from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.helpers.studies import TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]


def gpu_study(tmp_path: Path, seconds: int, *flags: str, status: int = 0) -> tuple[str, set[str]]:
  out = tmp_path / f"out{seconds}"
  proc = subprocess.run(["bash", "tools/gpu_study.sh", "--cpu", str(seconds),
                         str(tmp_path / "study_tiny"), *flags], cwd=ROOT, capture_output=True,
                        text=True, timeout=600, env={**os.environ, "OUT": str(out)})
  assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr[-3000:]
  with tarfile.open(out / "study.tar.gz") as tar:
    names = set(tar.getnames())
  return proc.stdout, names


def test_a_study_stopped_at_its_deadline_exits_0_and_a_later_call_finishes_into_the_tarball(
    tmp_path):
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY.replace("quick_lr_grid=(1e-3, 3e-3),", ""))  # one run, no grid
  # As on the GPU: the cell's seeds as one program of two members (study.py --population; each
  # member is its standalone run: tests/test_population_runs.py).
  flags = (f"--study={file}", "--quick", "--variants=transformer", "--seeds=0,1",
           "--population=2")
  stopped, names = gpu_study(tmp_path, 1, *flags)  # the driver is still starting at 1 s
  assert "== study stopped at 1 s" in stopped and "== 0 records" in stopped, stopped
  assert "study_tiny/records/transformer-s0.json" not in names
  finished, names = gpu_study(tmp_path, 300, *flags)
  assert "== study finished: every point recorded" in finished, finished
  assert "== 2 records" in finished
  points = ("transformer-s0", "transformer-s1")
  assert {*(f"study_tiny/records/{p}.json" for p in points), "study_tiny/study.json"} <= names
  assert not any(n.endswith("driver.lock") for n in names)
  for point in points:
    record = json.loads((tmp_path / f"study_tiny/records/{point}.json").read_text())
    assert record["steps"] == 4 and record["population"] == 2, record


def test_a_refused_study_fails_the_command_and_still_packs_the_folder(tmp_path):
  stdout, names = gpu_study(tmp_path, 60, f"--study={tmp_path / 'nowhere.py'}", status=2)
  assert "== study exit status 2" in stdout and "== 0 records" in stdout
  assert "study_tiny" in names


@pytest.mark.parametrize("args", [[], ["--cpu"], ["abc", "out"]])
def test_without_seconds_and_results_it_prints_its_usage(args, tmp_path):
  proc = subprocess.run(["bash", "tools/gpu_study.sh", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=30, env={**os.environ, "OUT": str(tmp_path / "o")})
  assert proc.returncode == 2 and proc.stderr.startswith("usage: bash tools/gpu_study.sh")
  assert not (tmp_path / "o").exists()
