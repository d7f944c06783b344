"""Small shared pieces of the data layer: the one-line error, the cache root, atomic publishing."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from diff_transformer.errors import DataError

ENV_CACHE = "DIFF_TRANSFORMER_CACHE"
# Temp dirs older than this are leftovers of killed runs (a live fetch/prepare takes minutes).
_STALE_SECONDS = 6 * 3600


def cache_root(cache_dir: str = "") -> Path:
  """config.data.cache_dir, else $DIFF_TRANSFORMER_CACHE, else ~/.cache/diff_transformer."""
  root = cache_dir or os.environ.get(ENV_CACHE, "") or "~/.cache/diff_transformer"
  return Path(root).expanduser().resolve()


def _remove_stale_temps(parent: Path, name: str) -> None:
  for leftover in parent.glob(f".{name}.tmp-*"):
    with contextlib.suppress(OSError):
      if time.time() - leftover.stat().st_mtime > _STALE_SECONDS:
        shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final: Path, replace: bool = False) -> Iterator[Path]:
  """Yields a temp dir beside `final`, renamed to `final` only if the block succeeds.

  Readers therefore see either nothing or a complete directory. If a concurrent run published
  `final` first, ours is discarded (both wrote the same content, deterministic by design);
  with `replace`, an existing `final` is swapped out only once the new one is complete.
  """
  final.parent.mkdir(parents=True, exist_ok=True)
  _remove_stale_temps(final.parent, final.name)
  tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide a shared cache from other users
  try:
    yield tmp
    if replace and final.exists():
      old = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-old-", dir=final.parent))
      os.rename(final, old / "old")
      os.rename(tmp, final)
      shutil.rmtree(old, ignore_errors=True)
      return
    try:
      os.rename(tmp, final)
    except OSError:
      if not final.is_dir():
        raise
      shutil.rmtree(tmp, ignore_errors=True)  # lost the race; the winner's copy is complete
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def read_utf8(path: Path) -> str:
  try:
    return path.read_bytes().decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not valid UTF-8 text (byte {e.start})") from e


def jsonl_records(path: Path) -> Iterator[tuple[int, object]]:
  """(line number, parsed record) of each non-blank line; bad UTF-8 or JSON is one DataError
  line."""
  for lineno, line in enumerate(read_utf8(path).splitlines(), 1):
    if not line.strip():
      continue
    try:
      yield lineno, json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
