"""The train stage's memory fit, decided by compiling before anything runs: each cell's compiled
peak against what jax may take, and the lighter launches of aot/plan.py for a cell over it."""
from __future__ import annotations

import jax
import ml_collections

from benchmarks.gpu_check.common import compile_all
from diff_transformer.aot import peak_bytes
from diff_transformer.aot.gpu import FIXED_MARGIN_BYTES, GIB
from diff_transformer.aot.plan import lighter
from diff_transformer.mesh import data_parallel_size
from diff_transformer.training.step import Trainer


def compiled_gib(executable) -> float | None:
  """A compiled step's peak per device (arguments + outputs + temporaries - aliased), GiB."""
  mem = executable.memory_analysis()
  return None if mem is None else peak_bytes(mem) / GIB


def fit_to_memory(runs: list[dict], compiled: dict, limit: int | None) -> None:
  """Before anything runs: each cell's compiled peak (`compiled_gib`, on this device: cuDNN's
  workspace counted, as the deviceless compile of aot_compile.py cannot) against the memory
  jax may take (`limit`, XLA_PYTHON_CLIENT_MEM_FRACTION of the device's) less a margin. A cell
  over it is compiled again at each lighter launch in aot/plan.py's order (fewer sequences per
  micro-batch, the step accumulating gradients over the rest; then remat 'full') and takes the
  first that fits (the cells still over compile their next launch together); none fits: it is
  refused with the last peak, and nothing of it runs. Every launch tried is in the cell's
  `fit_tried`. Without a limit (CPU) the peaks are only recorded."""
  pending = {}  # cell index -> the lighter launches it has not tried yet
  for i, r in enumerate(runs):
    if isinstance(compiled[i], BaseException) or "trainer" not in r:
      continue
    trainer = r["trainer"]
    r.update(remat=trainer.config.model.remat, micro_batches=trainer.micro_batches,
             compiled_gib=compiled_gib(compiled[i]))
    if not _fits(r["compiled_gib"], limit):
      r["fit_tried"] = [dict(remat=r["remat"], micro_batches=r["micro_batches"],
                             compiled_gib=r["compiled_gib"])]
      launches = lighter(trainer.config, data_parallel_size(trainer.mesh))
      if launches:
        pending[i] = launches
      else:
        compiled[i] = _refused(r, limit)
  while pending:
    trainers: dict[int, Trainer] = {}
    lowered: dict[int, jax.stages.Lowered | Exception] = {}
    for i, launches in pending.items():
      remat, _, micro = launches.pop(0)
      config = ml_collections.ConfigDict(runs[i]["trainer"].config.to_dict())
      config.model.remat, config.train.micro_batches = remat, micro
      try:
        trainers[i] = Trainer(config, runs[i]["trainer"].mesh)
        lowered[i] = trainers[i].lower_train_step(runs[i]["data"])
      except Exception as e:  # recorded per cell
        lowered[i] = e
    for i, step in compile_all(lowered, 16).items():
      r = runs[i]
      if isinstance(step, BaseException):
        compiled[i] = step
        del pending[i]
        continue
      peak, trainer = compiled_gib(step), trainers[i]
      r["fit_tried"].append(dict(remat=trainer.config.model.remat,
                                 micro_batches=trainer.micro_batches, compiled_gib=peak))
      if _fits(peak, limit):
        r.update(trainer=trainer, remat=trainer.config.model.remat,
                 micro_batches=trainer.micro_batches, compiled_gib=peak)
        compiled[i] = step
        del pending[i]
      elif not pending[i]:
        compiled[i] = _refused(r, limit)
        del pending[i]


def _refused(cell: dict, limit) -> MemoryError:
  last = cell["fit_tried"][-1]  # the lightest launch tried
  return MemoryError(f"refused before running: compiled peak {last['compiled_gib']:.1f} GiB "
                     f"(remat {last['remat']}, {last['micro_batches']} micro-batches) + "
                     f"{FIXED_MARGIN_BYTES / GIB:.0f} GiB margin over the {limit / GIB:.1f} GiB "
                     "jax may take")


def _fits(peak_gib: float | None, limit: int | None) -> bool:
  return not limit or peak_gib is None or peak_gib * GIB + FIXED_MARGIN_BYTES <= limit
