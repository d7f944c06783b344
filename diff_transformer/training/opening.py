"""A run opened from config + workdir, before its first step: the data (read-only), the run
record's checks, the mesh, the trainer, the data iterator, the checkpointer and the state
(resumed from the newest readable checkpoint, or initialised, or converted from a Hugging Face
folder). Everything that can refuse comes before the state is built. A population opens each
member with `open_run` and `record_start` (training/population_loop.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import ml_collections

from diff_transformer import data
from diff_transformer.errors import TrainError
from diff_transformer.mesh import check_parallelism, make_mesh
from diff_transformer.model.attention import (recorded_variant, section, spec_from_config,
                                              variant_class)
from diff_transformer.runs import record as run_record
from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.runs.folder import RunFolder
from diff_transformer.training.step import Trainer


def _start_from(trainer: Trainer, state, params: dict, source: str, checkpointer: Checkpointer,
                iterator):
  """The fresh state with its parameters replaced by `params` (flat names, e.g. from an HF
  folder), in the same shardings, saved as checkpoint step 0 (so the starting weights are on
  record and eval.py can read them)."""
  def take(path, leaf):
    name = ".".join(str(k.key) for k in path)
    if name not in params:
      raise TrainError(f"init_from_hf: {source} gives no value for parameter {name}")
    value = params[name]
    if value.shape != leaf.shape:
      raise TrainError(f"init_from_hf: parameter {name} has shape {value.shape} in {source}, "
                       f"this config needs {leaf.shape}")
    return jax.device_put(value.astype(leaf.dtype), leaf.sharding)

  state = dict(state, params=jax.tree_util.tree_map_with_path(take, state["params"]))
  checkpointer.save(0, state, iterator)
  checkpointer.wait()
  print(f"Initialised from {source}; saved as checkpoint step 0", flush=True)
  return state


@dataclasses.dataclass
class Run:
  """What the step loop works on, opened (and resumed or initialised) from config + workdir."""
  config: ml_collections.ConfigDict
  workdir: Path
  dataset: Any
  mesh: jax.sharding.Mesh
  trainer: Trainer
  iterator: Any
  checkpointer: Checkpointer
  state: Any
  start: int
  resumed: bool
  batch_change: tuple[int, int] | None  # (recorded, new) global batch size of a resume
  code_change: dict | None  # the code version a resume replaced (run_folder.CODE_VERSION)


def _record_variant(config: ml_collections.ConfigDict) -> None:
  """A variant registered from user code is run (and recorded) as module:Class, so eval.py,
  export.py and lm-eval can import it to restore the run."""
  name = config.model.variant
  recorded = recorded_variant(name)
  if recorded != name:  # its own options move to the recorded name's section
    variant_class(recorded)  # registered under that name too: its section is a model key
    config.model[section(recorded)] = config.model[section(name)]
    del config.model[section(name)]
  config.model.variant = recorded
  if variant_class(name).__module__ == "__main__":
    print(f"warning: model.variant '{name}' is defined in __main__; programs that restore this "
          "run cannot import it (define it in a module)", flush=True)


def open_data(config: ml_collections.ConfigDict):
  """The run's dataset, opened read-only (train.py prepares it first: data.ensure_prepared);
  fills in what the run records (the variant's recorded name, the vocabulary from the
  tokenizer) in `config`, refusing a vocabulary too small for the data."""
  _record_variant(config)
  dataset = data.open_dataset(config.data)
  if config.model.vocab_multiple:  # rows from the tokenizer (config.py); recorded as padding
    config.model.vocab_size = data.padded_vocab_size(dataset.vocab_size,
                                                     config.model.vocab_multiple)
  if dataset.vocab_size > config.model.vocab_size:
    raise TrainError(f"model.vocab_size: {config.model.vocab_size} is smaller than the "
                     f"{dataset.tokenizer.name} tokenizer's {dataset.vocab_size} ids")
  return dataset


def open_run(config: ml_collections.ConfigDict, workdir: Path, dataset, mesh, trainer: Trainer,
             batch_change: tuple[int, int] | None) -> Run:
  """The run before its state: its data iterator and checkpointer (a population opens each
  member this way)."""
  iterator = data.train_iterator(dataset, config.data, config.train.global_batch_size,
                                 jax.process_index(), jax.process_count(), seed=config.data.seed)
  return Run(config, workdir, dataset, mesh, trainer, iterator, Checkpointer(workdir, config.train),
             None, 0, resumed=False, batch_change=batch_change, code_change=None)


def record_start(run: Run, state, start: int, resumed: bool) -> None:
  """The run starts (or, `resumed` from a checkpoint, goes on) at `start` from `state`: its
  record and code version say so. A checkpoint at step 0 (an HF import) is a resume too."""
  run.state, run.start, run.resumed = state, start, resumed
  run_record.write_run_record(run.workdir, run.config, run.dataset)
  run.code_change = run_record.record_code_version(run.workdir, start)


def open_alone(config: ml_collections.ConfigDict, workdir: Path, start_params=None) -> Run:
  """Data, run record checks, mesh, state: everything that can refuse comes before the state."""
  dataset = open_data(config)
  batch_change = run_record.check_run_record(workdir, config, dataset.tokenizer)
  spec = spec_from_config(config.model)
  params = None
  if config.init_from_hf and not any(RunFolder(workdir).checkpoints.glob("*")):
    if start_params is None:
      raise TrainError("init_from_hf: train() got no start_params to convert "
                       f"{config.init_from_hf} with; run train.py, which converts the folder")
    params = start_params(spec)  # a wrong folder: one line, before any state is built
  mesh = make_mesh(config.mesh)
  check_parallelism(config, mesh, spec)
  trainer = Trainer(config, mesh, spec)
  run = open_run(config, workdir, dataset, mesh, trainer, batch_change)
  found = run.checkpointer.restore(trainer.abstract_state, run.iterator)
  if found is not None:
    print(f"Resumed from checkpoint step {found[1]} in {run.checkpointer.directory}", flush=True)
  state, start = found or (trainer.init(), 0)
  record_start(run, state, start, resumed=found is not None)
  if found is None and params is not None:
    run.state = _start_from(trainer, run.state, params, config.init_from_hf, run.checkpointer,
                            run.iterator)
  return run
