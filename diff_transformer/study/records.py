"""Run records: one small JSON per finished run under <results>/records/ (grid runs under
records/lr_grid/), holding the run's setting (its resolved config), curve, evaluation summary and
wall time. study.json and report.md are built from these alone, so committing them lets a study
continue on another machine without retraining its finished runs.

A record is reused only for the very setting a point would train with now
(run_record.setting); a record under another setting is never taken for the point, and is kept
aside (records/<point>.json.replaced-<time>) when the point's new run records.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import ml_collections

from diff_transformer.training.run_record import differences, setting

RECORDS = "records"
GRID = "lr_grid"


def path(results: Path, point: str, grid: bool = False) -> Path:
  return Path(results) / RECORDS / (GRID if grid else "") / f"{point}.json"


def write(results: Path, point: str, record: dict, config: ml_collections.ConfigDict,
          grid: bool = False) -> dict:
  """Writes the record (atomically) with the setting it was trained under; returns it."""
  record = dict(point=point, **record, setting=setting(config))
  target = path(results, point, grid)
  target.parent.mkdir(parents=True, exist_ok=True)
  old = _load(target)
  if old is not None and differences(record["setting"], old.get("setting", {})):
    os.replace(target, target.with_name(f"{target.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"))
  tmp = target.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
  os.replace(tmp, target)
  return record


def read(results: Path, point: str, config: ml_collections.ConfigDict, grid: bool = False
         ) -> dict | None:
  """The point's record if there is one for exactly this setting, else None."""
  record = _load(path(results, point, grid))
  if record is None or differences(setting(config), record.get("setting", {})):
    return None
  return record


def _load(target: Path) -> dict | None:
  if not target.is_file():
    return None
  try:
    return json.loads(target.read_text())
  except json.JSONDecodeError:
    return None  # a damaged record is retrained, never trusted
