"""The train.py flags that pin what the in-process study decided on a child's command line (lr,
grid steps and seeds, overrides), so a child that loads the study file afresh trains exactly its
point."""
from __future__ import annotations

from diff_transformer.model.attention import nested_key
from diff_transformer.study.definition import Study


def lr_args(study: Study, point: str, lr: float) -> tuple[str, ...]:
  """train.py flags that run a compared point at `lr` (the preset's decay ratio kept)."""
  t = study.resolved_config(point, lr).train
  return (f"--config.train.lr={t.lr!r}", f"--config.train.final_lr={t.final_lr!r}")


def grid_args(study: Study, point: str) -> tuple[str, ...]:
  """train.py flags that pin a grid point's lr, steps and seed."""
  c = study.get_config(point)
  t = c.train
  return (f"--config.train.lr={t.lr!r}", f"--config.train.final_lr={t.final_lr!r}",
          f"--config.train.steps={t.steps}",
          f"--config.train.checkpoint_every={t.checkpoint_every}",
          f"--config.train.eval_every={t.eval_every}", f"--config.train.seed={t.seed}",
          f"--config.data.seed={c.data.seed}")


def _flags(study: Study, point: str, overrides) -> tuple[str, ...]:
  """`--config.<key>=<value>` flags, a variant's option (model.<option>) named in the point's
  variant's section as train.py's config has it."""
  variant = study.root_variant(study.parse(point).variant)
  return tuple(f"--config.{nested_key(k, variant) or k}={v}" for k, v in overrides)


def override_args(study: Study, point: str) -> tuple[str, ...]:
  """The overrides as train.py flags (the runs' own command lines carry them)."""
  stop = ((("train.stop_at_val_accuracy", study.level),) if study.stop_at_level and study.level
          else ())
  return _flags(study, point, study.overrides + stop)


def tuned_args(study: Study, point: str) -> tuple[str, ...]:
  """train.py flags that pin a decided tuned cell's chosen setting (a child loading the study
  file afresh does not know the choice)."""
  variant = study.parse(point).variant
  if variant not in study.decided_tuned:
    return ()
  cell = study.derived_cell(variant)
  chosen = study.derived_cell(cell.parent) if cell is not None else None
  return _flags(study, point, chosen.overrides) if chosen is not None else ()
