"""The run record of a workdir: its config and its tokenizer, written at start and checked on resume
and by every program that reads the run (eval, export, lm-eval, studies).

  config.json               the run's full config (a resume must keep its model section)
  tokenizer_record.json     name, vocab size, eot id and sha256 of the tokenizer the run uses,
                            and vocab_padding (model rows beyond its ids)
  tokenizer.json            a copy of the tokenizer file (bpe and file runs; tiktoken runs keep
                            tokenizer.tiktoken + tiktoken.json)
  code_version.json         the code that trained it (provenance.py): one entry per code
                            version, each with the step it started or resumed at
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import time
from pathlib import Path

import jax
import ml_collections

from diff_transformer import provenance
from diff_transformer.runs import folder as run_folder
from diff_transformer.config import base_config, validate
from diff_transformer.data import assert_compatible, describe
from diff_transformer.data.tokenizer import load_tokenizer
from diff_transformer.errors import ConfigError, DataError, TrainError, last_line
from diff_transformer.files import read_json
from diff_transformer.model.attention import VARIANTS, known_variant, nested
from diff_transformer.tree import flatten


def write_run_record(workdir: Path, config: ml_collections.ConfigDict, dataset) -> None:
  """Writes config.json and the tokenizer record (process 0 only)."""
  if jax.process_index() != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / run_folder.CONFIG).write_text(config.to_json_best_effort(indent=2) + "\n")
  record = describe(dataset.tokenizer)
  # Embedding rows beyond the tokenizer's ids (a preset's vocab rounded up, e.g. to 128): never
  # produced by the data, recorded so an export or a reader knows which ids are real.
  record["vocab_padding"] = int(config.model.vocab_size) - record["vocab_size"]
  (workdir / run_folder.TOKENIZER_RECORD).write_text(json.dumps(record, indent=2) + "\n")
  # whichever the data's tokenizer keeps (bpe, file, tiktoken)
  for name in run_folder.TOKENIZER_COPIES:
    source = Path(dataset.path) / name
    if record["name"] != "byte" and source.is_file():
      shutil.copyfile(source, workdir / name)


# Keys that do not change what a run computes: where it logs, how often it saves, labels.
IGNORED = ("source", "train.log_every", "train.checkpoint_every", "train.max_to_keep",
           "train.peak_tflops", "data.cache_dir")


def setting(config: ml_collections.ConfigDict) -> dict:
  """The config's flat fields that change training (JSON values, as config.json holds them;
  of the variants' own sections, its variant's alone)."""
  flat = nested(flatten(json.loads(config.to_json_best_effort())))
  if flat.get("model.vocab_multiple"):  # train.py fills vocab_size in from the tokenizer
    flat.pop("model.vocab_size", None)
  return {k: v for k, v in flat.items() if k not in IGNORED}


def defaults() -> dict:
  """Today's default of every setting key (base_config) with the variants registered now: a
  variant registered later (a `module:Class` run) adds its own keys at their defaults."""
  return _defaults(tuple(VARIANTS.items()))


@functools.cache
def _defaults(registered: tuple) -> dict:
  del registered  # the cache key: base_config() reads the registry
  return flatten(json.loads(base_config().to_json_best_effort()))


def departures(flat: dict) -> dict:
  """The keys of a setting whose values differ from today's defaults. Settings are compared this
  way, so an option added later with its default is invisible to records made before it existed,
  while a changed default, or a record naming a changed key, still shows as a difference. Keys
  are read in today's names (model/attention `nested`: a record's flat variant options)."""
  base = defaults()
  return {k: v for k, v in nested(flat).items() if k not in base or base[k] != v}


def differences(expected: dict, recorded: dict) -> list[tuple[str, object, object]]:
  """(key, recorded value, expected value) for every key whose value differs once today's
  defaults are removed from both sides (a key missing on one side holds its default there)."""
  expected, recorded, base = departures(expected), departures(recorded), defaults()
  pairs = ((k, recorded.get(k, base.get(k)), expected.get(k, base.get(k)))
           for k in sorted(expected.keys() | recorded.keys()))
  return [(k, was, now) for k, was, now in pairs if was != now]


def shown_differences(diff: list[tuple[str, object, object]], most: int = 3) -> str:
  """'key recorded -> now; ...' for the first `most` differences (a key a side lacks: None)."""
  more = f" (+{len(diff) - most} more)" if len(diff) > most else ""
  return "; ".join(f"{k} {a!r} -> {b!r}" for k, a, b in diff[:most]) + more


def check_setting(workdir: Path, point: str, expected: dict, retrain: bool = False) -> None:
  """A run started under another setting than `expected` (the point's setting(); a study file,
  an override or a grid's choice changed since) would be skipped or resumed as if it were this
  point: refused in one line naming the keys that differ, or with `retrain` moved aside
  (<workdir>.setting-<time>, never deleted) so the point trains anew."""
  trained = read_config(workdir)
  if trained is None:
    return
  diff = differences(expected, setting(trained))
  if not diff:
    return
  if retrain:
    aside = workdir.with_name(f"{workdir.name}.setting-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(workdir, aside)
    print(f"{point}: trained under another setting; moved to {aside}; training it anew",
          flush=True)
    return
  raise TrainError(f"point {point}: {workdir} was trained under another setting "
                   f"({shown_differences(diff)}); "
                   "use another --root or --name, or --retrain_changed to train it anew (the old "
                   "run is kept aside)")


def read_code_versions(workdir: Path) -> list[dict]:
  path = Path(workdir) / run_folder.CODE_VERSION
  return read_json(path, TrainError, "code versions") if path.is_file() else []


def record_code_version(workdir: Path, step: int) -> dict | None:
  """Appends this code's version to code_version.json when it differs from the last entry (a new
  run, or a resume under other code); returns the previous entry when a resume changed it."""
  if jax.process_index() != 0:
    return None
  versions, now = read_code_versions(workdir), provenance.code_version()
  if versions and provenance.same_code(versions[-1], now):
    return None
  record = versions + [dict(step=step, **now)]
  (Path(workdir) / run_folder.CODE_VERSION).write_text(json.dumps(record, indent=1) + "\n")
  return versions[-1] if versions else None


def read_config(workdir: Path) -> ml_collections.ConfigDict | None:
  path = Path(workdir) / run_folder.CONFIG
  if not path.is_file():
    return None
  values = read_json(path, TrainError, "run config")
  variant = values.get("model", {}).get("variant")
  if isinstance(variant, str):
    known_variant(variant)  # a module:Class is imported, so its own options are model keys
  config = base_config()
  try:
    config.update_from_flattened_dict(nested(flatten(values)))
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    raise TrainError(f"{path}: damaged or from another version ({last_line(e)})") from None
  try:
    return validate(config)  # the values a command line would be refused, refused here too
  except ConfigError as e:
    raise TrainError(f"{path}: {e}") from None


def check_run_record(workdir: Path, config: ml_collections.ConfigDict, tokenizer
                     ) -> tuple[int, int] | None:
  """A resumed run must use the recorded tokenizer and the same model shape. Returns (recorded,
  new) train.global_batch_size when the resume changes it (allowed, and said), else None."""
  if (workdir / run_folder.TOKENIZER_RECORD).is_file():
    check_tokenizer_record(workdir, tokenizer)
  recorded = read_config(workdir)
  if recorded is None:
    return None
  old, new = flatten(recorded.model.to_dict()), flatten(config.model.to_dict())
  for key in sorted(new):
    if old.get(key) != new[key]:
      raise TrainError(f"model.{key}: {workdir} holds a run with {old.get(key)!r}, this config "
                       f"has {new[key]!r}; use another --workdir or the recorded config")
  if recorded.train.global_batch_size == config.train.global_batch_size:
    return None
  return int(recorded.train.global_batch_size), int(config.train.global_batch_size)


def check_tokenizer_record(workdir: Path, tokenizer=None) -> dict:
  """The recorded tokenizer, checked against `tokenizer` or against the workdir's own copy."""
  path = Path(workdir) / run_folder.TOKENIZER_RECORD
  if not path.is_file():
    raise TrainError(f"{path}: missing; {workdir} is not a training workdir")
  record = read_json(path, TrainError, "tokenizer record")
  if tokenizer is not None:
    assert_compatible(record, tokenizer)
  elif record.get("name") == "byte" or any((Path(workdir) / n).is_file()
                                           for n in run_folder.TOKENIZER_COPIES[:2]):
    load_tokenizer(record, workdir)  # raises DataError if the copy's checksum differs
  # A task's layout is checked with its data; file tokenizers against the data's own copy.
  elif record.get("name") not in ("bpe", "file", "tiktoken", "synthetic"):
    raise DataError(f"{path}: unknown tokenizer {record.get('name')!r}")
  return record
