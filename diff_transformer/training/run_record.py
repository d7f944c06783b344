"""The run record of a workdir: its config and its tokenizer, written at start and checked on resume
and by every program that reads the run (eval, export, lm-eval, studies).

  config.json               the run's full config (a resume must keep its model section)
  tokenizer_record.json     name, vocab size, eot id and sha256 of the tokenizer the run uses,
                            and vocab_padding (model rows beyond its ids)
  tokenizer.json            a copy of the tokenizer file (bpe and file runs; tiktoken runs keep
                            tokenizer.tiktoken + tiktoken.json)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import ml_collections

from diff_transformer.config import base_config
from diff_transformer.data import assert_compatible, describe
from diff_transformer.data.tokenizer import load_tokenizer
from diff_transformer.errors import DataError, TrainError, last_line, read_json
from diff_transformer.tree import flatten

CONFIG_FILE = "config.json"
TOKENIZER_RECORD = "tokenizer_record.json"
TOKENIZER_COPY = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER_COPY, "tokenizer.tiktoken", "tiktoken.json")  # copied into the run


def write_run_record(workdir: Path, config: ml_collections.ConfigDict, dataset) -> None:
  """Writes config.json and the tokenizer record (process 0 only)."""
  if jax.process_index() != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / CONFIG_FILE).write_text(config.to_json_best_effort(indent=2) + "\n")
  record = describe(dataset.tokenizer)
  # Embedding rows beyond the tokenizer's ids (a preset's vocab rounded up, e.g. to 128): never
  # produced by the data, recorded so an export or a reader knows which ids are real.
  record["vocab_padding"] = int(config.model.vocab_size) - record["vocab_size"]
  (workdir / TOKENIZER_RECORD).write_text(json.dumps(record, indent=2) + "\n")
  for name in TOKENIZER_FILES:  # whichever the data's tokenizer keeps (bpe, file, tiktoken)
    source = Path(dataset.path) / name
    if record["name"] != "byte" and source.is_file():
      shutil.copyfile(source, workdir / name)


def read_config(workdir: Path) -> ml_collections.ConfigDict | None:
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    return None
  config = base_config()
  values = read_json(path, TrainError)
  if not isinstance(values, dict):
    raise TrainError(f"{path}: damaged (not a JSON object of config fields)")
  try:
    config.update_from_flattened_dict(flatten(values))
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    raise TrainError(f"{path}: damaged or from another version ({last_line(e)})") from None
  return config


def check_run_record(workdir: Path, config: ml_collections.ConfigDict, tokenizer
                     ) -> tuple[int, int] | None:
  """A resumed run must use the recorded tokenizer and the same model shape. Returns (recorded,
  new) train.global_batch_size when the resume changes it (allowed, and said), else None."""
  if (workdir / TOKENIZER_RECORD).is_file():
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
  path = Path(workdir) / TOKENIZER_RECORD
  if not path.is_file():
    raise TrainError(f"{path}: missing; {workdir} is not a training workdir")
  record = read_json(path, TrainError)
  if tokenizer is not None:
    assert_compatible(record, tokenizer)
  elif record.get("name") == "byte" or any((Path(workdir) / n).is_file()
                                           for n in TOKENIZER_FILES[:2]):
    load_tokenizer(record, workdir)  # raises DataError if the copy's checksum differs
  # A task's layout is checked with its data; file tokenizers against the data's own copy.
  elif record.get("name") not in ("bpe", "file", "tiktoken", "synthetic"):
    raise DataError(f"{path}: unknown tokenizer {record.get('name')!r}")
  return record
