"""Restore a run, run the chosen suites, write each suite's result into the run folder
(runs/folder.py eval_result), plots and report.md."""
from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np

from diff_transformer.data import heldout_documents, open_dataset, synthetic, validation_batches
from diff_transformer.evaluation import (attention, common, generate, icl, long_context, loss,
                                         needle, outliers, quantization, report, tasks)
from diff_transformer.evaluation.common import SUITES, TASK_SUITES, Settings
from diff_transformer.errors import DataError, EvalError, TrainError, last_line
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.restore import restore_model
from diff_transformer.runs.record import check_tokenizer_record


def parse_suites(text: str, task: bool | None = False) -> list[str]:
  """The suites named in `text` ("all": every suite that applies; a synthetic-task run has no
  text, so it takes TASK_SUITES, a text run everything but `task`). task=None checks only that
  the names exist (before the run is restored)."""
  names = [s.strip() for s in text.split(",") if s.strip()]
  unknown = [s for s in names if s not in SUITES + ("all",)]
  if unknown:
    raise EvalError(f"--suites: unknown suite '{unknown[0]}'; choose from {', '.join(SUITES)}")
  if task is None:
    return names
  allowed = TASK_SUITES if task else tuple(s for s in SUITES if s != "task")
  if not names or names == ["all"]:
    return list(allowed)
  wrong = [s for s in names if s not in allowed]
  if wrong:
    kind = "a synthetic-task run" if task else "a text run"
    raise EvalError(f"--suites: '{wrong[0]}' does not apply to {kind}; choose from "
                    f"{', '.join(allowed)}")
  return names


class Run:
  """A restored checkpoint plus its data, loaded lazily (a suite reads only what it needs)."""

  def __init__(self, workdir: str | Path, step: int | None = None, mesh=None,
               settings: Settings | None = None):
    self.workdir = Path(workdir)
    self.settings = settings or Settings()
    try:
      self.model, self.config, self.step = restore_model(self.workdir, step=step, mesh=mesh)
    except (TrainError, DataError, OSError, ValueError) as e:
      raise EvalError(last_line(e)) from e
    self.out_dir = RunFolder(self.workdir).eval_dir
    self.context = common.check_context(
        self.model, self.settings.context_len or self.model.spec.max_seq_len, "--context_len")

  @functools.cached_property
  def fns(self) -> common.Fns:
    return common.Fns(self.model)

  @property
  def is_task(self) -> bool:
    return self.config.data.name in synthetic.TASKS

  @functools.cached_property
  def task(self) -> synthetic.TaskSpec:
    """The synthetic task the run trained on (data.task with the trained seq_len)."""
    try:
      return synthetic.task_spec(self.config.data)
    except ValueError as e:
      raise EvalError(last_line(e)) from e

  def forward(self, tokens_BT, *, maps: bool = False):
    """float32 logits [B, T, V] of the restored model; with maps=True also the per-layer
    analysis tensors (hidden states, attention inputs, A1/A2/lambda maps; leading L axis)."""
    return self.fns.capture(tokens_BT) if maps else self.fns.logits(tokens_BT)

  @functools.cached_property
  def dataset(self):
    try:
      # A task's rows keep their trained length (the task suite varies it per slice).
      ds = open_dataset(self.config.data, seq_len=None if self.is_task else self.context)
      check_tokenizer_record(self.workdir, ds.tokenizer)
    except (DataError, OSError, RuntimeError) as e:
      raise EvalError(last_line(e)) from e
    return ds

  @property
  def tokenizer(self):
    return self.dataset.tokenizer

  @functools.cached_property
  def heldout_texts(self) -> list[str]:
    return heldout_documents(self.dataset)

  def val_batches(self, count: int) -> list[dict]:
    return list(validation_batches(self.dataset, self.config.data, self.settings.batch_size,
                                   count or None))

  def train_tokens(self) -> np.ndarray:
    """The training split's token stream, shard after shard (documents framed by eot)."""
    ds = self.dataset
    return np.concatenate([np.asarray(ds.shard_tokens("train", k))
                           for k in range(len(ds.shards("train")))])

  def documents(self) -> list[tuple[str, str]]:
    names = self.dataset.metadata["splits"]["val"]["document_names"]
    return list(zip(names, self.heldout_texts))


def run_suite(run: Run, name: str) -> dict:
  s, out = run.settings, run.out_dir
  if name == "task":
    return tasks.run_task(run.fns, run.task, s, out)
  if name == "attention" and run.is_task:
    return tasks.run_attention(run.fns, run.task, s, out)
  if name == "loss":
    return loss.run(run.fns, run.val_batches(s.val_batches), s, out,
                    None if run.is_task else run.train_tokens(), run.dataset.vocab_size)
  if name == "long_context":
    return long_context.run(run.fns, run.dataset.document_tokens("val"), run.dataset.eot_id, s,
                            out)
  if name == "needle":
    return needle.run(run.fns, run.tokenizer, run.heldout_texts, s, out)
  if name == "attention":
    return attention.run(run.fns, run.tokenizer, run.heldout_texts, s, out)
  if name == "outliers":
    return outliers.run(run.fns, run.val_batches(1)[0], s, out)
  if name == "quantization":
    return quantization.run(run.model, run.val_batches(s.quant_val_batches), run.tokenizer,
                            run.heldout_texts, s, out)
  if name == "icl":
    return icl.run(run.fns, run.tokenizer, run.documents(), s, out)
  if name == "generate":
    return generate.run(run.fns, run.tokenizer, run.heldout_texts, s, out)
  raise EvalError(f"unknown suite '{name}'")


def evaluate(workdir: str | Path, suites: list[str], *, step: int | None = None, mesh=None,
             settings: Settings | None = None) -> dict[str, dict]:
  """Runs the suites on a run's checkpoint; returns {suite: result} and writes the files."""
  run = Run(workdir, step, mesh, settings)
  suites = parse_suites(",".join(suites), task=run.is_task)
  spec = run.model.spec
  print(f"Evaluating {run.workdir} at step {run.step}: {spec.variant}, D={spec.d_model}, "
        f"L={spec.num_layers}, max_seq_len={spec.max_seq_len}"
        f"{' (quick)' if run.settings.quick else ''}", flush=True)
  results = {}
  for name in suites:
    start = time.perf_counter()
    print(f"[{name}]", flush=True)
    result = run_suite(run, name)
    result = dict(suite=name, run=str(run.workdir), step=run.step, variant=spec.variant,
                  quick=run.settings.quick, seconds=round(time.perf_counter() - start, 2),
                  **result)
    path = common.write_json(run.out_dir, name, result)
    print(f"[{name}] {report.headline(name, result)}  -> {path} ({result['seconds']:.0f}s)",
          flush=True)
    results[name] = result
  report.write_report(run.out_dir)
  return results

