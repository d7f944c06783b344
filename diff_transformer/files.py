"""The one checked way a program reads a file from disk: JSON of an expected shape, UTF-8 text,
safetensors weights.

A damaged file (cut short, random bytes, not UTF-8, JSON of the wrong type, a key missing or of
the wrong type, a safetensors header that does not cover its data) raises the caller's
`UserError` class in one line naming the file and what is wrong with it. Readers only read, so
nothing already saved is touched, and programs read their inputs before any work starts.

`file_kinds.KINDS` names every JSON file a program reads, with the type and range of each field
its readers use; the damage test (tests/test_damaged_files.py) damages each kind in every way and
reads it as the program that reads it does, so a kind added there cannot be missed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diff_transformer.errors import UserError, first_line
from diff_transformer.file_kinds import KINDS, kind_of, problem


def read_text(path: str | Path, error: type[UserError] = UserError) -> str:
  """A UTF-8 text file's content."""
  try:
    data = Path(path).read_bytes()
  except OSError as e:
    raise error(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise error(f"{path}: not UTF-8 text (byte {e.start})") from None


def read_json(path: str | Path, error: type[UserError] = UserError, kind: str = "") -> Any:
  """A JSON file's content, checked against KINDS[kind] when a kind is named."""
  text = read_text(path, error)
  try:
    value = _loads(text)
  except ValueError as e:
    raise error(f"{path}: damaged JSON ({e})") from None
  if kind:
    why = problem(value, KINDS[kind])
    if why:
      raise error(f"{path}: {why}")
  return value


def _loads(text: str) -> Any:
  """json.loads, with what the parser itself cannot hold (nesting too deep for its recursion, an
  integer longer than Python converts) a ValueError of one line like any damage."""
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
  except RecursionError:
    raise ValueError("nested too deeply to read") from None
  except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
    raise ValueError(first_line(e, 160)) from None


def read_jsonl(path: str | Path, error: type[UserError] = UserError, kind: str = "") -> list[dict]:
  """The rows (JSON objects) of a JSON-lines log, each checked against KINDS[kind]'s row shape
  when a kind is named. A torn last line, what a writer killed mid-line leaves (no newline after
  it, and not a whole object), is skipped with one warning; damage on any other line is an
  `error` naming the file and the line."""
  shape = KINDS[kind].each if kind else None
  text = read_text(path, error)
  lines = text.split("\n")
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = _loads(line)
      why = "" if isinstance(row, dict) else f"{kind_of(row)}, not a JSON object"
    except ValueError as e:
      why = f"damaged JSON ({e})"
    if why and number == len(lines):  # the last line, without its newline: torn
      print(f"warning: {path}: line {number} was cut short (a writer stopped mid-line); "
            "skipped", flush=True)
      continue
    if not why and shape is not None:
      why = problem(row, shape)
    if why:
      raise error(f"{path}: line {number}: {why}")
    rows.append(row)
  return rows


def mend_jsonl_tail(path: str | Path) -> None:
  """Before appending to a JSON-lines log: a torn last line (see read_jsonl) is cut off, and a
  whole last row without its newline gets one, so the next row starts on a line of its own."""
  path = Path(path)
  if not path.is_file() or path.stat().st_size == 0:
    return
  data = path.read_bytes()
  if data.endswith(b"\n"):
    return
  start = data.rfind(b"\n") + 1
  try:
    whole = isinstance(_loads(data[start:].decode("utf-8")), dict)
  except (ValueError, UnicodeDecodeError):
    whole = False
  with open(path, "r+b") as f:
    if whole:
      f.seek(0, 2)
      f.write(b"\n")
    else:
      f.truncate(start)


def safetensors_names(path: str | Path, error: type[UserError] = UserError) -> list[str]:
  """The tensor names of a safetensors file, its header checked (cheap: the data is not read)."""
  return list(_safetensors(path, error, read=False))


def read_safetensors(path: str | Path, error: type[UserError] = UserError) -> dict:
  """Every tensor of a safetensors file as float32 numpy (bfloat16 included)."""
  return _safetensors(path, error, read=True)


def _safetensors(path: str | Path, error: type[UserError], read: bool) -> dict:
  import numpy as np
  from safetensors import SafetensorError, safe_open
  try:
    # framework="flax" reads bfloat16 too (numpy has no bfloat16); converted to float32 here.
    with safe_open(str(path), framework="flax") as f:
      return {name: np.asarray(f.get_tensor(name), np.float32) if read else None
              for name in f.keys()}
  except SafetensorError as e:
    raise error(f"{path}: damaged safetensors file ({first_line(e, 160)})") from None
  except OSError as e:
    raise error(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
