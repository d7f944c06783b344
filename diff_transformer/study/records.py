"""Run records: one small JSON per finished run under <results>/records/ (grid runs under
records/lr_grid/), holding the run's setting (its resolved config), curve, evaluation summary and
wall time. study.json and report.md are built from these alone, so committing them lets a study
continue on another machine without retraining its finished runs.

A record is reused only for the very setting a point would train with now
(run_record.setting); a record under another setting is never taken for the point, and is kept
aside (records/<point>.json.replaced-<time>) when the point's new run records. A damaged record
(not UTF-8 JSON, not an object, or without the keys every record has) is never trusted: it is
named in one warning line, rebuilt from the point's workdir or retrained like a missing one, and
kept aside (records/<point>.json.damaged-<time>) when the new record is written.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable, Sequence

from diff_transformer.errors import UserError
from diff_transformer.files import read_json
from diff_transformer.paths import write_atomic
from diff_transformer.runs.record import differences, shown_differences

RECORDS = "records"
GRID = "lr_grid"
# Keys every record has ({grid: keys}): what the grid and the report read without checking.
REQUIRED = {True: ("point", "setting", "lr", "seed"),
            False: ("point", "setting", "variant", "seed")}


def folder(results: Path, grid: bool = False) -> Path:
  return Path(results) / RECORDS / (GRID if grid else "")


def path(results: Path, point: str, grid: bool = False) -> Path:
  return folder(results, grid) / f"{point}.json"


def write(results: Path, point: str, record: dict, setting: dict, grid: bool = False) -> dict:
  """Writes the record (atomically) with the setting it was trained under; returns it."""
  record = dict(point=point, **record, setting=setting)
  target = path(results, point, grid)
  target.parent.mkdir(parents=True, exist_ok=True)
  old = _load(target, grid, quiet=True)
  if target.is_file() and (old is None or differences(record["setting"], old["setting"])):
    kind = "damaged" if old is None else "replaced"
    os.replace(target, target.with_name(f"{target.name}.{kind}-{time.strftime('%Y%m%d-%H%M%S')}"))
  write_atomic(target, json.dumps(record, indent=None, separators=(",", ":")) + "\n")
  return record


def trained_since(results: Path, since: float) -> int:
  """How many finished runs (grid ones included; failures and records taken from another study
  not) were recorded at or after `since` (time.time()): what a stopped invocation trained, or
  found trained by a killed one."""
  found = [p for p in folder(results).rglob("*.json") if p.stat().st_mtime >= since]
  return sum(1 for p in found if (r := _load(p, p.parent.name == GRID, quiet=True))
             and not r.get("failed") and not r.get("reused_from"))


def read(results: Path, point: str, setting: dict, grid: bool = False) -> dict | None:
  """The point's record if there is one for exactly this setting (runs.record.setting of the
  config the point would train with), else None."""
  record = _load(path(results, point, grid), grid)
  if record is None or differences(setting, record["setting"]):
    return None
  return record


def pool(folders: Sequence[str | Path], grid: bool) -> list[dict]:
  """Every readable record of one kind in other studies' results folders, each marked with where
  it came from (`reused_from`: the folder's name and its point)."""
  return [dict(r, reused_from=f"{Path(other).name}/{r['point']}") for other in folders
          for target in sorted(folder(Path(other), grid).glob("*.json"))
          if (r := _load(target, grid, quiet=True)) is not None]


def same_setting(records: list[dict], setting: dict, accepts: Callable[[dict], bool]
                 ) -> dict | None:
  """The first record trained under exactly `setting` that `accepts` takes, else None."""
  return next((r for r in records if accepts(r) and not differences(setting, r["setting"])),
              None)


def not_reused(results: Path, point: str, setting: dict, grid: bool = False) -> str:
  """Why the point's record is not taken for `setting` ('' when there is none, or it matches):
  the keys whose values differ, a key the record holds and today's settings lack included."""
  target = path(results, point, grid)
  record = _load(target, grid, quiet=True)
  diff = differences(setting, record["setting"]) if record is not None else []
  return f"{target} was trained under another setting ({shown_differences(diff)})" if diff else ""


def _load(target: Path, grid: bool, quiet: bool = False) -> dict | None:
  """The record, or None when there is none or it is damaged (named in one line unless quiet)."""
  if not target.is_file():
    return None
  try:
    record = read_json(target, UserError)  # depth and integer guards: a damage like any other
  except UserError as e:
    why = str(e).removeprefix(f"{target}: ")
  else:
    missing = [] if not isinstance(record, dict) else [
        k for k in REQUIRED[grid] if k not in record]
    if isinstance(record, dict) and not missing and isinstance(record["setting"], dict):
      return record
    why = (f"a JSON {type(record).__name__}, not a record" if not isinstance(record, dict) else
           f"missing {', '.join(missing) or 'a setting object'}")
  if not quiet:
    print(f"warning: {target}: damaged record ({why}); it is rebuilt from its workdir or "
          "retrained, and kept aside when the new one is written", flush=True)
  return None
