"""Orbax failures reported as one line: the exceptions its save threads log with tracebacks,
and the stderr noise a failed read leaves behind."""
from __future__ import annotations

import contextlib
import gc
import io
import logging
import sys
import time

from diff_transformer.errors import message_lines


def one_line(e: BaseException) -> str:
  lines = message_lines(e)
  first = lines[0].split(" See full TensorStore details")[0][:200] if lines else ""
  return f"{type(e).__name__}: {first}" if first else type(e).__name__


@contextlib.contextmanager
def quiet_failed_reads():
  """A failed orbax read leaves tensorstore reads in flight whose callbacks hit a closed event
  loop and print tracebacks from background threads (and coroutines Python would report as
  'Exception ignored'). The failure is already reported in one line, so while restoring (and
  briefly after a failure, for stragglers) that stderr noise is captured and dropped."""
  old_hook = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None
  try:
    with contextlib.redirect_stderr(io.StringIO()):
      yield
  finally:
    sys.unraisablehook = old_hook


def settle_failed_reads() -> None:
  time.sleep(1.0)  # the sibling reads of a failed restore finish within milliseconds locally
  gc.collect()
  # Their orphaned asyncio tasks are otherwise logged as 'Task exception was never retrieved'
  # with a traceback whenever they are collected, possibly at exit.
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)


class OrbaxErrorCatcher(logging.Filter):
  """Keeps the exceptions orbax logs (with tracebacks) from its save threads off stderr and
  remembers the last one, so a failed save is reported once, as one line."""

  def __init__(self):
    super().__init__()
    self.last: BaseException | None = None

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and "orbax" in record.pathname:
      self.last = record.exc_info[1]
      return False
    return True
