"""`train(config, workdir)`: data, mesh, sharded state, the step loop, checkpoints and logs.

Resumes from the newest readable checkpoint in `workdir` (same data order, same losses), saves
and exits on SIGTERM/SIGINT (a second Ctrl-C exits at once), stops on a non-finite or spiking
loss without saving it (training/guard.py), stops at the first step after a failed save, and holds
the workdir's lock (runs/lock.py) so no second run writes into it.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import jax
import ml_collections

from diff_transformer import data, provenance
from diff_transformer.errors import TrainError
from diff_transformer.model.attention import recorded_variant, variant_class
from diff_transformer.model.spec import ModelSpec
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs import record as run_record
from diff_transformer.training import validation
from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.training.guard import DivergenceGuard
from diff_transformer.mesh import check_parallelism, global_batch, make_mesh
from diff_transformer.training.metrics import (MetricsLogger, RateWindow,
                                               executed_flops_per_token, log_train_row,
                                               train_flops_per_token)
from diff_transformer.training.peak import peak_tflops_per_device
from diff_transformer.training.schedule import Schedule, run_steps
from diff_transformer.training.step import Trainer
from diff_transformer.training.stop import StopSignal, exit_now
from diff_transformer.runs.lock import WorkdirLock, prepare_workdir


def _start_from(trainer: Trainer, state, params: dict, source: str, checkpointer: Checkpointer,
                iterator):
  """The fresh state with its parameters replaced by `params` (flat names, e.g. from an HF
  folder), in the same shardings, saved as checkpoint step 0 (so the starting weights are on
  record and eval.py can read them)."""
  def take(path, leaf):
    name = ".".join(str(k.key) for k in path)
    if name not in params:
      raise TrainError(f"init_from_hf: {source} gives no value for parameter {name}")
    value = params[name]
    if value.shape != leaf.shape:
      raise TrainError(f"init_from_hf: parameter {name} has shape {value.shape} in {source}, "
                       f"this config needs {leaf.shape}")
    return jax.device_put(value.astype(leaf.dtype), leaf.sharding)

  state = dict(state, params=jax.tree_util.tree_map_with_path(take, state["params"]))
  checkpointer.save(0, state, iterator)
  checkpointer.wait()
  print(f"Initialised from {source}; saved as checkpoint step 0", flush=True)
  return state


def train(config: ml_collections.ConfigDict, workdir: str | Path,
          start_params: Callable[[ModelSpec], dict] | None = None) -> dict:
  """Trains to config.train.steps (resuming if the workdir holds checkpoints); returns a summary
  {step, loss, val_loss, unigram_entropy, tokens_per_s, mfu, stopped_by}. The caller's config is
  never changed: what the run fills in (the recorded variant name, the vocabulary from the
  tokenizer) goes into its own copy, which config.json records. A new run with
  config.init_from_hf starts from `start_params(spec)`: flat parameters the caller converts
  (train.py reads the Hugging Face folder with interop.hf_import)."""
  config = copy.deepcopy(config)
  workdir = Path(workdir).expanduser().resolve()
  prepare_workdir(workdir)  # before any expensive work
  lock = WorkdirLock(workdir) if jax.process_index() == 0 else None  # process 0 speaks for all
  notice = lock.acquire() if lock is not None else None
  if notice:
    print(f"warning: {workdir}: {notice}", flush=True)
  try:
    return _train(config, workdir, lock, start_params)
  finally:
    if lock is not None:
      lock.release()


@dataclasses.dataclass
class Run:
  """What the step loop works on, opened (and resumed or initialised) from config + workdir."""
  config: ml_collections.ConfigDict
  workdir: Path
  dataset: Any
  mesh: jax.sharding.Mesh
  trainer: Trainer
  iterator: Any
  checkpointer: Checkpointer
  state: Any
  start: int
  resumed: bool
  batch_change: tuple[int, int] | None  # (recorded, new) global batch size of a resume
  code_change: dict | None  # the code version a resume replaced (run_folder.CODE_VERSION)


def _record_variant(config: ml_collections.ConfigDict) -> None:
  """A variant registered from user code is run (and recorded) as module:Class, so eval.py,
  export.py and lm-eval can import it to restore the run."""
  name = config.model.variant
  config.model.variant = recorded_variant(name)
  if variant_class(name).__module__ == "__main__":
    print(f"warning: model.variant '{name}' is defined in __main__; programs that restore this "
          "run cannot import it (define it in a module)", flush=True)


def open_data(config: ml_collections.ConfigDict):
  """The run's dataset; fills in what the run records (the variant's recorded name, the
  vocabulary from the tokenizer) in `config`, refusing a vocabulary too small for the data."""
  _record_variant(config)
  dataset = data.load_dataset(config.data, seq_len=config.data.seq_len)
  if config.model.vocab_multiple:  # rows from the tokenizer (config.py); recorded as padding
    config.model.vocab_size = data.padded_vocab_size(dataset.vocab_size,
                                                     config.model.vocab_multiple)
  if dataset.vocab_size > config.model.vocab_size:
    raise TrainError(f"model.vocab_size: {config.model.vocab_size} is smaller than the "
                     f"{dataset.tokenizer.name} tokenizer's {dataset.vocab_size} ids")
  return dataset


def open_run(config: ml_collections.ConfigDict, workdir: Path, dataset, mesh, trainer: Trainer,
             batch_change: tuple[int, int] | None) -> Run:
  """The run before its state: its data iterator and checkpointer (a population opens each
  member this way)."""
  iterator = data.train_iterator(dataset, config.data, config.train.global_batch_size,
                                 jax.process_index(), jax.process_count(), seed=config.data.seed)
  return Run(config, workdir, dataset, mesh, trainer, iterator, Checkpointer(workdir, config.train),
             None, 0, resumed=False, batch_change=batch_change, code_change=None)


def record_start(run: Run, state, start: int) -> None:
  """The run starts (or resumes) at `start` from `state`: its record and code version say so."""
  run.state, run.start, run.resumed = state, start, bool(start)
  run_record.write_run_record(run.workdir, run.config, run.dataset)
  run.code_change = run_record.record_code_version(run.workdir, start)


def _open(config: ml_collections.ConfigDict, workdir: Path, start_params=None) -> Run:
  """Data, run record checks, mesh, state: everything that can refuse comes before the state."""
  dataset = open_data(config)
  batch_change = run_record.check_run_record(workdir, config, dataset.tokenizer)
  spec = ModelSpec.from_config(config.model)
  params = None
  if config.init_from_hf and not any(RunFolder(workdir).checkpoints.glob("*")):
    if start_params is None:
      raise TrainError("init_from_hf: train() got no start_params to convert "
                       f"{config.init_from_hf} with; run train.py, which converts the folder")
    params = start_params(spec)  # a wrong folder: one line, before any state is built
  mesh = make_mesh(config.mesh)
  check_parallelism(config, mesh, spec)
  trainer = Trainer(config, mesh, spec)
  run = open_run(config, workdir, dataset, mesh, trainer, batch_change)
  found = run.checkpointer.restore(trainer.abstract_state, run.iterator)
  if found is not None:
    print(f"Resumed from checkpoint step {found[1]} in {run.checkpointer.directory}", flush=True)
  record_start(run, *(found or (trainer.init(), 0)))
  if found is None and params is not None:
    run.state = _start_from(trainer, run.state, params, config.init_from_hf, run.checkpointer,
                            run.iterator)
  return run


def start_logging(run: Run, bar: bool = True) -> tuple[MetricsLogger, RateWindow]:
  """The run's metrics log and rate window, with its opening rows and lines (`bar`: its own
  progress bar; a population shows one for all its members)."""
  config, spec, t = run.config, run.trainer.spec, run.config.train
  seq_len = run.dataset.seq_len
  tokens_per_step = t.global_batch_size * seq_len
  flops_per_step = train_flops_per_token(spec, seq_len) * tokens_per_step
  executed_per_token, kernel = executed_flops_per_token(spec, seq_len)
  # Only process 0 logs MFU; a calibration in every process of a host would also measure the
  # others' concurrent calibrations.
  peak_tflops, peak_source = (peak_tflops_per_device(t.peak_tflops, config.model.dtype)
                              if jax.process_index() == 0 else (math.nan, "not logged here"))
  window = RateWindow(tokens_per_step, flops_per_step, executed_per_token * tokens_per_step,
                      peak_tflops * 1e12 * jax.device_count())
  logger = MetricsLogger(run.workdir, t.steps, run.start, bar=bar)
  logger.write(run.start, dict(peak_tflops_per_device=peak_tflops, peak_source=peak_source,
                               kernel=kernel, model_flops_per_step=flops_per_step,
                               executed_flops_per_step=window.executed_flops), kind="flops")
  logger.print(f"# {config.model.variant} on mesh {dict(run.mesh.shape)} ({jax.device_count()} "
               f"{jax.devices()[0].platform} devices, {jax.process_count()} processes); "
               f"{spec.num_layers} layers, d_model {spec.d_model}; "
               f"{tokens_per_step} tokens/step; workdir {run.workdir}")
  if run.resumed and run.batch_change is not None:  # allowed; data order and schedule change
    old, new = run.batch_change
    logger.print(f"Resuming with train.global_batch_size {new} (was {old}): the data order and "
                 f"the step schedule change from step {run.start}")
    logger.write(run.start, dict(previous_global_batch_size=old, global_batch_size=new),
                 kind="resume")
  if run.code_change is not None:  # allowed; said once here and kept in the metrics
    old, new = provenance.label(run.code_change), provenance.label(provenance.code_version())
    logger.print(f"Resuming at step {run.start} under other code ({new}; was {old})")
    logger.write(run.start, dict(code_was=old, code_now=new), kind="resume")
  if run.start >= t.steps:
    logger.print(f"Checkpoint step {run.start} already reaches train.steps = {t.steps}; raise "
                 "--config.train.steps to train on")
  return logger, window


def _train(config: ml_collections.ConfigDict, workdir: Path, lock: WorkdirLock | None,
           start_params=None) -> dict:
  run = _open(config, workdir, start_params)
  if config.init_from_hf and not run.resumed and config.train.steps == 0:
    run.checkpointer.close()
    return dict(step=0, stopped_by=None, imported=config.init_from_hf)
  logger, window = start_logging(run)
  stop = StopSignal(lambda: exit_now(run.checkpointer, lock))
  try:
    alone = _Alone(run, logger, window)
    run_steps(alone, run.state, Schedule.from_config(config.train, run.start), stop)
    summary = alone.summary
  finally:
    stop.close()
    run.checkpointer.close()  # waits for the async save to commit
    logger.close()
  if summary["stopped_by"] is None and "val_loss" in summary:
    finish(run, summary)
  return summary


class _Alone:
  """A single run as the step loop's cohort: its divergence guard raises (the run stops)."""

  def __init__(self, run: Run, logger: MetricsLogger, window: RateWindow):
    self.run, self.logger, self.window = run, logger, window
    self.guard = DivergenceGuard(run.checkpointer, run.config.train.max_loss_spike)
    self.summary: dict = dict(step=run.start, stopped_by=None)
    self.training = True

  def next_batch(self):
    return global_batch(self.run.mesh, next(self.run.iterator))

  def train_step(self, state, batch):
    return self.run.trainer.train_step(state, batch)

  def stepped(self, step: int) -> None:
    self.summary["step"] = step
    self.window.step()
    self.run.checkpointer.check_saved()  # a failed async save stops the run here

  def check(self, step: int, metrics: dict) -> None:
    self.guard.check_step(step, jax.device_get(metrics))

  def log(self, step: int, values: dict) -> None:
    log_train_row(self.logger, self.window, self.summary, step, values)

  def evaluate(self, state, step: int) -> bool:
    run = self.run
    val = validation.metrics(run.trainer, state, run.dataset, run.config, run.mesh)
    self.logger.write(step, val, kind="val")
    self.logger.progress(step, val)
    self.summary.update(val)
    self.window.reset()
    level = run.config.train.stop_at_val_accuracy
    if level and val["val_accuracy"] >= level:
      self.summary["stopped_at_level"] = True  # a finished run: saved, summary written
      self.training = False
    return not self.training

  def save(self, state, batch, step: int, scheduled: bool) -> None:
    t = self.run.config.train
    self.guard.check_state(step, validation.state_loss(self.run.trainer, state, batch,
                                                       t.micro_batches))
    self.run.checkpointer.save(step, state, self.run.iterator)
    self.window.reset()

  def stopped(self, step: int, reason: str) -> None:
    self.summary["stopped_by"] = reason
    self.logger.print(f"{reason}: saved checkpoint step {step} in "
                      f"{self.run.checkpointer.directory}; exiting")


def finish(run: Run, summary: dict) -> None:
  """The final line, and the run's summary: the record that it reached its last step (sweeps
  and studies skip such runs on a rerun)."""
  summary["unigram_entropy"] = data.unigram_entropy(run.dataset)
  if jax.process_index() != 0:
    return
  print(f"Final validation loss {summary['val_loss']:.4f} nats/token (perplexity "
        f"{summary['val_perplexity']:.1f}) vs unigram baseline "
        f"{summary['unigram_entropy']:.4f} nats/token; checkpoint step {summary['step']} in "
        f"{run.checkpointer.directory}", flush=True)
  RunFolder(run.workdir).write_summary(summary)
