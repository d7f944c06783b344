"""A population's members as the step loop's cohort: each member's slice of the stacked state,
and its divergence check, log rows, evaluation and checkpoint, each as its standalone run does
them (population_loop.py opens them)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from diff_transformer.errors import TrainError
from diff_transformer.runs.folder import RunFolder
from diff_transformer.training import validation
from diff_transformer.training.guard import DivergenceGuard
from diff_transformer.training.opening import Run
from diff_transformer.training.metrics import MetricsLogger, RateWindow, log_train_row
from diff_transformer.training.population import Population


@dataclasses.dataclass
class Member:
  index: int  # in the members list
  slot: int | None  # in the program's stacked state (None: failed in an earlier attempt)
  run: Run
  guard: DivergenceGuard
  logger: MetricsLogger | None = None
  window: RateWindow | None = None
  summary: dict = dataclasses.field(default_factory=dict)
  failed: str | None = None
  finished: bool = False

  @property
  def training(self) -> bool:
    return self.failed is None and not self.finished


def member_slice(tree, slot: int):
  """A member's part of a stacked tree (its state, batch or metrics)."""
  return jax.tree.map(lambda x: x[slot], tree)


def failed_before(workdir: Path) -> str | None:
  """The error of a member that failed in an earlier attempt (its last metrics row says so): a
  rerun does not train it again (it would diverge again, identically); the others resume."""
  rows = RunFolder(workdir).metric_rows()
  return rows[-1]["error"] if rows and rows[-1].get("kind") == "failed" else None


def fail(m: Member, step: int, error: Exception) -> None:
  """The member stops training; its error goes to its metrics log (a rerun reads it there) and
  its log (the line a study records)."""
  m.failed = str(error)
  m.logger.write(step, dict(error=m.failed), kind="failed")
  with open(RunFolder(m.run.workdir).log, "a") as log:
    log.write(f"error: {m.failed}\n")
  print(f"member {m.index} ({m.run.workdir.name}) failed: {m.failed}", flush=True)


def check(m: Member, step: int, values: dict) -> None:
  """The divergence guard on the member's step metrics (a member held as not finite fails)."""
  if not m.training:
    return
  try:
    m.guard.check_step(step, values)
  except TrainError as e:
    fail(m, step, e)


def evaluate(m: Member, state, step: int) -> None:
  """The member's validation; a member that reaches its accuracy level is finished."""
  run = m.run
  val = validation.metrics(run.trainer, state, run.dataset, run.config, run.mesh)
  m.logger.write(step, val, kind="val")
  m.summary.update(val, step=step)
  m.window.reset()
  level = run.config.train.stop_at_val_accuracy
  if level and val["val_accuracy"] >= level:
    m.summary["stopped_at_level"] = True
    m.finished = True  # saved at this step, summary written at the end


def save(m: Member, state, batch, step: int) -> None:
  """The member's checkpoint, once its state's loss is seen finite (else the member fails)."""
  run = m.run
  try:
    m.guard.check_state(step, validation.state_loss(run.trainer, state, batch,
                                                    run.config.train.micro_batches))
  except TrainError as e:
    fail(m, step, e)
    return
  run.checkpointer.save(step, state, run.iterator)
  m.window.reset()


class Members:
  """The members of one population as the step loop's cohort (training/schedule.py): one
  program steps them all; each member is checked, logged, evaluated and saved on its own."""

  def __init__(self, members: list[Member], population: Population, bar: tqdm):
    self.members, self.population, self.bar = members, population, bar

  @property
  def training(self) -> bool:
    return any(m.training for m in self.members)

  def next_batch(self):
    local = [next(m.run.iterator) for m in self.members]
    return jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *local))

  def train_step(self, state, batches):
    return self.population.members_step(state, batches,
                                        np.array([m.training for m in self.members]))

  def stepped(self, step: int) -> None:
    for m in self.members:
      if m.training:
        m.summary["step"] = step
        m.window.step()
        m.run.checkpointer.check_saved()

  def check(self, step: int, metrics: dict) -> None:
    values = jax.device_get(dict(loss=metrics["loss"], grad_norm=metrics["grad_norm"]))
    for m in self.members:
      check(m, step, member_slice(values, m.slot))

  def log(self, step: int, values: dict) -> None:
    """Each training member's row, as its standalone run logs it."""
    for m in self.members:
      if m.training:
        row = member_slice(values, m.slot)
        del row["finite"]
        log_train_row(m.logger, m.window, m.summary, step, row)
    self.bar.n = step
    self.bar.refresh()

  def evaluate(self, state, step: int) -> bool:
    training = [m for m in self.members if m.training]
    for m in training:
      evaluate(m, member_slice(state, m.slot), step)
    return any(m.finished for m in training)

  def save(self, state, batches, step: int, scheduled: bool) -> None:
    """Every training member at a scheduled step; a member finished at its level at its own
    step (its checkpoint is the one its summary names)."""
    for m in self.members:
      if (m.training and scheduled) or (m.finished and m.summary.get("step") == step):
        save(m, member_slice(state, m.slot), member_slice(batches, m.slot), step)

  def stopped(self, step: int, reason: str) -> None:
    print(f"{reason}: saved checkpoint step {step} of every member; exiting", flush=True)
