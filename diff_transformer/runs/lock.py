"""One training run per workdir: the workdir is checked and locked before any expensive work.

The lock is the run folder's lock file (runs/folder.py), held with flock for the run's lifetime
(the kernel releases it when the process dies, even by kill -9) and holding the owner's pid, host
and start time for the message a second writer gets. A lock file whose flock is free is stale
(its run died): it is taken over with a one-line notice. Readers (eval.py) never lock.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO

from diff_transformer.runs import folder as run_folder
from diff_transformer.errors import TrainError
from diff_transformer.paths import output_dir

LOCK_FILE = run_folder.LOCK


def prepare_workdir(workdir: Path) -> None:
  """Creates the workdir and probes that it takes files: an impossible one is one TrainError."""
  output_dir(workdir, "--workdir", TrainError)


def _owner(text: str) -> tuple[str | None, str]:
  """(the holding program as its lock file names it, or None; pid, host and start)."""
  try:
    info = json.loads(text)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
    return info.get("program"), f"pid {info['pid']} on {info['host']}, started {started}"
  except (ValueError, KeyError, TypeError, AttributeError):
    return None, "an unknown process"


class WorkdirLock:
  """acquire() refuses a workdir another live run holds; release() at the end of the run. The
  drivers (study.py, sweep.py) hold their --root the same way, under another file name."""

  def __init__(self, workdir: Path, name: str = LOCK_FILE, flag: str = "--workdir",
               holder: str = "another training run", program: str | None = None):
    self.workdir, self.name, self.flag, self.holder = Path(workdir), name, flag, holder
    self.program = program  # a driver's name, written into the lock: refusals name the holder
    self.path = self.workdir / name
    self._file: IO[str] | None = None

  def acquire(self) -> str | None:
    """Takes the lock; returns a notice if a stale lock (a run that died) was taken over."""
    try:
      f = open(self.path, "a+")
    except OSError as e:
      raise TrainError(f"{self.flag} {self.workdir}: cannot write {self.name} ({e.strerror})"
                       ) from None
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      f.seek(0)
      program, owner = _owner(f.read())
      f.close()
      if e.errno in (errno.EAGAIN, errno.EACCES):
        holder = f"another {program}" if program else self.holder
        raise TrainError(f"{self.flag} {self.workdir}: {holder} holds it ({owner}); "
                         f"wait for it to end or use another {self.flag}") from None
      raise TrainError(f"{self.flag} {self.workdir}: cannot lock {self.name} ({e.strerror})"
                       ) from None
    f.seek(0)
    previous = f.read().strip()
    try:
      f.seek(0)
      f.truncate()
      me = dict(pid=os.getpid(), host=socket.gethostname(), started=time.time())
      f.write(json.dumps(me | ({"program": self.program} if self.program else {})))
      f.flush()
    except OSError as e:
      f.close()
      raise TrainError(f"{self.flag} {self.workdir}: cannot write {self.name} ({e.strerror})"
                       ) from None
    self._file = f
    if previous:
      program, owner = _owner(previous)
      return (f"took over the stale lock of {program or 'a run'} that ended without releasing it "
              f"({owner})")
    return None

  def release(self) -> None:
    """Empties the file and drops the lock (the file stays, so no second inode can appear)."""
    if self._file is None:
      return
    try:
      self._file.seek(0)
      self._file.truncate()
    except OSError:
      pass
    self._file.close()  # closing releases the flock
    self._file = None
