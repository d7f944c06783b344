"""`train_population(configs, workdirs)`: the members of one study cell (its seeds, or a grid's
lrs and seeds) trained by one compiled program (training/population.py) on one device, each
written to its own run folder as train.py would write it alone.

Members may differ only in train.seed, data.seed and train.lr (final_lr in the same ratio).
Each member keeps its standalone run's init and data order (its own grain iterator), its
metrics log, evaluations, checkpoints (model, optimizer and data state, in its own folder),
summary and code record; its summary also names the population. Every member saves at the same
steps, so the population resumes from the newest step all members hold, exactly; a member's
checkpoints past that step (a kill between two members' saves) are set aside, never deleted. A
member that diverges is held, its error goes to its log (the line a study records), and the
others go on; a member that reaches its accuracy level is finished there.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from diff_transformer import data
from diff_transformer.errors import TrainError
from diff_transformer.mesh import check_parallelism, make_mesh
from diff_transformer.model.spec import ModelSpec
from diff_transformer.runs import folder as run_folder
from diff_transformer.runs import record as run_record
from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.lock import WorkdirLock, prepare_workdir
from diff_transformer.training import validation
from diff_transformer.training.guard import DivergenceGuard
from diff_transformer.training.loop import Run, finish, open_data, start_logging
from diff_transformer.training.metrics import MetricsLogger, RateWindow, expand_layers
from diff_transformer.training.population import Population
from diff_transformer.training.step import Trainer
from diff_transformer.training.stop import StopSignal

MEMBER_KEYS = ("train.seed", "data.seed", "train.lr", "train.final_lr")


@dataclasses.dataclass
class _Member:
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


def check_members(configs: list[ml_collections.ConfigDict]) -> list[float]:
  """Each member's lr as a multiple of member 0's; refuses members that differ in anything but
  MEMBER_KEYS, or whose final_lr is not in member 0's ratio to lr (one line each)."""
  def shared(config):
    return {k: v for k, v in run_record.setting(config).items() if k not in MEMBER_KEYS}
  first, ratio = shared(configs[0]), configs[0].train.final_lr / configs[0].train.lr
  for i, config in enumerate(configs[1:], 1):
    diff = run_record.differences(first, shared(config))
    if diff:
      key, theirs, ours = diff[0]
      raise TrainError(f"population: member {i} has {key}={theirs!r}, member 0 {ours!r}; "
                       f"members may differ only in {', '.join(MEMBER_KEYS)}")
    if not math.isclose(config.train.final_lr / config.train.lr, ratio, rel_tol=1e-9):
      raise TrainError(f"population: member {i}'s train.final_lr / train.lr is "
                       f"{config.train.final_lr / config.train.lr:g}, member 0's {ratio:g}; a "
                       "member's lr scales the whole schedule")
    if config.init_from_hf:
      raise TrainError("init_from_hf: a population member cannot start from a Hugging Face "
                       "folder; train it with train.py")
  return [float(c.train.lr / configs[0].train.lr) for c in configs]


def train_population(configs: list[ml_collections.ConfigDict], workdirs: list[str | Path],
                     name: str = "population") -> list[dict]:
  """Trains every member to its train.steps (resuming if their folders hold checkpoints);
  returns each member's summary (as train() returns it; a failed member's holds `failed`)."""
  configs = [copy.deepcopy(c) for c in configs]
  workdirs = [Path(w).expanduser().resolve() for w in workdirs]
  if not configs or len(configs) != len(workdirs):
    raise TrainError(f"population: {len(configs)} configs for {len(workdirs)} workdirs")
  if len(set(workdirs)) != len(workdirs):
    raise TrainError("population: two members share a workdir")
  if jax.process_count() > 1:
    raise TrainError("population: trains in one process on one device; run multi-process "
                     "training with train.py")
  scales = check_members(configs)
  for workdir in workdirs:
    prepare_workdir(workdir)
  with contextlib.ExitStack() as held:
    for workdir in workdirs:
      lock = WorkdirLock(workdir)
      notice = lock.acquire()
      held.callback(lock.release)
      if notice:
        print(f"warning: {workdir}: {notice}", flush=True)
    return _train(configs, workdirs, scales, name)


