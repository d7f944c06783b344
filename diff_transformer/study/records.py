"""Run records: one small JSON per finished run under <results>/records/ (grid runs under
records/lr_grid/), holding the run's setting (its resolved config), curve, evaluation summary and
wall time. study.json and report.md are built from these alone, so committing them lets a study
continue on another machine without retraining its finished runs.

A record is reused only for the very setting a point would train with now; a record, or a
workdir, under another setting is never taken for the point (a workdir under another setting is
refused in one line, naming the keys that differ).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import ml_collections

from diff_transformer.sweeps.definition import SweepError
from diff_transformer.training.run_record import read_config
from diff_transformer.tree import flatten

RECORDS = "records"
GRID = "lr_grid"
# Keys that do not change what a run computes: where it logs, how often it saves, labels.
IGNORED = ("source", "train.log_every", "train.checkpoint_every", "train.max_to_keep",
           "train.peak_tflops", "data.cache_dir")


def setting(config: ml_collections.ConfigDict) -> dict:
  """The config's flat fields that change training (JSON values, as config.json holds them)."""
  flat = flatten(json.loads(config.to_json_best_effort()))
  if flat.get("model.vocab_multiple"):  # train.py fills vocab_size in from the tokenizer
    flat.pop("model.vocab_size", None)
  return {k: v for k, v in flat.items() if k not in IGNORED}


def differences(expected: dict, recorded: dict) -> list[tuple[str, object, object]]:
  """(key, recorded value, expected value) for every key that differs, in key order."""
  keys = sorted(expected.keys() | recorded.keys())
  return [(k, recorded.get(k), expected.get(k)) for k in keys if recorded.get(k) != expected.get(k)]


def path(results: Path, point: str, grid: bool = False) -> Path:
  return Path(results) / RECORDS / (GRID if grid else "") / f"{point}.json"


def write(results: Path, point: str, record: dict, config: ml_collections.ConfigDict,
          grid: bool = False) -> dict:
  """Writes the record (atomically) with the setting it was trained under; returns it."""
  record = dict(point=point, **record, setting=setting(config))
  target = path(results, point, grid)
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = target.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
  os.replace(tmp, target)
  return record


def read(results: Path, point: str, config: ml_collections.ConfigDict, grid: bool = False
         ) -> dict | None:
  """The point's record if there is one for exactly this setting, else None."""
  target = path(results, point, grid)
  if not target.is_file():
    return None
  try:
    record = json.loads(target.read_text())
  except json.JSONDecodeError:
    return None  # a damaged record is retrained, never trusted
  return record if not differences(setting(config), record.get("setting", {})) else None


def check_workdir(workdir: Path, point: str, config: ml_collections.ConfigDict) -> None:
  """A run started under another setting (the study file, an override or the grid's choice
  changed since) would be skipped or resumed as if it were this point: one line instead."""
  trained = read_config(workdir)
  if trained is None:
    return
  diff = differences(setting(config), setting(trained))
  if diff:
    shown = "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in diff[:3])
    more = f" (+{len(diff) - 3} more)" if len(diff) > 3 else ""
    raise SweepError(f"study point {point}: {workdir} was trained under another setting "
                     f"({shown}{more}); move that run away or use another --root or --name")
