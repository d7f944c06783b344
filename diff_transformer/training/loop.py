"""`train(config, workdir)`: a run opened (training/opening.py), its logs, its train step under
the step loop (training/schedule.py) and its summary.

Resumes from the newest readable checkpoint in `workdir` (same data order, same losses), saves
and exits on SIGTERM/SIGINT (a second Ctrl-C exits at once), stops on a non-finite or spiking
loss without saving it (training/guard.py), stops at the first step after a failed save, and holds
the workdir's lock (runs/lock.py) so no second run writes into it.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Callable

import jax
import ml_collections

from diff_transformer import provenance
from diff_transformer.mesh import global_batch
from diff_transformer.model.decoder import unrolled
from diff_transformer.model.spec import ModelSpec
from diff_transformer.runs.folder import RunFolder
from diff_transformer.training.opening import Run, open_alone
from diff_transformer.training.members import Member, Members, OnDivergence
from diff_transformer.training.metrics import (MetricsLogger, RateWindow,
                                               executed_flops_per_token, train_flops_per_token)
from diff_transformer.training.peak import peak_tflops_per_device
from diff_transformer.training.schedule import Schedule, StepLoop
from diff_transformer.training.step import Trainer
from diff_transformer.training.stop import StopSignal, exit_now
from diff_transformer.runs.lock import WorkdirLock, prepare_workdir


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


def start_logging(run: Run, bar: bool = True) -> tuple[MetricsLogger, RateWindow]:
  """The run's metrics log and rate window, with its opening rows and lines (`bar`: its own
  progress bar; a population shows one for all its members)."""
  config, spec, t = run.config, run.trainer.spec, run.config.train
  seq_len = run.dataset.seq_len
  tokens_per_step = t.global_batch_size * seq_len
  flops_per_step = train_flops_per_token(spec, seq_len) * tokens_per_step
  executed_per_token, kernel = executed_flops_per_token(spec, seq_len,
                                                        packed=run.trainer.packed_rows)
  # Only process 0 logs MFU; a calibration in every process of a host would also measure the
  # others' concurrent calibrations.
  peak_tflops, peak_source = (peak_tflops_per_device(t.peak_tflops, config.model.dtype)
                              if jax.process_index() == 0 else (math.nan, "not logged here"))
  window = RateWindow(tokens_per_step, flops_per_step, executed_per_token * tokens_per_step,
                      peak_tflops * 1e12 * jax.device_count())
  logger = MetricsLogger(run.workdir, t.steps, run.start, bar=bar)
  logger.write(run.start, dict(peak_tflops_per_device=peak_tflops, peak_source=peak_source,
                               kernel=kernel, layer_loop="unroll" if unrolled(spec) else "scan",
                               model_flops_per_step=flops_per_step,
                               executed_flops_per_step=window.executed_flops), kind="flops")
  logger.print(f"# {config.model.variant} on mesh {dict(run.mesh.shape)} ({jax.device_count()} "
               f"{jax.devices()[0].platform} devices, {jax.process_count()} processes); "
               f"{spec.num_layers} layers, d_model {spec.d_model}; "
               f"{tokens_per_step} tokens/step; workdir {run.workdir}")
  if run.resumed and run.batch_change is not None:  # allowed; data order and schedule change
    was_batch, batch = run.batch_change
    logger.print(f"Resuming with train.global_batch_size {batch} (was {was_batch}): the data "
                 f"order and the step schedule change from step {run.start}")
    logger.write(run.start, dict(previous_global_batch_size=was_batch, global_batch_size=batch),
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
  run = open_alone(config, workdir, start_params)
  if config.init_from_hf and not run.resumed and config.train.steps == 0:
    run.checkpointer.close()
    return dict(step=0, stopped_by=None, imported=config.init_from_hf)
  logger, window = start_logging(run)
  stop = StopSignal(lambda: exit_now(run.checkpointer, lock))
  alone = Member(index=0, slot=None, run=run, on_divergence=OnDivergence.STOP, logger=logger,
                 window=window, summary=dict(step=run.start, stopped_by=None))
  members = Members([alone])
  loop = StepLoop(members, Schedule.from_config(config.train, run.start), stop)
  trainer: Trainer = run.trainer
  state = run.state
  try:
    if run.start >= config.train.steps and RunFolder(workdir).read_summary() is None:
      alone.evaluate(state, run.start)  # saved at its last step, stopped before its summary
    while loop.going:
      rows = next(run.iterator)
      batch = global_batch(run.mesh, rows)
      state, metrics = trainer.train_step(state, batch, host_batch=rows)
      loop.after_step(state, batch, metrics)
  finally:
    stop.close()
    members.close()  # waits for the async save to commit
  members.finish(loop.stopped_by)
  return alone.summary
