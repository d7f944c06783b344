"""Run a sweep's points (sequentially here, or as one command each for a scheduler), skipping
finished points; interrupted points resume from their checkpoints (train.py does that)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

from tqdm import tqdm

from diff_transformer.errors import read_json
from diff_transformer.sweeps.definition import Sweep, SweepError

SUMMARY = "summary.json"  # written by the trainer when a run reaches its last step


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
    with open(os.path.join(workdir, "sweep.log"), "a") as log:
      result = subprocess.run(command(sweep_file, point, workdir) + list(extra_args) +
                              list(point_args.get(point, ())), stdout=log,
                              stderr=subprocess.STDOUT)
    if result.returncode != 0:
      failure = f"failed (exit {result.returncode}); see {os.path.join(workdir, 'sweep.log')}"
      if not keep_going:
        raise SweepError(f"sweep point {point} {failure}; rerun to resume it")
      status[point] = failure
      continue
    status[point] = "ran"
  return status
