"""The step loop's members (training/schedule.py): a single run is a population of one. Each
member checks, logs, evaluates, saves and reports its own run here, once; the driver
(training/loop.py, training/population_loop.py) gives the batches and steps its own program.

What a divergence does is the member's policy: a single run stops (its TrainError is the run's
one line), a population member is held (its error goes to its log, the others train on).
"""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
import jax
import numpy as np
from tqdm import tqdm

from diff_transformer import data
from diff_transformer.errors import TrainError
from diff_transformer.runs.folder import RunFolder
from diff_transformer.training import validation
from diff_transformer.training.guard import DivergenceGuard
from diff_transformer.training.metrics import MetricsLogger, RateWindow, log_train_row
from diff_transformer.training.opening import Run


class OnDivergence(enum.Enum):
  STOP = "stop the run"  # a run alone: the guard's TrainError ends it
  HOLD = "hold the member"  # a population member fails alone; the others go on


@dataclasses.dataclass
class Member:
  index: int  # in the members list
  slot: int | None  # in the program's stacked state (None: failed in an earlier attempt)
  run: Run
  on_divergence: OnDivergence = OnDivergence.HOLD
  # Set when the member starts training (a member failed in an earlier attempt never does).
  logger: MetricsLogger = None  # type: ignore[assignment]
  window: RateWindow = None  # type: ignore[assignment]
  summary: dict = dataclasses.field(default_factory=dict)
  failed: str | None = None
  finished: bool = False
  guard: DivergenceGuard = dataclasses.field(init=False)

  def __post_init__(self) -> None:
    self.guard = DivergenceGuard(self.run.checkpointer, self.run.config.train.max_loss_spike)

  @property
  def training(self) -> bool:
    return self.failed is None and not self.finished

  def stepped(self, step: int) -> None:
    self.summary["step"] = step
    self.window.step()
    self.run.checkpointer.check_saved()  # a failed async save stops the program here

  def check(self, step: int, values: dict) -> None:
    """The divergence guard on the step's loss and gradient norm."""
    self._guarded(step, lambda: self.guard.check_step(step, values))

  def log(self, step: int, values: dict) -> None:
    log_train_row(self.logger, self.window, self.summary, step, values)

  def evaluate(self, state, step: int) -> None:
    """The member's validation; a member that reaches its accuracy level is finished (saved at
    this step, its summary written at the end)."""
    run = self.run
    val = validation.metrics(run.trainer, state, run.dataset, run.config, run.mesh)
    self.logger.write(step, val, kind="val")
    self.logger.progress(step, val)
    self.summary.update(val, step=step)
    self.window.reset()
    level = run.config.train.stop_at_val_accuracy
    if level and val["val_accuracy"] >= level:
      self.summary["stopped_at_level"] = True
      self.finished = True

  def save(self, state, batch, step: int) -> None:
    """The member's checkpoint, once its state's loss is seen finite."""
    run = self.run
    loss = validation.state_loss(run.trainer, state, batch, run.config.train.micro_batches)
    if self._guarded(step, lambda: self.guard.check_state(step, loss)):
      run.checkpointer.save(step, state, run.iterator)
      self.window.reset()

  def _guarded(self, step: int, check) -> bool:
    """Runs a guard check under the member's policy; False when the member failed."""
    try:
      check()
    except TrainError as e:
      if self.on_divergence is OnDivergence.STOP:
        raise
      self.fail(step, e)
      return False
    return True

  def fail(self, step: int, error: Exception) -> None:
    """The member stops training; its error goes to its metrics log (a rerun reads it there)
    and its log (the line a study records)."""
    self.failed = str(error)
    self.logger.write(step, dict(error=self.failed), kind="failed")
    with open(RunFolder(self.run.workdir).log, "a") as log:
      log.write(f"error: {self.failed}\n")
    print(f"member {self.index} ({self.run.workdir.name}) failed: {self.failed}", flush=True)


def failed_before(workdir: Path) -> str | None:
  """The error of a member that failed in an earlier attempt (its last metrics row says so): a
  rerun does not train it again (it would diverge again, identically); the others resume."""
  rows = RunFolder(workdir).metric_rows()
  return rows[-1]["error"] if rows and rows[-1].get("kind") == "failed" else None


class Members:
  """What the step loop (training/schedule.py) checks, logs, evaluates and saves: each member on
  its own, its part of the program's trees (the whole tree for a run alone, its slot of the
  stacked trees in a population); `bar`: one progress bar for members whose loggers show none."""

  def __init__(self, members: list[Member], bar: tqdm | None = None):
    self.members, self.bar = members, bar

  @property
  def training(self) -> bool:
    return any(m.training for m in self.members)

  @property
  def training_mask(self) -> np.ndarray:
    """[members] bool: who a population's step still updates."""
    return np.array([m.training for m in self.members])

  @staticmethod
  def part(tree, member: Member):
    return tree if member.slot is None else jax.tree.map(lambda x: x[member.slot], tree)

  def stepped(self, step: int) -> None:
    for m in self.members:
      if m.training:
        m.stepped(step)

  def check(self, step: int, metrics: dict) -> None:
    values = jax.device_get(dict(loss=metrics["loss"], grad_norm=metrics["grad_norm"]))
    for m in self.members:
      if m.training:
        m.check(step, self.part(values, m))

  def log(self, step: int, values: dict) -> None:
    for m in self.members:
      if m.training:
        row = dict(self.part(values, m))
        row.pop("finite", None)  # the population's hold mask, not a metric
        m.log(step, row)
    if self.bar is not None:
      self.bar.n = step
      self.bar.refresh()

  def evaluate(self, state, step: int) -> bool:
    """True when a member finished at its accuracy level at this step."""
    training = [m for m in self.members if m.training]
    for m in training:
      m.evaluate(self.part(state, m), step)
    return any(m.finished for m in training)

  def save(self, state, batch, step: int, scheduled: bool) -> None:
    """Every training member at a scheduled step; a member finished at its level at its own
    step (its checkpoint is the one its summary names)."""
    for m in self.members:
      if (m.training and scheduled) or (m.finished and m.summary.get("step") == step):
        m.save(self.part(state, m), self.part(batch, m), step)

  def stopped(self, step: int, reason: str) -> None:
    for m in self.members:
      m.summary["stopped_by"] = reason
    if len(self.members) == 1:  # through its logger: process 0 speaks, beside its bar
      m = self.members[0]
      m.logger.print(f"{reason}: saved checkpoint step {step} in {m.run.checkpointer.directory}; "
                     "exiting")
    else:
      print(f"{reason}: saved checkpoint step {step} of every member; exiting", flush=True)

  def close(self) -> None:
    """Waits for each member's async save to commit; closes its log."""
    if self.bar is not None:
      self.bar.close()
    for m in self.members:
      m.run.checkpointer.close()
      m.logger.close()

  def finish(self, stopped_by: str | None, population: tuple[str, int] | None = None) -> None:
    """Each member that reached its last step or its level gets its summary written (the
    record that it finished; `population`: its name and size, named in the summary); a failed
    member's error stays its record."""
    for m in self.members:
      if m.failed is not None:
        continue
      done = m.finished or stopped_by is None
      m.summary["stopped_by"] = None if done else stopped_by
      if done and "val_loss" in m.summary:
        if population is not None:
          name, size = population
          m.summary["population"] = dict(name=name, member=m.index, members=size)
        finish(m.run, m.summary)


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
