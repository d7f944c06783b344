"""The one checked way a program reads a file from disk: JSON of an expected shape, UTF-8 text,
safetensors weights.

A damaged file (cut short, random bytes, not UTF-8, JSON of the wrong type, a key missing or of
the wrong type, a safetensors header that does not cover its data) raises the caller's
`UserError` class in one line naming the file and what is wrong with it. Readers only read, so
nothing already saved is touched, and programs read their inputs before any work starts.

`KINDS` names every JSON file a program reads, with its shape; the damage test
(tests/test_damaged_files.py) damages each kind in every way and reads it as the program that
reads it does, so a kind added here cannot be missed there.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from diff_transformer.errors import UserError, first_line

_TYPE_NAMES = {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer",
               float: "a number", bool: "true or false"}


@dataclasses.dataclass(frozen=True)
class Shape:
  """What a JSON file must hold: `top` (object or list); an object's required `keys` and their
  types; `each`: the shape of every item of the list (the file itself, or its key `each_in`)."""
  top: type = dict
  keys: tuple[tuple[str, type], ...] = ()
  each: "Shape | None" = None
  each_in: str = ""


_OBJECT = Shape()
KINDS: dict[str, Shape] = {
    # a workdir's record (runs/record.py, runs/folder.py)
    "run config": Shape(dict, (("model", dict), ("data", dict), ("train", dict))),
    "tokenizer record": Shape(dict, (("name", str), ("vocab_size", int))),
    "code versions": Shape(list, each=Shape(dict, (("step", int),))),
    "run summary": Shape(dict, (("step", int),)),
    "eval result": _OBJECT,  # eval/<suite>.json
    # inputs of train.py and eval.py
    "prepared metadata": Shape(dict, (("format", int),)),
    "members file": Shape(dict, (("members", list),), each=Shape(dict, (("args", list),)),
                          each_in="members"),
    "HF config": _OBJECT,  # its fields are checked by interop/weights.py
    "HF index": Shape(dict, (("weight_map", dict),)),
    "tokenizer file": _OBJECT,
    "tiktoken record": Shape(dict, (("encoding", str),)),
    # a study's results
    "study results": Shape(dict, (("study", dict),)),
    # a measured matmul peak, cached per device (training/peak.py)
    "peak cache": Shape(dict, (("tflops", float),)),
}


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


def read_jsonl(path: str | Path, error: type[UserError] = UserError) -> list[dict]:
  """The rows (JSON objects) of a JSON-lines log. A torn last line, what a writer killed
  mid-line leaves (no newline after it, and not a whole object), is skipped with one warning;
  damage on any other line is an `error` naming the file and the line."""
  text = read_text(path, error)
  lines = text.split("\n")
  rows = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = _loads(line)
      why = "" if isinstance(row, dict) else f"{_kind_of(row)}, not a JSON object"
    except ValueError as e:
      why = f"damaged JSON ({e})"
    if why and number == len(lines):  # the last line, without its newline: torn
      print(f"warning: {path}: line {number} was cut short (a writer stopped mid-line); "
            "skipped", flush=True)
      continue
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


def problem(value: Any, shape: Shape, where: str = "") -> str:
  """What is wrong with `value` against `shape` ('' when nothing is)."""
  if not _is(value, shape.top):
    return f"{where or 'the file'} is {_kind_of(value)}, not {_TYPE_NAMES[shape.top]}"
  if shape.top is dict:
    for key, kind in shape.keys:
      if key not in value:
        return f"missing key '{where}{key}'"
      if not _is(value[key], kind):
        return f"key '{where}{key}' is {_kind_of(value[key])}, not {_TYPE_NAMES[kind]}"
  if shape.each is not None:
    items = value[shape.each_in] if shape.each_in else value
    prefix = f"{where}{shape.each_in}" if shape.each_in else where.rstrip(".")
    for i, item in enumerate(items):
      why = problem(item, shape.each, f"{prefix}[{i}].")
      if why:
        return why
  return ""


def _is(value: Any, kind: type) -> bool:
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if kind is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  return isinstance(value, kind)


def _kind_of(value: Any) -> str:
  for kind, name in _TYPE_NAMES.items():
    if _is(value, kind):
      return name
  return "null" if value is None else type(value).__name__


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
