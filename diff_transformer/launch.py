"""The child launcher of the drivers (sweep.py, study.py): each point of a `Plan` (a sweep or a
study: anything with a name, its points, and a config per point) is one `train.py` in its own run
folder, or a member of a population (`train.py --population`, several points in one program),
up to `jobs` children at once (or printed as one command each for a scheduler); finished points
are skipped and interrupted ones resume from their checkpoints (train.py does that).

Faults: a child train.py gets SIGTERM when its driver dies, even by SIGKILL (Linux
PR_SET_PDEATHSIG), so it saves a checkpoint and exits; SIGTERM or Ctrl-C to the driver stop the
child the same way and end the driver with one line. A rerun waits (up to LOCK_WAIT_S) for such a
child to release its workdir, then resumes it.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Callable, Protocol

import ml_collections
from tqdm import tqdm

from diff_transformer.errors import Stopped, UserError
from diff_transformer.paths import write_atomic
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.record import check_setting
from diff_transformer.runs.lock import WorkdirLock

DRIVER_LOCK = "driver.lock"  # held by the study.py / sweep.py running on a root
POPULATIONS = "populations"  # <root>/populations/<name>.json: a population child's members
LOCK_WAIT_S = 120  # a child stopped by its driver's death saves and exits within this


class LaunchError(UserError, RuntimeError):
  """A point that cannot be launched, or a child that failed; one line."""


class Plan(Protocol):
  """What the launcher needs of a sweep or a study."""
  name: str

  def validate(self) -> "Plan": ...
  def points(self) -> list[str]: ...
  def get_config(self, point: str) -> ml_collections.ConfigDict: ...


def _die_with_parent() -> None:
  """In the child before exec: SIGTERM when the parent dies (train.py then saves and exits)."""
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the child outlives a killed driver
    pass


def wait_for_workdir(workdir: str, seconds: float = LOCK_WAIT_S) -> None:
  """Waits while another process (a child of a driver that was killed, still saving) holds the
  workdir's training lock; after `seconds` train.py's own refusal names the holder."""
  path = RunFolder(workdir).lock
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


def start_child(cmd: list[str], workdirs: list[str], log_path: Path, core: int | None = None
                ) -> tuple[subprocess.Popen, IO]:
  """Starts one train.py (after any dying child has left its workdirs) logging to `log_path`,
  pinned to one CPU core when `core` is given (XLA then sizes its thread pool to that core)."""
  for workdir in workdirs:
    wait_for_workdir(workdir)
  def preexec() -> None:
    _die_with_parent()
    if core is not None:
      os.sched_setaffinity(0, {core})
  log = open(log_path, "a")
  return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec), log


@contextlib.contextmanager
def pinned(core: int | None):
  """This process on one core for a while (a driver's own work beside a child on the other)."""
  if core is None or not hasattr(os, "sched_setaffinity"):
    yield
    return
  before = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {core})
  try:
    yield
  finally:
    os.sched_setaffinity(0, before)


def cores_for(jobs: int) -> list[int | None]:
  """One core per concurrent child (at most the cores this process may use); [None] (no
  pinning: the child uses every core) for one job."""
  if jobs <= 1 or not hasattr(os, "sched_getaffinity"):
    return [None]
  return sorted(os.sched_getaffinity(0))[:jobs]


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
  return bool(summary) and (summary.get("step", -1) >= plan.get_config(point).train.steps or
                            bool(summary.get("stopped_at_level")))


def command(plan_file: str, point: str, workdir: str, python: str = sys.executable) -> list[str]:
  return [python, "train.py", f"--config={plan_file}:{point}", f"--workdir={workdir}"]


@dataclasses.dataclass
class Child:
  """One train.py: a point alone, or the members of a population (`train.py --population`)."""
  points: list[tuple[str, str]]  # (point, workdir)
  command: list[str]
  log: Path


def _children(todo: list[tuple[str, str]], groups: list[list[str]], root: str,
              make_command: Callable[[str, str], list[str]], python: str) -> list[Child]:
  """A child per point, except a population child per group of two or more unfinished points:
  its members file (<root>/populations/<first point>+<n-1>.json) lists each member's train.py
  arguments, which are exactly the ones it would run with alone."""
  group_of = {p: i for i, g in enumerate(groups) for p in g}
  members: dict[int, list[tuple[str, str]]] = {}
  for point, workdir in todo:
    if point in group_of:
      members.setdefault(group_of[point], []).append((point, workdir))
  out, started = [], set()
  for point, workdir in todo:
    group = members.get(group_of.get(point, -1), [])
    if len(group) < 2:
      out.append(Child([(point, workdir)], make_command(point, workdir), RunFolder(workdir).log))
      continue
    if group_of[point] in started:
      continue
    started.add(group_of[point])
    name = f"{group[0][0]}+{len(group) - 1}"
    folder = Path(root) / POPULATIONS
    folder.mkdir(parents=True, exist_ok=True)
    listing = dict(name=name, members=[dict(point=p, args=make_command(p, w)[2:])
                                      for p, w in group])
    write_atomic(folder / f"{name}.json", json.dumps(listing, indent=1) + "\n")
    out.append(Child(group, [python, "train.py", f"--population={folder / f'{name}.json'}"],
                     folder / f"{name}.log"))
  return out


def run(plan: Plan, plan_file: str, root: str, *, mode: str = "local", launcher: str = "",
        extra_args: tuple[str, ...] = (), points: list[str] | None = None,
        point_args: dict[str, tuple[str, ...]] | None = None, keep_going: bool = False,
        jobs: int = 1, on_done: Callable[[str, str], None] | None = None,
        settings: dict[str, dict] | None = None, retrain: bool = False,
        groups: list[list[str]] = ()) -> dict[str, str]:
  """Runs `points` (default: every point of the plan; `point_args` adds flags per point), up
  to `jobs` at once; the unfinished points of each of `groups` train as one population program.
  Returns {point: 'skipped' | 'ran' | 'printed' | 'failed (exit N); see LOG'}; a failed local
  run raises unless keep_going, which records it and goes on. With `settings` (each point's
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
  python = "python" if mode == "print" else sys.executable
  children = _children(todo, list(groups), root, lambda p, w: (
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
  queue, free = list(children), cores_for(jobs)
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
        if (proc.returncode != 0 and alone) or not (alone or finished(plan, point, workdir)):
          failure = f"failed (exit {proc.returncode}); see {RunFolder(workdir).log}"
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
