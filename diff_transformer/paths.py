"""Output paths every program checks before any work (an impossible or unwritable one is one
line naming the flag): a directory it writes into, or a path it creates."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from diff_transformer.errors import UserError


def write_atomic(path: str | Path, text: str) -> Path:
  """Writes `path` through a temp file and a rename: a kill or a full disk mid-write leaves the
  old file (or none), never half of the new one. A write the file system refuses (full, read
  only) is one UserError naming the file; its temp file is removed."""
  path = Path(path)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  try:
    tmp.write_text(text)
    os.replace(tmp, path)
  except BaseException as e:
    tmp.unlink(missing_ok=True)
    if isinstance(e, OSError):
      raise UserError(f"{path}: could not be written ({e.strerror or e}); the previous version, if "
                      "any, is unchanged") from None
    raise
  return path


def output_dir(path: str | Path, flag: str, error: type[UserError] = UserError) -> Path:
  """The directory a program writes to, created and probed before any work: an impossible or
  unwritable path is one `error` naming the flag, the path and the reason."""
  path = Path(path).expanduser()
  if path.exists() and not path.is_dir():
    raise error(f"{flag} {path}: is a file, not a directory")
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as e:
    raise error(f"{flag} {path}: cannot write there ({e.strerror})") from None
  return path


def creatable(path: str | Path, flag: str) -> Path:
  """A path a program will create (its own atomic publish): an existing directory must be
  writable; otherwise its nearest existing ancestor must be a directory that takes a new entry.
  Probed before any work; a refusal is one UserError naming the flag, the path and the reason."""
  path = Path(path).expanduser()
  if path.is_dir():
    return output_dir(path, flag)
  if path.exists():
    raise UserError(f"{flag} {path}: is a file, not a directory")
  parent = next(p for p in path.absolute().parents if p.exists())
  if not parent.is_dir():
    raise UserError(f"{flag} {path}: {parent} is a file, not a directory")
  try:
    os.rmdir(tempfile.mkdtemp(dir=parent))
  except OSError as e:
    raise UserError(f"{flag} {path}: cannot create it ({e.strerror})") from None
  return path
