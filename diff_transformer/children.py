"""A driver's children: one `train.py` per point, or per population (its members file lists
each member's train.py arguments), started after any dying predecessor has left its workdirs,
pinned to one core, and stopped (SIGTERM: it saves) when its driver dies, even by SIGKILL
(Linux PR_SET_PDEATHSIG)."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Callable, Sequence

from diff_transformer.paths import write_atomic
from diff_transformer.runs.folder import RunFolder

POPULATIONS = "populations"  # <root>/populations/<name>.json: a population child's members
DRIVER_PID = "DIFF_TRANSFORMER_DRIVER_PID"  # a child's environment: the driver it stops with
LOCK_WAIT_S = 120  # a child stopped by its driver's death saves and exits within this


def die_with_driver() -> None:
  """A child's first step: SIGTERM when its driver dies (train.py then saves and exits), at once
  if the driver is already gone. Set here, not between fork and exec in the driver: JAX's
  threads run there, and Python code in a forked copy of them can deadlock."""
  driver = os.environ.pop(DRIVER_PID, "")  # popped: this child's own children are not a driver's
  if not driver:
    return
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the child outlives a killed driver
    return
  if os.getppid() != int(driver):  # the driver died before the line above took hold
    os.kill(os.getpid(), signal.SIGTERM)


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
  log = open(log_path, "a")
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                          env=dict(os.environ, **{DRIVER_PID: str(os.getpid())}))
  if core is not None:  # a fresh interpreter, one thread yet: every thread it starts inherits it
    with contextlib.suppress(ProcessLookupError):
      os.sched_setaffinity(proc.pid, {core})
  return proc, log


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


def cores_for(jobs: int) -> Sequence[int | None]:
  """One core per concurrent child (at most the cores this process may use); [None] (no
  pinning: the child uses every core) for one job."""
  if jobs <= 1 or not hasattr(os, "sched_getaffinity"):
    return [None]
  return sorted(os.sched_getaffinity(0))[:jobs]


@dataclasses.dataclass
class Child:
  """One train.py: a point alone, or the members of a population (`train.py --population`)."""
  points: list[tuple[str, str]]  # (point, workdir)
  command: list[str]
  log: Path


def plan_children(todo: list[tuple[str, str]], groups: list[list[str]], root: str,
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


