"""Folders built once per test session and shared by its xdist workers: a trained run that tests
in several modules start from (each module runs on one worker, so a module fixture alone would
build it once per module)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], None]) -> Path:
  """`<session tmp>/<name>`, made by `build(path)` in whichever worker asks first; the others
  wait for it. Users copy it before changing anything (it is shared)."""
  base = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    base = base.parent  # the session's folder (each worker's basetemp is a child of it)
  path = base / name
  done = base / f"{name}.done"
  with FileLock(str(base / f"{name}.lock")):
    if not done.exists():
      shutil.rmtree(path, ignore_errors=True)  # a build that failed in another worker
      build(path)
      done.touch()
  return path
