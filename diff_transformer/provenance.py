"""What code made a run: the project's version, the git commit and whether the checkout had
uncommitted changes (when run from a checkout), and the versions of the libraries that decide
its numbers. Runs record it in code_version.json (runs/record.py); studies list it."""
from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain")
CHECKOUT = Path(__file__).resolve().parents[1]


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def _git(checkout: Path, *args: str) -> str | None:
  try:
    out = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                         timeout=20)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


# Files that are code a run may import or run: the package, the configs, the programs. A change
# elsewhere (a study's records or docs written into the checkout) changes no run's numbers.
CODE_PATHS = (":(glob)diff_transformer/**/*.py", ":(glob)configs/**/*.py", ":(glob)*.py")


@functools.cache
def code_version(checkout: Path = CHECKOUT) -> dict:
  """{project, commit, dirty, untracked, libraries}; commit and dirty are None outside a git
  checkout (an installed wheel). Changes to tracked code make the checkout dirty, and so do
  untracked .py files under the package, the configs or beside the programs (listed)."""
  commit = _git(checkout, "rev-parse", "HEAD") if (checkout / ".git").exists() else None
  dirty, untracked = None, []
  if commit:
    status = _git(checkout, "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS)
    others = _git(checkout, "ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS)
    untracked = sorted(others.splitlines()) if others else []
    dirty = None if status is None else bool(status) or bool(untracked)
  return dict(project=_version("diff-transformer"), commit=commit, dirty=dirty,
              untracked=untracked, libraries={name: _version(name) for name in LIBRARIES})


def same_code(a: dict, b: dict) -> bool:
  keys = ("project", "commit", "dirty", "libraries")
  return (all(a.get(k) == b.get(k) for k in keys)
          and (a.get("untracked") or []) == (b.get("untracked") or []))  # older records: none


def label(version: dict | None) -> str:
  """A short name: the commit (+uncommitted) or the project version, and jax's version."""
  if not version:
    return "not recorded"
  code = (version["commit"][:10] + ("+uncommitted" if version.get("dirty") else "")
          if version.get("commit") else f"diff-transformer {version.get('project')} (no checkout)")
  return f"{code}, jax {version.get('libraries', {}).get('jax')}"
