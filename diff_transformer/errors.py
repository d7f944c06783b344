"""User-facing errors and exceptions as the one line a user sees (library and XLA errors span many
lines).

Every error a user can fix (a bad flag, config value, file or workdir) is a `UserError`; the
programs' entry point (`cli.run`) is the one place that catches it: it prints `error: <message>`
and exits with status 2. The four kinds below, and the interop, AOT and sweep errors, subclass it.
"""
from __future__ import annotations


class UserError(Exception):
  """Bad input or state the user can act on; the message is one line naming the field or file."""


class ConfigError(UserError, ValueError):
  """A config value that breaks a constraint; the message is one line naming the field."""


class DataError(UserError, ValueError):
  """Bad data input or state; the message is one line naming the path, field or command."""


class TrainError(UserError, RuntimeError):
  """A training failure the user can act on (mesh, workdir, checkpoint); one line."""


class EvalError(UserError, ValueError):
  """Bad evaluation input; the message is one line naming the flag, path or limit."""


class Stopped(UserError):
  """A driver (study.py, sweep.py) was told to stop by SIGTERM (launch.stop_on_sigterm).
  Raised from a signal handler, it can surface inside any library call: code that reads a
  library failure as damage (a checkpoint restore) re-raises it instead."""
  requests: list[int] = []  # the signals received: remembered where Python drops the raise


def message_lines(e: BaseException) -> list[str]:
  return [l.strip() for l in str(e).strip().splitlines() if l.strip()]


def first_line(e: BaseException, limit: int = 300) -> str:
  """The headline (XLA and libtpu put the cause first); the type name for an empty message."""
  lines = message_lines(e)
  return lines[0][:limit] if lines else type(e).__name__


def last_line(e: BaseException) -> str:
  """The innermost cause (config and restore errors chain their context above it)."""
  lines = message_lines(e)
  return lines[-1] if lines else type(e).__name__
