"""study.py and sweep.py under faults: SIGKILL or SIGTERM while a child trains, and during the
study's evaluation phase; rerunning the same command finishes, every run counted once."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.studies import TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 240

SWEEP_FILE = """
from configs import synthetic
from diff_transformer.sweeps.definition import Sweep
from tests.helpers.studies import TINY_STUDY

def make(variant):
  c = synthetic.get_config(f"{variant}-mqar_plain")
  c.train.eval_every, c.train.eval_batches, c.train.global_batch_size = 3, 1, 8
  c.train.checkpoint_every = 3
  return c

SWEEP = Sweep("faults", sizes={"a": make}, budgets={"6": 6}, variants=("transformer", "diff"))
get_config = SWEEP.get_config
"""


def start(program: str, *args: str) -> subprocess.Popen:
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  return subprocess.Popen([sys.executable, str(ROOT / program), *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lock_held(workdir: Path, name: str = "train.lock") -> bool:
  path = workdir / name
  if not path.exists():
    return False
  with open(path, "a+") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return True
    fcntl.flock(f, fcntl.LOCK_UN)
    return False


def wait_until(condition, what: str) -> None:
  deadline = time.monotonic() + DEADLINE_S
  while not condition():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.1)


def interrupt(proc: subprocess.Popen, sig: int, workdir: Path) -> subprocess.CompletedProcess:
  """Sends `sig` to the driver and waits for it and for every child it was running (a study
  trains two at once), so the next driver's children are the only ones left."""
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=DEADLINE_S)
  for other in sorted(workdir.parent.iterdir()):
    wait_until(lambda: not lock_held(other), f"the child in {other} to exit")
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_study_survives_kills_in_children_and_in_evaluation_and_names_a_failed_child(tmp_path):
  """SIGKILL while a child trains (SIGTERM then: the second-driver test below), then SIGKILL and
  SIGTERM while the study evaluates; the DIFF V2 runs fail at start (an init_from_hf folder
  that does not exist): named with their log, the others go on, and the study exits 1 with
  every finished run counted once."""
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY.replace("quick_lr_grid=(1e-3, 3e-3),", "").replace(
      "  return c\n", "  if variant == 'diff_v2':\n    c.init_from_hf = '/nonexistent/hf'\n"
      "  return c\n", 1))
  root = tmp_path / "root"
  args = (f"--study={file}", "--quick", "--seeds=0", f"--root={root}")
  for sig, point, phase in ((signal.SIGKILL, "transformer-s0", "train"),
                            (signal.SIGKILL, "", "eval"), (signal.SIGTERM, "", "eval")):
    started = time.time()
    proc = start("study.py", *args)
    if phase == "train":
      workdir = root / point
      wait_until(lambda: lock_held(workdir), f"the child of {point}")
    else:  # the run finishes (or is already trained), then this driver evaluates it
      workdir = root / "transformer-s0"
      wait_until(lambda: (workdir / "eval").is_dir()
                 and (workdir / "eval").stat().st_mtime >= started, "an evaluation by this driver")
    stopped = interrupt(proc, sig, workdir)
    if sig == signal.SIGTERM:
      assert stopped.returncode == 2, stopped.stderr[-2000:]
      assert stopped.stderr.strip().splitlines()[-1].startswith("error: stopped by SIGTERM")
    else:
      assert stopped.returncode == -signal.SIGKILL

  done = start("study.py", *args)
  out, err = done.communicate(timeout=DEADLINE_S)
  assert done.returncode == 1 and "Traceback" not in err, err[-2000:]
  point = "diff_v2-s0"  # named, with the log to read
  assert f"{point}: failed (exit 2); see {root / point / 'sweep.log'}" in err, err[-2000:]
  data = json.loads((root / "study.json").read_text())
  assert [r["point"] for r in data["runs"]] == ["transformer-s0"]
  assert all(r["steps"] == 4 for r in data["runs"])  # finished runs only, each exactly once
  assert data["missing"] == ["diff_v2-s0"]
  # The SIGTERM-stopped part is counted with the one that finished (the SIGKILLed ones cannot be).
  assert [c.get("stopped_by") for c in data["study"]["invocations"]] == ["SIGTERM", None]
  assert "stopped by SIGTERM)" in (root / "report.md").read_text()


@pytest.mark.long
def test_sweep_survives_sigterm_and_sigkill_in_a_child(tmp_path):
  """sweep.py's side of the faults above: its children start and stop through the same
  launch.run as the study's (covered on every run above), and its resume without redoing a
  finished point is tests/test_sweep_resume.py's."""
  file = tmp_path / "faults_sweep.py"
  file.write_text(SWEEP_FILE)
  root = tmp_path / "root"
  args = (f"--sweep={file}", f"--root={root}")
  for sig, point in ((signal.SIGTERM, "transformer-a-6"), (signal.SIGKILL, "transformer-a-6")):
    proc = start("sweep.py", *args)
    wait_until(lambda: lock_held(root / point), f"the child of {point}")
    stopped = interrupt(proc, sig, root / point)
    if sig == signal.SIGTERM:
      assert stopped.returncode == 2, stopped.stderr[-2000:]
      assert stopped.stderr.strip().splitlines()[-1].startswith("error: stopped by SIGTERM")
  done = start("sweep.py", *args)
  out, err = done.communicate(timeout=DEADLINE_S)
  assert done.returncode == 0, err[-2000:]
  for point in ("transformer-a-6", "diff-a-6"):
    assert json.loads((root / point / "summary.json").read_text())["step"] == 6


