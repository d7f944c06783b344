"""The one step loop (training/schedule.py) on recording members: the order of checks, logs,
evaluations and saves a run and a population both follow."""
from __future__ import annotations

import math

from diff_transformer.training.schedule import Schedule, StepLoop


def run_steps(members, state, schedule, stop):
  """A driver as training/loop.py's: its own step (a counter here), the loop around it."""
  loop = StepLoop(members, schedule, stop)
  while loop.going:
    state, metrics = members.train_step(state)
    loop.after_step(state, None, metrics)
  return loop.step, loop.stopped_by


class _Recording:
  """Steps a counter; records what the loop asks of it. `finish_at`: the step whose evaluation
  finishes it at its level; `nan_at`: the step whose loss is not finite."""

  def __init__(self, finish_at=None, nan_at=None):
    self.events: list[tuple] = []
    self.training, self.finish_at, self.nan_at = True, finish_at, nan_at

  def train_step(self, state):
    loss = math.nan if state + 1 == self.nan_at else 1.0
    return state + 1, dict(loss=loss)

  def stepped(self, step):
    pass

  def check(self, step, metrics):
    self.events.append(("check", step))
    if not math.isfinite(metrics["loss"]):
      raise ValueError(f"step {step}")

  def log(self, step, values):
    self.events.append(("log", step))

  def evaluate(self, state, step):
    self.events.append(("eval", step))
    if step == self.finish_at:
      self.training = False
    return step == self.finish_at

  def save(self, state, batch, step, scheduled):
    assert state == step
    self.events.append(("save", step, scheduled))

  def stopped(self, step, reason):
    self.events.append(("stopped", step, reason))


class _Stop:
  def __init__(self, at=None):
    self.at, self.step, self.requested = at, 0, None

  def agreed(self, due):
    self.step += 1
    if self.at is not None and self.step >= self.at:
      self.requested = "SIGTERM"
    return self.requested if due else None


def _of(events, kind):
  return [e[1] for e in events if e[0] == kind]


def test_checks_run_one_step_late_and_every_save_is_checked_first():
  cohort = _Recording()
  step, stopped = run_steps(cohort, 0, Schedule(0, 10, 4, 5, 6), _Stop())
  assert (step, stopped) == (10, None)
  assert _of(cohort.events, "check") == list(range(1, 11))
  assert _of(cohort.events, "log") == [1, 4, 8, 10]
  assert _of(cohort.events, "eval") == [5, 10]
  assert _of(cohort.events, "save") == [6, 10]
  # step 6 is saved only after its own loss was checked
  events = cohort.events
  assert events.index(("check", 6)) < events.index(("save", 6, True))
  # between log steps, step s is checked after step s + 1 was dispatched (never before it)
  assert events.index(("check", 2)) > events.index(("check", 1))


def test_a_resumed_run_logs_its_first_step_and_a_finished_level_saves_at_once():
  cohort = _Recording(finish_at=15)
  step, stopped = run_steps(cohort, 10, Schedule(10, 40, 4, 5, 20), _Stop())
  assert (step, stopped) == (15, None)
  assert _of(cohort.events, "log")[0] == 11
  assert ("save", 15, True) in cohort.events  # its level ends the run: a scheduled save


def test_a_stop_request_saves_at_the_next_agreed_step_and_leaves():
  cohort = _Recording()
  step, stopped = run_steps(cohort, 0, Schedule(0, 100, 4, 50, 50), _Stop(at=2))
  assert (step, stopped) == (4, "SIGTERM")
  assert cohort.events[-2:] == [("save", 4, True), ("stopped", 4, "SIGTERM")]


def test_a_non_finite_loss_is_never_saved():
  cohort = _Recording(nan_at=6)
  try:
    run_steps(cohort, 0, Schedule(0, 10, 4, 5, 6), _Stop())
  except ValueError as e:
    assert str(e) == "step 6"
  else:
    raise AssertionError("the NaN at step 6 was not caught")
  assert _of(cohort.events, "save") == []


class _Members(_Recording):
  """A cohort of which one member finishes at its level; the others train on."""

  def evaluate(self, state, step):
    self.events.append(("eval", step))
    return step == self.finish_at


def test_a_member_finishing_between_saves_is_saved_at_its_step_alone():
  cohort = _Members(finish_at=5)
  run_steps(cohort, 0, Schedule(0, 12, 4, 5, 6), _Stop())
  assert [e for e in cohort.events if e[0] == "save"] == [
      ("save", 5, False), ("save", 6, True), ("save", 12, True)]


def test_a_process_stopped_by_anothers_request_names_the_stop(monkeypatch):
  """With several processes, one that got no signal stops with the others and says why, so its
  run is a stopped run (no summary of a finished one), not a finished one."""
  import jax
  import numpy as np
  from jax.experimental import multihost_utils
  from diff_transformer.training import stop as stop_module
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda x: np.array([x, 1]))
  signal = stop_module.StopSignal()
  try:
    assert signal.agreed(due=False) is None  # other steps never wait on a gather
    assert signal.agreed(due=True) == stop_module.ANOTHER_PROCESS
  finally:
    signal.close()
