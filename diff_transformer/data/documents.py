"""Input documents for prepare.py: listing and reading .txt/.jsonl files, and the train/validation
split, chosen by content so it is the same for any file order."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from diff_transformer.data.common import DataError, jsonl_records, read_utf8

Documents = Callable[[], Iterable[tuple[str, str]]]  # re-iterable source of (name, text)


# ---------------------------------------------------------------------------- reading inputs
def list_input_files(inputs: Sequence[str | Path]) -> list[Path]:
  """Expands files and directories (recursively, sorted) into .txt/.jsonl files."""
  files: list[Path] = []
  if not inputs:
    raise DataError("no input given; pass --input FILE_OR_DIR (.txt or .jsonl)")
  for item in inputs:
    path = Path(item).expanduser()
    if not path.exists():
      raise DataError(f"{path}: no such file or directory")
    if path.is_dir():
      found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".txt", ".jsonl"))
      if not found:
        raise DataError(f"{path}: no .txt or .jsonl files inside")
      files.extend(found)
    elif path.suffix in (".txt", ".jsonl"):
      files.append(path)
    else:
      raise DataError(f"{path}: unsupported file type '{path.suffix}' (use .txt or .jsonl)")
  return files


def read_documents(files: Sequence[Path], text_field: str = "text") -> Iterator[tuple[str, str]]:
  """(name, text): a .txt file is one document; each .jsonl line's `text_field` is one."""
  for path in files:
    if path.suffix == ".txt":
      text = read_utf8(path)
      if not text.strip():
        raise DataError(f"{path}: empty file")
      yield str(path), text
      continue
    count = 0
    for lineno, record in jsonl_records(path):
      if not isinstance(record, dict) or text_field not in record:
        raise DataError(f"{path}:{lineno}: no '{text_field}' field")
      text = record[text_field]
      if not isinstance(text, str):
        raise DataError(f"{path}:{lineno}: field '{text_field}' is {type(text).__name__}, "
                        "not a string")
      if text.strip():  # an empty record is no document; the file as a whole must have some
        count += 1
        yield f"{path}:{lineno}", text
    if count == 0:
      raise DataError(f"{path}: no non-empty '{text_field}' field in any line")


# --------------------------------------------------------------------------------- the split
def plan_split(sizes: Sequence[int], hashes: Sequence[str], val_fraction: float) -> dict:
  """Chooses held-out text: whole documents when they fit the fraction, else each one's tail.

  Documents are ranked by the sha256 of their text, so the choice depends only on the content,
  not on file order or any seed. Greedy: take ranked documents no larger than twice the target
  until the target is reached. If that gives under half the target (few, large documents), the
  last `val_fraction` of every document (cut at a line break) is held out instead.
  """
  if not 0.0 < val_fraction < 1.0:
    raise DataError(f"data.val_fraction: must be in (0, 1), got {val_fraction}")
  total = sum(sizes)
  target = val_fraction * total
  val: list[int] = []
  got = 0
  for i in sorted(range(len(sizes)), key=lambda i: hashes[i]):
    if got >= target:
      break
    if sizes[i] <= 2 * target:
      val.append(i)
      got += sizes[i]
  if got >= target / 2 and len(val) < len(sizes):
    return dict(mode="by_document", val=sorted(val))
  return dict(mode="by_fraction", val=[])


def _cut(text: str, val_fraction: float) -> int:
  at = int(len(text) * (1.0 - val_fraction))
  line = text.rfind("\n", 0, at) + 1
  return line if line > 0 else at


def split_documents(documents: Documents, plan: dict,
                    val_fraction: float) -> Iterator[tuple[int, str, str, str]]:
  """(input index, split, name, text) in input order under `plan`."""
  val = set(plan["val"])
  for i, (name, text) in enumerate(documents()):
    if plan["mode"] == "by_document":
      yield i, ("val" if i in val else "train"), name, text
    else:
      cut = _cut(text, val_fraction)
      if text[:cut].strip():
        yield i, "train", name, text[:cut]
      if text[cut:].strip():
        yield i, "val", f"{name}[tail]", text[cut:]
