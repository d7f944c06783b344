"""The one step loop: a single run is a population of one (training/members.py), so a run
(training/loop.py) and a population (training/population_loop.py) follow this schedule; each
driver calls its own program's step.

Each step trains, then checks the previous step's loss (one step late, so dispatch stays
asynchronous); log steps check at once, evaluation steps evaluate, save steps check what is
still pending and save (a NaN state is never saved), and a stop request saves and leaves at the
step every process agrees on.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections

from diff_transformer.training.members import Members
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


class StepLoop:
  """What happens around each step of a driver's own program, for every member alike:

      loop = StepLoop(members, schedule, stop)
      while loop.going:
        batch = ...                                   # the driver's batches
        state, metrics = trainer.train_step(state, batch)  # the driver's program
        loop.after_step(state, batch, metrics)

  (training/loop.py steps one run so, training/population_loop.py a population.)"""

  def __init__(self, members: Members, schedule: Schedule, stop: StopSignal):
    self.members, self.schedule, self.stop = members, schedule, stop
    self.step = schedule.start
    self.stopped_by: str | None = None  # the stop request that ended the loop
    self._pending: tuple[int, Any] | None = None  # (step, metrics) not yet checked

  @property
  def going(self) -> bool:
    return (self.stopped_by is None and self.step < self.schedule.steps
            and self.members.training)

  def after_step(self, state, batch, metrics) -> None:
    """After the program's step on `batch` gave `state` and `metrics`."""
    members, schedule = self.members, self.schedule
    self.step = step = self.step + 1
    members.stepped(step)
    if self._pending is not None:
      members.check(*self._pending)
    self._pending = (step, metrics)
    last = step == schedule.steps
    if schedule.logs(step):
      values = jax.device_get(metrics)
      members.check(step, values)
      self._pending = None
      members.log(step, values)
    finished = members.evaluate(state, step) if schedule.evaluates(step) else False
    last = last or not members.training
    stopping = self.stop.agreed(schedule.agrees(step) or last)  # why every process stops, or None
    scheduled = stopping is not None or last or schedule.saves(step)
    if scheduled or finished:
      if self._pending is not None:  # never save a NaN state
        members.check(*self._pending)
        self._pending = None
      members.save(state, batch, step, scheduled)
    if stopping is not None and not last:  # a run at its last step is finished: no stop
      members.stopped(step, stopping)
      self.stopped_by = stopping