def _open(configs, workdirs, scales, name: str):
  """(members, population, stacked state): data, records, and the state of the members still
  training, resumed at the newest step every one of them holds (None, None: none is left)."""
  datasets = [open_data(c) for c in configs]
  spec = ModelSpec.from_config(configs[0].model)
  mesh = make_mesh(configs[0].mesh, jax.devices()[:1])
  check_parallelism(configs[0], mesh, spec)
  trainer = Trainer(configs[0], mesh, spec)
  members = []
  for i, (config, workdir, dataset) in enumerate(zip(configs, workdirs, datasets)):
    batch_change = run_record.check_run_record(workdir, config, dataset.tokenizer)
    iterator = data.train_iterator(dataset, config.data, config.train.global_batch_size,
                                   seed=config.data.seed)
    checkpointer = Checkpointer(workdir, config.train)
    run = Run(config, workdir, dataset, mesh, trainer, iterator, checkpointer, None, 0,
              resumed=False, batch_change=batch_change, code_change=None)
    member = _Member(i, None, run, DivergenceGuard(checkpointer, config.train.max_loss_spike))
    member.failed = _failed_before(workdir)
    members.append(member)
  live = [m for m in members if m.failed is None]
  if not live:
    return members, None, None
  for slot, m in enumerate(live):
    m.slot = slot
  population = Population(trainer, [int(m.run.config.train.seed) for m in live],
                          [scales[m.index] for m in live])
  common = set.intersection(*(set(m.run.checkpointer.committed_steps()) for m in live))
  start = max(common, default=0)
  states = []
  for m in live:
    ahead = [s for s in m.run.checkpointer.committed_steps() if s > start]
    if ahead:  # saved by this member, not by every member: recomputed exactly from `start`
      target = m.run.checkpointer.set_aside(ahead, run_folder.AHEAD_CHECKPOINTS)
      print(f"{m.run.workdir}: checkpoints {ahead} are ahead of the population's newest common "
            f"step {start}; moved to {target}", flush=True)
    if start:
      state, _ = m.run.checkpointer.restore(trainer.abstract_state, m.run.iterator, step=start)
      states.append(state)
  state = jax.tree.map(lambda *xs: jnp.stack(xs), *states) if start else population.init()
  for m, dataset in zip(members, datasets):
    if m.slot is None:
      continue
    run = m.run
    run.start, run.resumed, run.state = start, bool(start), None
    run_record.write_run_record(run.workdir, run.config, dataset)
    run.code_change = run_record.record_code_version(run.workdir, start)
    with open(RunFolder(run.workdir).log, "a") as log:
      log.write(f"member {m.index} of {name} ({len(members)} members, one program); its "
                f"output is the population's log\n")
  if start:
    print(f"Resumed the population of {len(members)} from checkpoint step {start}", flush=True)
  return members, population, state


def _member(state, slot: int):
  return jax.tree.map(lambda x: x[slot], state)


def _failed_before(workdir: Path) -> str | None:
  """The error of a member that failed in an earlier attempt (its last metrics row says so): a
  rerun does not train it again (it would diverge again, identically); the others resume."""
  rows = RunFolder(workdir).metric_rows()
  return rows[-1]["error"] if rows and rows[-1].get("kind") == "failed" else None


def _fail(m: _Member, step: int, error: Exception) -> None:
  """The member stops training; its error goes to its metrics log (a rerun reads it there) and
  its log (the line a study records)."""
  m.failed = str(error)
  m.logger.write(step, dict(error=m.failed), kind="failed")
  with open(RunFolder(m.run.workdir).log, "a") as log:
    log.write(f"error: {m.failed}\n")
  print(f"member {m.index} ({m.run.workdir.name}) failed: {m.failed}", flush=True)


def _check(m: _Member, step: int, values: dict) -> None:
  """The divergence guard on the member's step metrics (a member held as not finite fails)."""
  if not m.training:
    return
  try:
    m.guard.check_step(step, values)
  except TrainError as e:
    _fail(m, step, e)


