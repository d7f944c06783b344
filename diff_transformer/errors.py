"""Exceptions as the one line a user sees (library and XLA errors span many lines)."""
from __future__ import annotations


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
