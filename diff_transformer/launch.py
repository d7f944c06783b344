"""The child launcher of the drivers (sweep.py, study.py): each point of a `Plan` (a sweep or a
study: anything with a name, its points, and a config per point) is one `train.py` in its own run
folder, or a member of a population (`train.py --population`, several points in one program),
up to `jobs` children at once (or printed as one command each for a scheduler); finished points
are skipped and interrupted ones resume from their checkpoints (train.py does that).

Faults: a child train.py gets SIGTERM when its driver dies, even by SIGKILL (Linux
PR_SET_PDEATHSIG), so it saves a checkpoint and exits; SIGTERM or Ctrl-C to the driver stop the
child the same way and end the driver with one line. A rerun waits (up to children.LOCK_WAIT_S)
for such a child to release its workdir, then resumes it (children.py starts them).
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Callable, Protocol, Sequence

import ml_collections
from tqdm import tqdm

from diff_transformer.children import Child, cores_for, pinned, plan_children, start_child
from diff_transformer.errors import Stopped, UserError
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.record import check_setting
from diff_transformer.runs.lock import WorkdirLock

DRIVER_LOCK = "driver.lock"  # held by the study.py / sweep.py running on a root


class LaunchError(UserError, RuntimeError):
  """A point that cannot be launched, or a child that failed; one line."""


class Plan(Protocol):
  """What the launcher needs of a sweep or a study."""
  @property
  def name(self) -> str: ...

  def validate(self) -> "Plan": ...
  def points(self) -> list[str]: ...
  def get_config(self, point: str) -> ml_collections.ConfigDict: ...


def _stopped() -> Stopped:
  return Stopped("stopped by SIGTERM (a running point saves a checkpoint first); rerun the "
                 "same command to resume")


@contextlib.contextmanager
def holding(root: str | os.PathLike, program: str, flag: str = "--root"):
  """One driver per root: a second study.py or sweep.py on it is refused up front, in one line
  naming the holder (the program its lock names, pid, since when) and the flag, before it trains
  or writes anything (the kernel frees the lock of a driver that died)."""
  lock = WorkdirLock(Path(root), DRIVER_LOCK, flag, f"another {program}", program=program)
  notice = lock.acquire()
  if notice:
    print(f"note: {flag} {root}: {notice}", flush=True)
  try:
    yield
  finally:
    lock.release()


def stop_on_sigterm() -> None:
  """Makes SIGTERM to a driver (sweep.py, study.py) a one-line `Stopped` in its main thread,
  after the running children have been stopped and have saved. Python drops an exception raised
  while it runs a garbage-collection callback, so the request is also remembered and raised again
  at the driver's next safe point (`raise_if_stopped`)."""
  def handler(signum, frame):
    del frame
    Stopped.requests.append(signum)
    raise _stopped()
  signal.signal(signal.SIGTERM, handler)


def raise_if_stopped() -> None:
  if Stopped.requests:
    raise _stopped()


def finished(plan: Plan, point: str, workdir: str) -> bool:
  """The run reached its last step, or stopped at its train.stop_at_val_accuracy level."""
  summary = RunFolder(workdir).read_summary(LaunchError)
  return summary is not None and (summary.get("step", -1) >= plan.get_config(point).train.steps
                                  or bool(summary.get("stopped_at_level")))


def command(plan_file: str, point: str, workdir: str, python: str = sys.executable) -> list[str]:
  return [python, "train.py", f"--config={plan_file}:{point}", f"--workdir={workdir}"]


