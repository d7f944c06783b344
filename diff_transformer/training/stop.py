"""Stopping a run cleanly: SIGTERM/SIGINT become a save-and-exit at the next step boundary that
every process agrees on; a second Ctrl-C exits at once."""
from __future__ import annotations

import os
import signal
import sys
from typing import Callable

import jax
import numpy as np

from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.runs.lock import WorkdirLock

ANOTHER_PROCESS = "a stop requested on another process"


class StopSignal:
  """Turns SIGTERM/SIGINT into a request to save and exit at the next step boundary; a second
  SIGINT calls `on_second_interrupt` (which exits at once)."""

  def __init__(self, on_second_interrupt: Callable[[], None] | None = None):
    self.requested: str | None = None
    self.on_second_interrupt = on_second_interrupt
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. called from a worker): no handlers
        pass

  def _handle(self, signum, frame):
    if self.requested is not None and signum == signal.SIGINT:
      if self.on_second_interrupt is not None:
        self.on_second_interrupt()
      raise KeyboardInterrupt  # a second Ctrl-C means now
    self.requested = signal.Signals(signum).name

  def agreed(self, due: bool) -> str | None:
    """Why every process stops at this step (None: they go on). Any process's request stops
    everyone; with several processes they agree only at `due` steps (the same steps on every
    host: logging and checkpoint steps), so other steps never wait on a cross-host gather. A
    process stopped by another's request names that too, so its run is not taken as finished."""
    if jax.process_count() > 1:
      if not due:
        return None
      from jax.experimental import multihost_utils  # multi-process runs only
      anywhere = np.any(multihost_utils.process_allgather(np.int32(self.requested is not None)))
      if anywhere and self.requested is None:
        self.requested = ANOTHER_PROCESS
    return self.requested

  def close(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def exit_now(checkpointer: Checkpointer, lock: WorkdirLock | None) -> None:
  """A second Ctrl-C: exit at once without waiting for a save in flight (the next run removes
  its temp files); one line says which checkpoint is the newest."""
  sys.stderr.write(f"\ninterrupted again: exiting now; any checkpoint save in progress is "
                   f"abandoned; {checkpointer.newest()}\n")
  sys.stderr.flush()
  if lock is not None:
    lock.release()
  os._exit(130)
