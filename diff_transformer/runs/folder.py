"""The run folder (a training run's --workdir): the one module that spells its layout.

  config.json            the resolved config the run trains with (runs/record.py)
  code_version.json      the code that trained it (provenance.py)
  tokenizer_record.json  the tokenizer it uses, and copies of the tokenizer's files
  train.lock             flock-held while a process trains it (runs/lock.py)
  metrics.jsonl          one JSON row per logged step and per evaluation; tb/ TensorBoard events
  checkpoints/<step>/    orbax checkpoints; corrupt_checkpoints/ and diverged_checkpoints/ what
                         a resume set aside (unreadable) or a diverged run set aside;
                         ahead_checkpoints/ a population member's steps past the population's
                         newest common step (training/population_loop.py)
  summary.json           written (atomically) once the run reached its last step or its
                         accuracy level: a finished run, which sweeps and studies skip
  eval/<suite>.json      evaluation results (eval.py); eval/report.md
  sweep.log              the output of a driver's (sweep.py, study.py) child

Training, evaluation and the drivers reach these through `RunFolder` and the names below;
tests/test_imports.py checks that no other file spells a name of RUN_FILES. The tokenizer copies
keep the names the data package gives the tokenizer's own files.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from diff_transformer.errors import UserError
from diff_transformer.files import read_json, read_jsonl
from diff_transformer.paths import write_atomic

CONFIG = "config.json"
CODE_VERSION = "code_version.json"
TOKENIZER_RECORD = "tokenizer_record.json"
LOCK = "train.lock"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
CORRUPT_CHECKPOINTS = "corrupt_checkpoints"
DIVERGED_CHECKPOINTS = "diverged_checkpoints"
AHEAD_CHECKPOINTS = "ahead_checkpoints"
SUMMARY = "summary.json"
EVAL = "eval"
LOG = "sweep.log"
TENSORBOARD = "tb"
EVAL_REPORT = "report.md"  # inside eval/
TOKENIZER_COPIES = ("tokenizer.json", "tokenizer.tiktoken", "tiktoken.json")  # data's names
# The names only a run folder has (report.md and the tokenizer files have namesakes elsewhere).
RUN_FILES = (CONFIG, CODE_VERSION, TOKENIZER_RECORD, LOCK, METRICS, CHECKPOINTS,
             CORRUPT_CHECKPOINTS, DIVERGED_CHECKPOINTS, AHEAD_CHECKPOINTS, SUMMARY, EVAL, LOG,
             TENSORBOARD)


class RunFolder:
  """Paths into one run folder, and the records every package reads from it."""

  def __init__(self, workdir: str | os.PathLike):
    self.path = Path(workdir)

  def __repr__(self) -> str:
    return f"RunFolder({str(self.path)!r})"

  config = property(lambda self: self.path / CONFIG)
  code_version = property(lambda self: self.path / CODE_VERSION)
  lock = property(lambda self: self.path / LOCK)
  metrics = property(lambda self: self.path / METRICS)
  checkpoints = property(lambda self: self.path / CHECKPOINTS)
  corrupt_checkpoints = property(lambda self: self.path / CORRUPT_CHECKPOINTS)
  summary = property(lambda self: self.path / SUMMARY)
  eval_dir = property(lambda self: self.path / EVAL)
  log = property(lambda self: self.path / LOG)
  tensorboard = property(lambda self: self.path / TENSORBOARD)

  eval_report = property(lambda self: self.eval_dir / EVAL_REPORT)

  def eval_result(self, suite: str) -> Path:
    return self.eval_dir / f"{suite}.json"

  def read_summary(self, error: type[UserError] = UserError) -> dict | None:
    """The finished run's summary ({step, val_loss, ...}); None before the run finished."""
    return read_json(self.summary, error, "run summary") if self.summary.is_file() else None

  def write_summary(self, summary: dict) -> None:
    """Atomically: a kill leaves either no summary or the whole one."""
    write_atomic(self.summary, json.dumps(summary, indent=1))

  def metric_rows(self) -> list[dict]:
    """Every row of the metrics log, in order (empty before the first)."""
    if not self.metrics.is_file():
      return []
    # A torn last line (a writer killed mid-line) is skipped.
    return read_jsonl(self.metrics, kind="metrics log")

  def read_eval(self, suite: str) -> dict | None:
    """A suite's result, or None if it was never evaluated."""
    path = self.eval_result(suite)
    return read_json(path, UserError, "eval result") if path.is_file() else None

  def checkpoint_steps(self) -> list[int]:
    """The committed checkpoint steps (orbax renames a step's temp dir to <step> last)."""
    if not self.checkpoints.is_dir():
      return []
    return sorted(int(p.name) for p in self.checkpoints.iterdir() if p.name.isdigit())