def run(plan: Plan, plan_file: str, root: str, *, mode: str = "local", launcher: str = "",
        extra_args: tuple[str, ...] = (), points: list[str] | None = None,
        point_args: dict[str, tuple[str, ...]] | None = None, keep_going: bool = False,
        jobs: int = 1, on_done: Callable[[str, str], None] | None = None,
        settings: dict[str, dict] | None = None, retrain: bool = False,
        groups: Sequence[list[str]] = ()) -> dict[str, str]:
  """Runs `points` (default: every point of the plan; `point_args` adds flags per point), up
  to `jobs` at once; the unfinished points of each of `groups` train as one population program.
  Returns {point: 'skipped' | 'ran' | 'printed' | 'failed (exit N); see LOG'}; a failed local
  run raises unless keep_going, which records it and goes on. `on_done(point, workdir)` runs
  for each finished point, those finished before this call first, before any child starts.
  With `settings` (each point's
  resolved setting, runs.record.setting), a workdir trained under another is refused in one
  line, or with `retrain` moved aside and trained anew: the one setting guard, for both
  drivers."""
  plan.validate()
  if mode not in ("local", "print"):
    raise LaunchError(f"--mode: '{mode}' is not one of local, print")
  point_args = point_args or {}
  status = {}
  todo = []
  for point in plan.points() if points is None else points:
    workdir = os.path.join(root, point)
    if settings is not None:
      check_setting(Path(workdir), point, settings[point], retrain)
    if finished(plan, point, workdir):
      status[point] = "skipped"
    else:
      todo.append((point, workdir))
  if mode == "local" and on_done is not None:
    for point in [p for p, why in status.items() if why == "skipped"]:
      on_done(point, os.path.join(root, point))  # finished earlier: before any training starts
      raise_if_stopped()
  python = "python" if mode == "print" else sys.executable
  children = plan_children(todo, list(groups), root, lambda p, w: (
      command(plan_file, p, w, python) + list(extra_args) + list(point_args.get(p, ()))),
      python)
  if mode == "print":
    for child in children:
      cmd = shlex.join(child.command)
      print(f"{launcher} {shlex.quote(cmd)}" if launcher else cmd)
      status.update({p: "printed" for p, _ in child.points})
    return status
  _run_local(plan, children, status, jobs=jobs, keep_going=keep_going, on_done=on_done)
  return status


def _run_local(plan: Plan, children: list[Child], status: dict[str, str], *, jobs: int,
               keep_going: bool, on_done: Callable[[str, str], None] | None) -> None:
  """Up to `jobs` children at once, each on its own core; `on_done(point, workdir)` runs in this
  process, on the core a child just left, before the next child takes it. A population's member
  that did not finish is failed on its own (its log names why). An interrupt stops every
  running child (each saves) before it propagates."""
  if not children:  # a round whose points all finished earlier: no empty progress bar
    return
  queue, free = list(children), list(cores_for(jobs))
  running: dict[int, tuple[subprocess.Popen, IO, Child, int | None]] = {}
  bar = tqdm(total=sum(len(c.points) for c in children), desc=plan.name, unit="run")
  try:
    while queue or running:
      raise_if_stopped()
      while queue and free:
        child = queue.pop(0)
        for _, workdir in child.points:
          os.makedirs(workdir, exist_ok=True)
        core = free.pop(0)
        proc, log = start_child(child.command, [w for _, w in child.points], child.log, core)
        running[proc.pid] = (proc, log, child, core)
      pid, wait_status = os.wait()
      if pid not in running:
        continue
      proc, log, child, core = running.pop(pid)
      proc.returncode = os.waitstatus_to_exitcode(wait_status)
      log.close()
      for point, workdir in child.points:
        bar.update()
        alone = len(child.points) == 1
        if (proc.returncode != 0 and alone) or not finished(plan, point, workdir):
          failure = ((f"failed (exit {proc.returncode})" if proc.returncode else
                      "stopped before its last step (exit 0)") + f"; see {RunFolder(workdir).log}" +
                     ("" if alone else f" and the population's {child.log}"))
          if not keep_going:
            raise LaunchError(f"{plan.name}: point {point} {failure}; rerun to resume it")
          status[point] = failure
          continue
        status[point] = "ran"
        if on_done is not None:
          with pinned(core):
            on_done(point, workdir)
          raise_if_stopped()
      free.append(core)
  except BaseException:
    for proc, log, *_ in running.values():
      proc.send_signal(signal.SIGTERM)
    for proc, log, *_ in running.values():
      proc.wait()
      log.close()
    raise
  finally:
    bar.close()