def test_a_second_driver_on_a_root_is_refused_up_front(tmp_path):
  """Two identical studies on one root: the second ends in one line naming the first before it
  trains anything; the first is untouched, and SIGTERM while its child trains stops both (the
  child saves; the driver exits 2 in one line; the study-fault test above resumes such a
  study)."""
  file = tmp_path / "tiny_study.py"
  # One child, no grid, and too many steps to finish before the SIGTERM: a 4-step child could
  # finish while the second driver starts, and its lock would never be seen held.
  text = TINY_STUDY.replace("quick_lr_grid=(1e-3, 3e-3),", "").replace(
      '("train.steps", 4), ("train.checkpoint_every", 4)',
      '("train.steps", 100_000), ("train.checkpoint_every", 100_000)')
  assert "100_000" in text
  file.write_text(text)
  root = tmp_path / "root"
  args = (f"--study={file}", "--quick", f"--root={root}", "--variants=transformer", "--seeds=0")
  first = start("study.py", *args)
  wait_until(lambda: lock_held(root, "driver.lock"), "the first study to hold its root")
  second = start("study.py", *args)
  out, err = second.communicate(timeout=DEADLINE_S)
  assert second.returncode == 2 and len(err.strip().splitlines()) == 1, err[-2000:]
  assert f"--root {root}: another study.py holds it (pid {first.pid}" in err
  assert first.poll() is None and lock_held(root, "driver.lock")  # the first goes on
  wait_until(lambda: lock_held(root / "transformer-s0"), "the first study's child")
  stopped = interrupt(first, signal.SIGTERM, root / "transformer-s0")
  assert stopped.returncode == 2, stopped.stderr[-2000:]
  assert stopped.stderr.strip().splitlines()[-1].startswith("error: stopped by SIGTERM")


def _study_with_one_finished_run(tmp_path: Path):
  """The tiny study's file and plan, with its first point's run finished under `root`."""
  from diff_transformer import cli
  from diff_transformer.runs.folder import RunFolder
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY.replace("quick_lr_grid=(1e-3, 3e-3),", ""))
  study = cli.load_definition(str(file), "study", "STUDY").validate().quick()
  done, todo = study.points()[:2]
  folder = RunFolder(tmp_path / "root" / done)
  folder.path.mkdir(parents=True)
  folder.summary.write_text(json.dumps({"step": study.get_config(done).train.steps}))
  return file, study, done, todo


def test_a_run_finished_before_the_call_is_recorded_before_any_child_starts(tmp_path, monkeypatch):
  """A driver stopped while its children train must not lose a run it found finished: launch.run
  hands such a run to on_done before it starts the first child."""
  from diff_transformer import launch
  file, study, done, todo = _study_with_one_finished_run(tmp_path)
  recorded = []

  def killed(*args, **kwargs):
    raise KeyboardInterrupt  # the driver stopped while the first child trains

  monkeypatch.setattr(launch, "_run_local", killed)
  with pytest.raises(KeyboardInterrupt):
    launch.run(study, str(file), str(tmp_path / "root"), points=[done, todo],
               on_done=lambda p, w: recorded.append(p))
  assert recorded == [done]


def test_a_round_whose_runs_all_finished_starts_nothing_and_draws_no_progress_bar(tmp_path, capfd):
  from diff_transformer import launch
  file, study, done, _ = _study_with_one_finished_run(tmp_path)
  recorded = []
  status = launch.run(study, str(file), str(tmp_path / "root"), points=[done],
                      on_done=lambda p, w: recorded.append(p))
  assert status == {done: "skipped"} and recorded == [done]
  assert "run/s" not in capfd.readouterr().err  # tqdm's bar names its unit


CHILD = """
import os, sys, time
from diff_transformer.children import DRIVER_PID, die_with_driver
die_with_driver()
print(sorted(os.sched_getaffinity(0)), DRIVER_PID in os.environ, flush=True)
time.sleep(DEADLINE)
"""

DRIVER = """
import sys
from pathlib import Path
import jax  # the driver runs JAX's threads when it starts a child
from diff_transformer.children import start_child
jax.numpy.zeros(2).block_until_ready()
proc, log = start_child([sys.executable, "-c", sys.argv[1]], [], Path(sys.argv[2]), core=0)
print(proc.pid, flush=True)
proc.wait()
"""


def _alive(pid: int) -> bool:
  try:  # a child reparented to a container's init may stay a zombie: dead all the same
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
  except FileNotFoundError:
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_is_pinned_stops_with_its_killed_driver_and_runs_no_python_before_exec(tmp_path):
  """The driver (with JAX's threads running) starts a child on core 0; no Python runs between
  fork and exec (JAX warns of a deadlock when it does); SIGKILL to the driver stops the child. A
  child whose driver is gone before it could ask to stop with it stops at once."""
  log, program = tmp_path / "child.log", tmp_path / "driver.py"
  program.write_text(DRIVER)
  driver = start(str(program), CHILD.replace("DEADLINE", str(DEADLINE_S)), str(log))
  child = int(driver.stdout.readline())
  wait_until(lambda: log.exists() and log.read_text().strip(), "the child's first line")
  assert log.read_text().strip() == "[0] False"  # pinned; the variable not passed further down
  driver.kill()
  _, err = driver.communicate(timeout=DEADLINE_S)
  assert "fork" not in err, err[-2000:]
  wait_until(lambda: not _alive(child), "the child to stop with its driver")
  gone = {**os.environ, "PYTHONPATH": str(ROOT), "DIFF_TRANSFORMER_DRIVER_PID": "1"}
  orphan = subprocess.run([sys.executable, "-c", CHILD.replace("DEADLINE", "0")], cwd=ROOT,
                          env=gone, capture_output=True, text=True, timeout=DEADLINE_S)
  assert orphan.returncode == -signal.SIGTERM and not orphan.stdout, orphan.stderr[-2000:]
