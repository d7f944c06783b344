"""`train(config, workdir)`: data, mesh, sharded state, the step loop, checkpoints and logs.

Resumes from the newest readable checkpoint in `workdir` (same data order, same losses), saves
and exits on SIGTERM/SIGINT (a second Ctrl-C exits at once), stops on a non-finite or spiking
loss without saving it (training/guard.py), stops at the first step after a failed save, and holds
the workdir's lock (training/workdir.py) so no second run writes into it.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import ml_collections
import numpy as np

from diff_transformer import data
from diff_transformer.errors import TrainError
from diff_transformer.interop import hf_import
from diff_transformer.model.spec import ModelSpec
from diff_transformer.training import checkpoint as ckpt_lib
from diff_transformer.training.guard import DivergenceGuard
from diff_transformer.training.mesh import check_parallelism, global_batch, make_mesh
from diff_transformer.training.metrics import (MetricsLogger, executed_flops_per_token,
                                               expand_layers, train_flops_per_token)
from diff_transformer.training.peak import peak_tflops_per_device
from diff_transformer.training.step import Trainer
from diff_transformer.training.workdir import WorkdirLock, prepare_workdir


class StopSignal:
  """Turns SIGTERM/SIGINT into a request to save and exit at the next step boundary; a second
  SIGINT calls `on_second_interrupt` (which exits at once)."""

  def __init__(self, on_second_interrupt: Callable[[], None] | None = None):
    self.requested: str | None = None
    self.on_second_interrupt = on_second_interrupt
    self._previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. called from a worker): no handlers
        pass

  def _handle(self, signum, frame):
    if self.requested is not None and signum == signal.SIGINT:
      if self.on_second_interrupt is not None:
        self.on_second_interrupt()
      raise KeyboardInterrupt  # a second Ctrl-C means now
    self.requested = signal.Signals(signum).name

  def agreed(self, due: bool) -> bool:
    """All processes must stop at the same step: any process's request stops everyone. With
    several processes they agree only at `due` steps (the same steps on every host: logging and
    checkpoint steps), so other steps never wait on a cross-host gather; one process stops at
    the next step."""
    flag = self.requested is not None
    if jax.process_count() > 1:
      if not due:
        return False
      from jax.experimental import multihost_utils
      flag = bool(np.any(multihost_utils.process_allgather(np.int32(flag))))
    return flag

  def close(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _state_loss(trainer: Trainer, state, batch, micro_batches: int) -> float:
  """The loss a state gives on the batch it was just trained on (its first micro-batch, a size
  a step already fits in memory): a checkpoint is saved only once this is finite."""
  if micro_batches > 1:  # rows j*m of each device's block: micro-batch 0, no resharding
    batch = jax.tree.map(lambda x: x[::micro_batches], batch)
  nll, tokens, _ = trainer.eval_step(state, batch)
  return float(nll) / max(float(tokens), 1.0)


def _exit_now(checkpointer: ckpt_lib.Checkpointer, lock: WorkdirLock | None) -> None:
  """A second Ctrl-C: exit at once without waiting for a save in flight (the next run removes
  its temp files); one line says which checkpoint is the newest."""
  sys.stderr.write(f"\ninterrupted again: exiting now; any checkpoint save in progress is "
                   f"abandoned; {checkpointer.newest()}\n")
  sys.stderr.flush()
  if lock is not None:
    lock.release()
  os._exit(130)


def evaluate(trainer: Trainer, state, dataset, config: ml_collections.ConfigDict, mesh) -> dict:
  """Validation loss, perplexity and argmax accuracy over the weighted tokens (the answers on
  synthetic tasks) of up to train.eval_batches held-out batches."""
  t = config.train
  batch_size = t.global_batch_size // t.micro_batches  # the size a step already fits in memory
  nll, tokens, correct = 0.0, 0.0, 0.0
  for local in data.validation_batches(dataset, config.data, batch_size, t.eval_batches,
                                       process_index=jax.process_index(),
                                       process_count=jax.process_count()):
    batch_nll, batch_tokens, batch_correct = trainer.eval_step(state, global_batch(mesh, local))
    nll, tokens, correct = nll + batch_nll, tokens + batch_tokens, correct + batch_correct
  nll, tokens, correct = float(nll), float(tokens), float(correct)
  if tokens == 0:
    raise TrainError(f"{dataset.path}: the validation split yields no tokens")
  loss = nll / tokens
  return dict(val_loss=loss, val_perplexity=math.exp(min(loss, 80.0)), val_tokens=tokens,
              val_accuracy=correct / tokens)


def _import_hf(trainer: Trainer, state, folder: str, checkpointer, iterator):
  """The fresh state with its parameters read from an HF folder, saved as checkpoint step 0 (so
  the imported weights are on record and eval.py can read them)."""
  params = hf_import.import_params(trainer.spec, folder)
  state = hf_import.into_state(state, params, folder)
  checkpointer.save(0, state, iterator)
  checkpointer.wait()
  print(f"Initialised from the Hugging Face folder {folder}; saved as checkpoint step 0",
        flush=True)
  return state


def train(config: ml_collections.ConfigDict, workdir: str | Path) -> dict:
  """Trains to config.train.steps (resuming if the workdir holds checkpoints); returns a summary
  {step, loss, val_loss, unigram_entropy, tokens_per_s, mfu, stopped_by}."""
  workdir = Path(workdir).expanduser().resolve()
  prepare_workdir(workdir)  # before any expensive work
  lock = WorkdirLock(workdir) if jax.process_index() == 0 else None  # process 0 speaks for all
  notice = lock.acquire() if lock is not None else None
  if notice:
    print(f"warning: {workdir}: {notice}", flush=True)
  try:
    return _train(config, workdir, lock)
  finally:
    if lock is not None:
      lock.release()


def _train(config: ml_collections.ConfigDict, workdir: Path, lock: WorkdirLock | None) -> dict:
  t = config.train
  dataset = data.load_dataset(config.data, seq_len=config.data.seq_len)
  if config.model.vocab_multiple:  # rows from the tokenizer (config.py); recorded as padding
    config.model.vocab_size = data.padded_vocab_size(dataset.vocab_size,
                                                     config.model.vocab_multiple)
  if dataset.vocab_size > config.model.vocab_size:
    raise TrainError(f"model.vocab_size: {config.model.vocab_size} is smaller than the "
                     f"{dataset.tokenizer.name} tokenizer's {dataset.vocab_size} ids")
  batch_change = ckpt_lib.check_run_record(workdir, config, dataset.tokenizer)
  if config.init_from_hf and not any((workdir / "checkpoints").glob("*")):
    # A new run from an HF folder: one line about a wrong folder before any state is built.
    hf_import.check_folder(ModelSpec.from_config(config.model), config.init_from_hf)
  mesh = make_mesh(config.mesh)
  check_parallelism(config, mesh)
  trainer = Trainer(config, mesh)
  iterator = data.train_iterator(dataset, config.data, t.global_batch_size,
                                 jax.process_index(), jax.process_count(), seed=config.data.seed)
  checkpointer = ckpt_lib.Checkpointer(workdir, t)
  guard = DivergenceGuard(checkpointer, t.max_loss_spike)
  found = checkpointer.restore(trainer.abstract_state, iterator)
  if found is not None:
    state, start = found
    print(f"Resumed from checkpoint step {start} in {checkpointer.directory}", flush=True)
  else:
    state, start = trainer.init(), 0
  ckpt_lib.write_run_record(workdir, config, dataset)
  if found is None and config.init_from_hf:
    state = _import_hf(trainer, state, config.init_from_hf, checkpointer, iterator)
    if t.steps == 0:
      checkpointer.close()
      return dict(step=0, stopped_by=None, imported=config.init_from_hf)

  seq_len = dataset.seq_len
  tokens_per_step = t.global_batch_size * seq_len
  flops_per_step = train_flops_per_token(trainer.spec, seq_len) * tokens_per_step
  executed_per_token, kernel = executed_flops_per_token(trainer.spec, seq_len)
  # Only process 0 logs MFU; a calibration in every process of a host would also measure the
  # others' concurrent calibrations.
  peak_tflops, peak_source = (peak_tflops_per_device(t.peak_tflops, config.model.dtype)
                              if jax.process_index() == 0 else (math.nan, "not logged here"))
  peak_flops = peak_tflops * 1e12 * jax.device_count()
  logger = MetricsLogger(workdir, t.steps, start)
  logger.write(start, dict(peak_tflops_per_device=peak_tflops, peak_source=peak_source,
                           kernel=kernel, model_flops_per_step=flops_per_step,
                           executed_flops_per_step=executed_per_token * tokens_per_step),
               kind="flops")
  logger.print(f"# {config.model.variant} on mesh {dict(mesh.shape)} ({jax.device_count()} "
               f"{jax.devices()[0].platform} devices, {jax.process_count()} processes); "
               f"{trainer.spec.num_layers} layers, d_model {trainer.spec.d_model}; "
               f"{tokens_per_step} tokens/step; workdir {workdir}")
  if found is not None and batch_change is not None:  # allowed, but data order and schedule change
    logger.print(f"Resuming with train.global_batch_size {batch_change[1]} (was "
                 f"{batch_change[0]}): the data order and the step schedule change from step "
                 f"{start}")
    logger.write(start, dict(previous_global_batch_size=batch_change[0],
                             global_batch_size=batch_change[1]), kind="resume")
  stop = StopSignal(lambda: _exit_now(checkpointer, lock))
  summary: dict = dict(step=start, stopped_by=None)
  pending = None  # (step, metrics) whose finiteness is checked one step late (keeps dispatch async)
  window_time, window_steps = None, 0  # training time since the last log (no eval, no saves)
  rate = dict(tokens_per_s=float("nan"), mfu=float("nan"), hfu=float("nan"))
  step = start
  if start >= t.steps:
    logger.print(f"Checkpoint step {start} already reaches train.steps = {t.steps}; raise "
                 "--config.train.steps to train on")
  try:
    while step < t.steps:
      batch = global_batch(mesh, next(iterator))
      state, metrics = trainer.train_step(state, batch)
      step += 1
      window_steps += 1
      checkpointer.check_saved()  # a failed async save stops the run here, not at the next save
      if pending is not None:
        guard.check_step(pending[0], jax.device_get(pending[1]))
      pending = (step, metrics)
      last = step == t.steps
      if step % t.log_every == 0 or last or step == start + 1:
        values = jax.device_get(metrics)
        guard.check_step(step, values)
        pending = None
        now = time.perf_counter()
        if window_time is not None:  # the first step (compilation) is not timed
          seconds = (now - window_time) / window_steps
          rate = dict(tokens_per_s=tokens_per_step / seconds,
                      mfu=flops_per_step / seconds / peak_flops,
                      hfu=executed_per_token * tokens_per_step / seconds / peak_flops)
        for name, per_layer in values.pop("layers").items():
          values |= expand_layers(name, per_layer)
        values |= dict(perplexity=math.exp(min(float(values["loss"]), 80.0)), **rate)
        logger.write(step, values)
        logger.progress(step, values)
        summary.update(step=step, loss=float(values["loss"]), **rate)
        window_time, window_steps = time.perf_counter(), 0
      if step % t.eval_every == 0 or last:
        val = evaluate(trainer, state, dataset, config, mesh)
        logger.write(step, val, kind="val")
        logger.progress(step, val)
        summary.update(val)
        window_time, window_steps = time.perf_counter(), 0  # keep evaluation out of the rate
      stopping = stop.agreed(step % t.log_every == 0 or last or step % t.checkpoint_every == 0)
      if stopping or last or step % t.checkpoint_every == 0:
        if pending is not None:  # never save a NaN state
          guard.check_step(step, jax.device_get(metrics))
          pending = None
        guard.check_state(step, _state_loss(trainer, state, batch, t.micro_batches))
        checkpointer.save(step, state, iterator)
        window_time, window_steps = time.perf_counter(), 0
      if stopping:
        summary["stopped_by"] = stop.requested
        logger.print(f"{stop.requested}: saved checkpoint step {step} in "
                     f"{checkpointer.directory}; exiting")
        break
    summary["step"] = step
  finally:
    stop.close()
    checkpointer.close()  # waits for the async save to commit
    logger.close()
  if summary["stopped_by"] is None and "val_loss" in summary:
    summary["unigram_entropy"] = data.unigram_entropy(dataset)
    if jax.process_index() == 0:
      print(f"Final validation loss {summary['val_loss']:.4f} nats/token (perplexity "
            f"{summary['val_perplexity']:.1f}) vs unigram baseline "
            f"{summary['unigram_entropy']:.4f} nats/token; checkpoint step {step} in "
            f"{checkpointer.directory}", flush=True)
      # The record that a run reached its last step (sweeps skip such runs on a rerun).
      tmp = Path(workdir) / "summary.json.tmp"  # atomic: a kill leaves no half record
      tmp.write_text(json.dumps(summary, indent=1))
      os.replace(tmp, Path(workdir) / "summary.json")
  return summary
