"""The one step loop: a single run is a population of one (training/members.py), so a run
(training/loop.py) and a population (training/population_loop.py) follow this schedule.

Each step trains, then checks the previous step's loss (one step late, so dispatch stays
asynchronous); log steps check at once, evaluation steps evaluate, save steps check what is
still pending and save (a NaN state is never saved), and a stop request saves and leaves at the
step every process agrees on.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import ml_collections

from diff_transformer.training.stop import StopSignal


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which steps log, evaluate and save, from config.train, for a run resumed at `start`."""
  start: int
  steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int

  @classmethod
  def from_config(cls, train: ml_collections.ConfigDict, start: int) -> "Schedule":
    return cls(start, int(train.steps), int(train.log_every), int(train.eval_every),
               int(train.checkpoint_every))

  def logs(self, step: int) -> bool:
    """The first step after a (re)start is logged too: it carries the compilation."""
    return step % self.log_every == 0 or step == self.steps or step == self.start + 1

  def evaluates(self, step: int) -> bool:
    return step % self.eval_every == 0 or step == self.steps

  def saves(self, step: int) -> bool:
    return step % self.checkpoint_every == 0 or step == self.steps

  def agrees(self, step: int) -> bool:
    """Steps where every process asks the others whether to stop (the same steps on every host,
    so other steps never wait on a cross-host gather)."""
    return step % self.log_every == 0 or self.saves(step)


class Cohort(Protocol):
  """What the loop steps: one run, or the members of a population."""

  @property
  def training(self) -> bool: ...  # False once nothing is left (its level reached, all failed)

  def next_batch(self) -> Any: ...
  def train_step(self, state, batch) -> tuple[Any, dict]: ...
  def stepped(self, step: int) -> None: ...  # after each step: rate windows, failed saves
  def check(self, step: int, metrics: dict) -> None: ...  # the divergence guard
  def log(self, step: int, values: dict) -> None: ...
  def evaluate(self, state, step: int) -> bool: ...  # True: something finished at its level
  def save(self, state, batch, step: int, scheduled: bool) -> None: ...
  def stopped(self, step: int, reason: str) -> None: ...


def run_steps(cohort: Cohort, state, schedule: Schedule,
              stop: StopSignal) -> tuple[int, str | None]:
  """Steps `cohort` from schedule.start to schedule.steps (or until it stops training); returns
  (the last step taken, the stop request that ended it or None)."""
  step, pending = schedule.start, None  # pending: (step, metrics) not yet checked
  while step < schedule.steps and cohort.training:
    batch = cohort.next_batch()
    state, metrics = cohort.train_step(state, batch)
    step += 1
    cohort.stepped(step)
    if pending is not None:
      cohort.check(*pending)
    pending = (step, metrics)
    last = step == schedule.steps
    if schedule.logs(step):
      values = jax.device_get(metrics)
      cohort.check(step, values)
      pending = None
      cohort.log(step, values)
    finished = cohort.evaluate(state, step) if schedule.evaluates(step) else False
    last = last or not cohort.training
    stopping = stop.agreed(schedule.agrees(step) or last)  # why every process stops, or None
    scheduled = stopping is not None or last or schedule.saves(step)
    if scheduled or finished:
      if pending is not None:  # never save a NaN state
        cohort.check(*pending)
        pending = None
      cohort.save(state, batch, step, scheduled)
    if stopping is not None and not last:  # a run at its last step is finished: no stop
      cohort.stopped(step, stopping)
      return step, stopping
  return step, None
