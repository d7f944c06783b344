"""A run's model for the programs that read runs: evaluation, export, lm-eval."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import ml_collections

from diff_transformer.config import validate
from diff_transformer.errors import TrainError
from diff_transformer.model.attention import spec_from_config
from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.runs.folder import CONFIG
from diff_transformer.runs.layout import ModelLayout
from diff_transformer.runs.record import check_tokenizer_record, read_config
from diff_transformer.mesh import make_mesh


def restore_model(workdir: str | Path, step: int | None = None,
                  mesh: jax.sharding.Mesh | None = None, tokenizer=None
                  ) -> tuple[Any, ml_collections.ConfigDict, int]:
  """(model, config, step): the model of a training workdir, restored onto `mesh`.

  Only the model arrays are read (never the optimizer), straight into the target shardings of
  `mesh` (default: one device). The tokenizer record is checked against `tokenizer` when given,
  otherwise against the workdir's own tokenizer copy. Uses the newest readable checkpoint unless
  `step` is given.
  """
  workdir = Path(workdir)
  config = read_config(workdir)
  if config is None:
    raise TrainError(f"{workdir / CONFIG}: missing; {workdir} is not a training workdir")
  validate(config)
  check_tokenizer_record(workdir, tokenizer)
  if mesh is None:
    mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)),
                     devices=jax.devices()[:1])
  layout = ModelLayout(spec_from_config(config.model), mesh)  # no optimizer is built
  checkpointer = Checkpointer(workdir, read_only=True)
  found = checkpointer.restore(layout.abstract, step=step, model_only=True)
  if found is None:
    raise TrainError(f"{checkpointer.directory}: no checkpoint to restore")
  state, step = found
  return layout.model(state), config, step
