"""Run a sweep's points (sequentially here, or as one command each for a scheduler), skipping
finished points; interrupted points resume from their checkpoints (train.py does that).

Faults: a child train.py gets SIGTERM when its driver dies, even by SIGKILL (Linux
PR_SET_PDEATHSIG), so it saves a checkpoint and exits; SIGTERM or Ctrl-C to the driver stop the
child the same way and end the driver with one line. A rerun waits (up to LOCK_WAIT_S) for such a
child to release its workdir, then resumes it.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time

from tqdm import tqdm

from diff_transformer.errors import read_json
from diff_transformer.sweeps.definition import Sweep, SweepError

SUMMARY = "summary.json"  # written by the trainer when a run reaches its last step
LOCK_WAIT_S = 120  # a child stopped by its driver's death saves and exits within this


def _die_with_parent() -> None:
  """In the child before exec: SIGTERM when the parent dies (train.py then saves and exits)."""
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the child outlives a killed driver
    pass


def wait_for_workdir(workdir: str, seconds: float = LOCK_WAIT_S) -> None:
  """Waits while another process (a child of a driver that was killed, still saving) holds the
  workdir's train.lock; after `seconds` train.py's own refusal names the holder."""
  path = os.path.join(workdir, "train.lock")
  if not os.path.exists(path):
    return
  deadline = time.monotonic() + seconds
  with open(path, "a+") as f:
    while True:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)
        return
      except OSError:
        if time.monotonic() > deadline:
          return
        time.sleep(0.2)


def run_child(cmd: list[str], workdir: str) -> int:
  """Runs one train.py to its end; if the driver is interrupted (Ctrl-C, or SIGTERM turned into
  an exception by `stop_on_sigterm`), stops the child (it saves and exits) before re-raising."""
  wait_for_workdir(workdir)
  with open(os.path.join(workdir, "sweep.log"), "a") as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_die_with_parent)
    try:
      return proc.wait()
    except BaseException:
      proc.send_signal(signal.SIGTERM)
      proc.wait()
      raise


def stop_on_sigterm() -> None:
  """Makes SIGTERM to a driver (sweep.py, study.py) a one-line SweepError in its main thread,
  after the running child has been stopped and has saved."""
  def handler(signum, frame):
    del signum, frame
    raise SweepError("stopped by SIGTERM (a running point saves a checkpoint first); rerun the "
                     "same command to resume")
  signal.signal(signal.SIGTERM, handler)


def read_summary(workdir: str) -> dict | None:
  path = os.path.join(workdir, SUMMARY)
  if not os.path.exists(path):
    return None
  return read_json(path, SweepError)


def finished(sweep: Sweep, point: str, workdir: str) -> bool:
  summary = read_summary(workdir)
  return bool(summary) and summary.get("step", -1) >= sweep.get_config(point).train.steps


def command(sweep_file: str, point: str, workdir: str, python: str = sys.executable) -> list[str]:
  return [python, "train.py", f"--config={sweep_file}:{point}", f"--workdir={workdir}"]


def run(sweep: Sweep, sweep_file: str, root: str, *, mode: str = "local", launcher: str = "",
        extra_args: tuple[str, ...] = (), points: list[str] | None = None,
        point_args: dict[str, tuple[str, ...]] | None = None, keep_going: bool = False
        ) -> dict[str, str]:
  """Runs `points` (default: every point of the sweep; `point_args` adds flags per point).
  Returns {point: 'skipped' | 'ran' | 'printed' | 'failed (exit N); see LOG'}; a failed local
  run raises unless keep_going, which records it and goes on with the others."""
  sweep.validate()
  if mode not in ("local", "print"):
    raise SweepError(f"--mode: '{mode}' is not one of local, print")
  point_args = point_args or {}
  status = {}
  todo = []
  for point in sweep.points() if points is None else points:
    workdir = os.path.join(root, point)
    if finished(sweep, point, workdir):
      status[point] = "skipped"
    else:
      todo.append((point, workdir))
  if mode == "print":
    for point, workdir in todo:
      cmd = (command(sweep_file, point, workdir, python="python") + list(extra_args) +
             list(point_args.get(point, ())))
      print(f"{launcher} {shlex.quote(shlex.join(cmd))}" if launcher else shlex.join(cmd))
      status[point] = "printed"
    return status
  for point, workdir in tqdm(todo, desc=f"sweep {sweep.name}", unit="run"):
    os.makedirs(workdir, exist_ok=True)
    returncode = run_child(command(sweep_file, point, workdir) + list(extra_args) +
                           list(point_args.get(point, ())), workdir)
    if returncode != 0:
      failure = f"failed (exit {returncode}); see {os.path.join(workdir, 'sweep.log')}"
      if not keep_going:
        raise SweepError(f"sweep point {point} {failure}; rerun to resume it")
      status[point] = failure
      continue
    status[point] = "ran"
  return status