def _train(configs, workdirs, scales, name: str) -> list[dict]:
  members, population, state = _open(configs, workdirs, scales, name)
  live = [m for m in members if m.slot is not None]
  if not live:
    return [dict(step=0, failed=m.failed) for m in members]
  start, t = live[0].run.start, configs[0].train
  for m in live:
    m.logger, m.window = start_logging(m.run, bar=False)
    m.logger.write(start, dict(population=name, member=m.index, members=len(members)),
                   kind="population")
    m.summary = dict(step=start, stopped_by=None)
  stop = StopSignal()
  bar = tqdm(total=t.steps, initial=start, dynamic_ncols=True, unit="step", mininterval=1.0,
             desc=name)
  try:
    stopped_by = _steps(live, population, state, start, t, stop, bar)
  finally:
    stop.close()
    bar.close()
    for m in live:
      m.run.checkpointer.close()
      m.logger.close()
  out = []
  for m in members:
    if m.failed:
      out.append(dict(m.summary, failed=m.failed))
      continue
    done = m.finished or stopped_by is None  # at its level, or at its last step
    m.summary["stopped_by"] = None if done else stopped_by
    if done and "val_loss" in m.summary:
      m.summary["population"] = dict(name=name, member=m.index, members=len(members))
      finish(m.run, m.summary)
    out.append(m.summary)
  return out


def _steps(members: list[_Member], population: Population, state, start: int, t, stop,
           bar) -> str | None:
  """The population's step loop: the standalone loop's schedule of logs, evaluations and saves,
  each member checked, evaluated and saved on its own."""
  step, pending = start, None
  trainer = population.trainer
  while step < t.steps and any(m.training for m in members):
    local = [next(m.run.iterator) for m in members]
    batches = jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *local))
    active = np.array([m.training for m in members])
    state, metrics = population.train_step(state, batches, active)
    step += 1
    for m in members:
      m.window.step()
    if pending is not None:  # one step late, so dispatch stays asynchronous
      _check_all(members, *pending)
    pending = (step, metrics)
    last = step == t.steps
    if step % t.log_every == 0 or last or step == start + 1:
      _check_all(members, *pending)
      pending = None
      _log(members, step, jax.device_get(metrics))
      bar.n = step
      bar.refresh()
    if step % t.eval_every == 0 or last:
      for m in members:
        if m.training:
          _evaluate(m, _member(state, m.slot), step)
    stopping = stop.agreed(True)
    if stopping or last or step % t.checkpoint_every == 0:
      if pending is not None:  # never save a NaN state
        _check_all(members, *pending)
        pending = None
      for m in members:
        if m.training or (m.finished and m.summary.get("step") == step):
          _save(m, _member(state, m.slot), _member(batches, m.slot), step)
    if stopping:
      print(f"{stop.requested}: saved checkpoint step {step} of every member; exiting",
            flush=True)
      return stop.requested
    for m in members:
      if m.training:
        m.summary["step"] = step
  return None


def _check_all(members: list[_Member], step: int, metrics) -> None:
  values = jax.device_get(dict(loss=metrics["loss"], grad_norm=metrics["grad_norm"]))
  for m in members:
    _check(m, step, {k: v[m.slot] for k, v in values.items()})


def _log(members: list[_Member], step: int, values: dict) -> None:
  """Each training member's row, as its standalone run logs it."""
  for m in members:
    if not m.training:
      continue
    row = {k: v[m.slot] for k, v in values.items() if k not in ("layers", "finite")}
    for layer_name, per_layer in values["layers"].items():
      row |= expand_layers(layer_name, per_layer[m.slot])
    rates = m.window.measure()
    row |= dict(perplexity=math.exp(min(float(row["loss"]), 80.0)), **rates)
    m.logger.write(step, row)
    m.summary.update(step=step, loss=float(row["loss"]), **rates)
    m.window.reset()


def _evaluate(m: _Member, state, step: int) -> None:
  run = m.run
  val = validation.metrics(run.trainer, state, run.dataset, run.config, run.mesh)
  m.logger.write(step, val, kind="val")
  m.summary.update(val, step=step)
  m.window.reset()
  level = run.config.train.stop_at_val_accuracy
  if level and val["val_accuracy"] >= level:
    m.summary["stopped_at_level"] = True
    m.finished = True  # saved at this step, summary written at the end


def _save(m: _Member, state, batch, step: int) -> None:
  run = m.run
  try:
    m.guard.check_state(step, validation.state_loss(run.trainer, state, batch,
                                                    run.config.train.micro_batches))
  except TrainError as e:
    _fail(m, step, e)
    return
  run.checkpointer.save(step, state, run.iterator)
  m.window.reset()
