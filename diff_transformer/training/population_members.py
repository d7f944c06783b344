"""A population member's side of population_loop.py: its slice of the stacked state, and its
divergence check, log rows, evaluation and checkpoint, each as its standalone run does them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax

from diff_transformer.errors import TrainError
from diff_transformer.runs.folder import RunFolder
from diff_transformer.training import validation
from diff_transformer.training.guard import DivergenceGuard
from diff_transformer.training.loop import Run
from diff_transformer.training.metrics import MetricsLogger, RateWindow, log_train_row


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


def check_all(members: list[Member], step: int, metrics) -> None:
  values = jax.device_get(dict(loss=metrics["loss"], grad_norm=metrics["grad_norm"]))
  for m in members:
    check(m, step, member_slice(values, m.slot))


def log_rows(members: list[Member], step: int, values: dict) -> None:
  """Each training member's row, as its standalone run logs it."""
  for m in members:
    if m.training:
      row = member_slice(values, m.slot)
      del row["finite"]
      log_train_row(m.logger, m.window, m.summary, step, row)


def evaluate(m: Member, state, step: int) -> None:
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
  run = m.run
  try:
    m.guard.check_state(step, validation.state_loss(run.trainer, state, batch,
                                                    run.config.train.micro_batches))
  except TrainError as e:
    fail(m, step, e)
    return
  run.checkpointer.save(step, state, run.iterator)
  m.window.reset()
