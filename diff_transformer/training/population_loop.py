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
others go on; a member that reaches its accuracy level is finished there. Members saved at
their last step but stopped before their summaries are evaluated and finished by the rerun.
"""
from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from diff_transformer import kernels
from diff_transformer.errors import TrainError
from diff_transformer.mesh import check_parallelism, make_mesh
from diff_transformer.model.attention import spec_from_config
from diff_transformer.runs import folder as run_folder
from diff_transformer.runs import record as run_record
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.lock import WorkdirLock, prepare_workdir
from diff_transformer.training.loop import start_logging
from diff_transformer.training.opening import open_data, open_run, record_start
from diff_transformer.training.population import Population
from diff_transformer.training.members import Member, Members, failed_before
from diff_transformer.training.schedule import Schedule, StepLoop
from diff_transformer.training.step import Trainer
from diff_transformer.training.stop import StopSignal

MEMBER_KEYS = ("train.seed", "data.seed", "train.lr", "train.final_lr")


def check_members(configs: list[ml_collections.ConfigDict]) -> list[float]:
  """Each member's lr as a multiple of member 0's; refuses members that differ in anything but
  MEMBER_KEYS, or whose final_lr is not in member 0's ratio to lr, and the cudnn kernel (one
  line each)."""
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
  if configs[0].model.kernel == "cudnn":
    raise TrainError("model.kernel: cudnn cannot train a population (jax's cuDNN attention does "
                     "not batch over members: packed rows, wider values, masks); use auto or "
                     "pallas")
  return [float(c.train.lr / configs[0].train.lr) for c in configs]


def train_population(configs: list[ml_collections.ConfigDict], workdirs: list[str | Path],
                     name: str = "population") -> list[dict]:
  """Trains every member to its train.steps (resuming if their folders hold checkpoints);
  returns each member's summary (as train() returns it; a failed member's holds `failed`)."""
  configs = [copy.deepcopy(c) for c in configs]
  paths = [Path(w).expanduser().resolve() for w in workdirs]
  if not configs or len(configs) != len(paths):
    raise TrainError(f"population: {len(configs)} configs for {len(paths)} workdirs")
  if len(set(paths)) != len(paths):
    raise TrainError("population: two members share a workdir")
  if jax.process_count() > 1:
    raise TrainError("population: trains in one process on one device; run multi-process "
                     "training with train.py")
  scales = check_members(configs)
  for path in paths:
    prepare_workdir(path)
  with contextlib.ExitStack() as held:
    for path in paths:
      lock = WorkdirLock(path)
      notice = lock.acquire()
      held.callback(lock.release)
      if notice:
        print(f"warning: {path}: {notice}", flush=True)
    return _train(configs, paths, scales, name)


def _open(configs, workdirs, scales, name: str):
  """(members, population, stacked state): data, records, and the state of the members still
  training, resumed at the newest step every one of them holds (None, None: none is left)."""
  datasets = [open_data(c) for c in configs]
  spec = spec_from_config(configs[0].model)
  mesh = make_mesh(configs[0].mesh, jax.devices()[:1])
  check_parallelism(configs[0], mesh, spec)
  trainer = Trainer(configs[0], mesh, spec)
  members = []
  for i, (config, workdir, dataset) in enumerate(zip(configs, workdirs, datasets)):
    batch_change = run_record.check_run_record(workdir, config, dataset.tokenizer)
    run = open_run(config, workdir, dataset, mesh, trainer, batch_change)
    member = Member(index=i, slot=None, run=run)
    member.failed = failed_before(workdir)
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
      found = m.run.checkpointer.restore(trainer.abstract_state, m.run.iterator, step=start)
      if found is None:  # committed_steps listed it a moment ago
        raise TrainError(f"{m.run.workdir}: checkpoint step {start} is gone; rerun to resume")
      states.append(found[0])
  state = jax.tree.map(lambda *xs: jnp.stack(xs), *states) if start else population.init()
  for m in live:
    record_start(m.run, None, start, resumed=bool(start))  # the state: the population's, stacked
    with open(RunFolder(m.run.workdir).log, "a") as log:
      log.write(f"member {m.index} of {name} ({len(members)} members, one program); its "
                f"output is the population's log\n")
  if start:
    print(f"Resumed {len(live)} training members from checkpoint step {start}", flush=True)
  return members, population, state


def _train(configs, workdirs, scales, name: str) -> list[dict]:
  everyone, population, state = _open(configs, workdirs, scales, name)
  live = [m for m in everyone if m.slot is not None]
  if not live:
    return [dict(step=0, failed=m.failed) for m in everyone]
  start, t = live[0].run.start, configs[0].train
  for m in live:
    with kernels.auto.population_members():  # the kernel and FLOPs it logs: the population's
      m.logger, m.window = start_logging(m.run, bar=False)
    m.logger.write(start, dict(population=name, member=m.index, members=len(everyone)),
                   kind="population")
    m.summary = dict(step=start, stopped_by=None)
  stop = StopSignal()
  members = Members(live, tqdm(total=t.steps, initial=start, dynamic_ncols=True, unit="step",
                               mininterval=1.0, desc=name))
  loop = StepLoop(members, Schedule.from_config(t, start), stop)
  try:
    if start >= t.steps:  # saved at the last step, stopped before the summaries were written
      members.evaluate(state, start)
    while loop.going:
      local = [next(m.run.iterator) for m in live]  # every member's own batch, stacked
      batches = jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *local))
      state, metrics = population.members_step(state, batches, members.training_mask)
      loop.after_step(state, batches, metrics)
  finally:
    stop.close()
    members.close()
  members.finish(loop.stopped_by, (name, len(everyone)))
  return [dict(m.summary, failed=m.failed) if m.failed else m.summary for m in everyone]
