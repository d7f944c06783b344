"""A study: variants x seeds (x sizes) of one setting, each point an ordinary training run.

A study file (configs/studies/*.py) defines `STUDY = Study(...)` and `get_config =
STUDY.get_config`, so a point trains as `python train.py --config=<file>:<point>`. Points:

- `<variant>[-<size>]-s<seed>`: a compared run. Seed s sets both data.seed (the same data order
  for every variant) and train.seed (init).
- `<variant>[-<size>]-lr<lr>`: a learning-rate grid run (`lr_grid_steps` steps, seed
  `lr_grid_seed`, which no compared run uses, so the lr is not picked on the seeds that are then
  compared). Each variant is compared at its own best grid lr (lowest final val loss).

The runner pins what the in-process study decided (lr, grid steps and seed, overrides) on each
child's command line, so a child that loads the study file afresh trains exactly that point.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
from typing import Callable

import ml_collections

from diff_transformer.config import validate
from diff_transformer.data import synthetic
from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import PAPER_VARIANTS, known_variant, variant_names

BASELINE = "transformer"


@dataclasses.dataclass(frozen=True)
class Study:
  name: str
  # variant -> full config; with `sizes`, (variant, size) -> full config
  make: Callable[..., ml_collections.ConfigDict]
  seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
  variants: tuple[str, ...] = PAPER_VARIANTS
  sizes: tuple[str, ...] = ()  # model sizes (LM studies); empty: one setting
  # The one metric named before the run; every other comparison is secondary (Holm-corrected).
  primary: str = "steps_to_90"
  lr_grid: tuple[float, ...] = ()  # empty: every variant at its preset's lr
  lr_grid_steps: int = 0  # 0: the compared runs' steps
  lr_grid_seed: int = 1000
  lr_grid_size: str = ""  # with sizes: run the grid at this size only and use its lr at every size
  eval_rows: int = 512  # eval-split rows per task slice
  attention_rows: int = 32
  # --quick: these seeds, grid and flat config overrides ("train.steps", 200) for every run.
  quick_seeds: tuple[int, ...] = (0, 1)
  quick_lr_grid: tuple[float, ...] = ()
  quick_overrides: tuple[tuple[str, object], ...] = ()
  overrides: tuple[tuple[str, object], ...] = ()
  description: str = ""

  def quick(self) -> "Study":
    return dataclasses.replace(self, name=f"{self.name}-quick", seeds=self.quick_seeds,
                               lr_grid=self.quick_lr_grid, lr_grid_steps=0,
                               overrides=self.overrides + self.quick_overrides,
                               eval_rows=min(self.eval_rows, 128),
                               attention_rows=min(self.attention_rows, 8))

  def with_options(self, *, sets: tuple[str, ...] = (), variants: str = "", seeds: str = "",
                   name: str = "") -> "Study":
    """The study with study.py's command-line options folded in (`--set key=value` appended to
    the overrides; `--variants a,b`; `--seeds 0,1,2`; `--name`)."""
    study = self
    if sets:
      study = dataclasses.replace(study, overrides=study.overrides + tuple(map(_parse_set, sets)))
    if variants:
      study = dataclasses.replace(study, variants=tuple(v.strip() for v in variants.split(",")))
    if seeds:
      try:
        study = dataclasses.replace(study, seeds=tuple(int(s) for s in seeds.split(",")))
      except ValueError:
        raise ConfigError(f"--seeds: '{seeds}' is not a comma-separated list of integers") from None
    return dataclasses.replace(study, name=name) if name else study

  def cells(self) -> list[tuple[str, str]]:
    """(variant, size) pairs; size '' for a study without sizes."""
    return [(v, s) for s in (self.sizes or ("",)) for v in self.variants]

  @staticmethod
  def cell_name(variant: str, size: str) -> str:
    return f"{variant}-{size}" if size else variant

  def points(self) -> list[str]:
    return [f"{self.cell_name(v, z)}-s{s}" for s in self.seeds for v, z in self.cells()]

  def grid_points(self) -> list[str]:
    cells = [(v, z) for v, z in self.cells() if not self.lr_grid_size or z == self.lr_grid_size]
    return [f"{self.cell_name(v, z)}-lr{lr:g}" for v, z in cells for lr in self.lr_grid]

  def grid_cell(self, point: str) -> str:
    """The grid cell whose best lr a compared point trains at."""
    variant, size, _, _ = self.parse(point)
    return self.cell_name(variant, self.lr_grid_size or size)

  def parse(self, point: str) -> tuple[str, str, str, float]:
    """(variant, size, 's' | 'lr', seed or learning rate)."""
    cell, kind, value = point.rpartition("-s")
    if not value.isdigit():
      cell, kind, value = point.rpartition("-lr")
    variant, _, size = cell.partition("-")
    number = _number(value, int if kind == "-s" else float)
    if variant not in self.variants or size not in (self.sizes or ("",)) or not number:
      raise ConfigError(f"study {self.name}: unknown point '{point}'; points are "
                        f"<variant>{'-<size>' if self.sizes else ''}-s<seed> or -lr<lr> "
                        f"with variant in {list(self.variants)}"
                        + (f", size in {list(self.sizes)}" if self.sizes else ""))
    return variant, size, kind.lstrip("-"), number[0]

  def get_config(self, point: str) -> ml_collections.ConfigDict:
    variant, size, kind, index = self.parse(point)
    config = self.make(variant, size) if self.sizes else self.make(variant)
    for key, value in self.overrides:
      _set(config, key, value)
    t = config.train
    seed = index
    if kind == "lr":
      t.final_lr = t.final_lr / t.lr * index  # keep the preset's decay ratio
      t.lr, seed = index, self.lr_grid_seed
      if self.lr_grid_steps:
        t.steps = t.checkpoint_every = self.lr_grid_steps
        t.eval_every = min(t.eval_every, t.steps)
    config.data.seed = t.seed = seed
    config.source = f"study {self.name}, point {point}; " + config.source
    return config

  def lr_args(self, point: str, lr: float) -> tuple[str, ...]:
    """train.py flags that run a compared point at `lr` (the preset's decay ratio kept)."""
    t = self.get_config(point).train
    return (f"--config.train.lr={lr!r}", f"--config.train.final_lr={t.final_lr / t.lr * lr!r}")

  def grid_args(self, point: str) -> tuple[str, ...]:
    """train.py flags that pin a grid point's lr, steps and seed."""
    c = self.get_config(point)
    t = c.train
    return (f"--config.train.lr={t.lr!r}", f"--config.train.final_lr={t.final_lr!r}",
            f"--config.train.steps={t.steps}", f"--config.train.checkpoint_every={t.checkpoint_every}",
            f"--config.train.eval_every={t.eval_every}", f"--config.train.seed={t.seed}",
            f"--config.data.seed={c.data.seed}")

  def override_args(self) -> tuple[str, ...]:
    """The overrides as train.py flags (the runs' own command lines carry them)."""
    return tuple(f"--config.{k}={v}" for k, v in self.overrides)

  @functools.cached_property
  def is_task(self) -> bool:
    return self.get_config(self.points()[0]).data.name in synthetic.TASKS

  def validate(self) -> "Study":
    """Every point builds a valid config; checked before any run starts."""
    if not self.seeds or len(set(self.seeds)) != len(self.seeds):
      raise ConfigError(f"study {self.name}: seeds must be distinct and non-empty, got "
                        f"{self.seeds}")
    unknown = [v for v in self.variants if not known_variant(v)]
    if unknown or not self.variants or len(set(self.variants)) != len(self.variants):
      raise ConfigError(f"study {self.name}: variants must be distinct, non-empty and "
                        f"registered ({', '.join(variant_names())}) or module:Class, got "
                        f"{self.variants}")
    if self.eval_rows <= 0 or self.attention_rows <= 0:
      raise ConfigError(f"study {self.name}: eval_rows and attention_rows must be positive")
    if self.lr_grid_size and self.lr_grid_size not in self.sizes:
      raise ConfigError(f"study {self.name}: lr_grid_size '{self.lr_grid_size}' is not one of "
                        f"the sizes {list(self.sizes)}")
    if any(not lr > 0 for lr in self.lr_grid) or self.lr_grid_seed in self.seeds:
      raise ConfigError(f"study {self.name}: lr_grid must be positive and lr_grid_seed "
                        f"({self.lr_grid_seed}) not one of the compared seeds")
    for point in self.points() + self.grid_points():
      try:
        config = validate(self.get_config(point))
      except (ConfigError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise ConfigError(f"study {self.name}: point {point}: {e}") from None
      if config.data.name not in synthetic.TASKS and self.primary.startswith("steps_to"):
        raise ConfigError(f"study {self.name}: point {point} trains on text; primary metric "
                          f"'{self.primary}' needs a synthetic task")
    return self


def _number(text: str, kind: type) -> tuple | None:
  """(value,) when text is a non-negative `kind` (a seed, or a positive lr), else None."""
  try:
    value = kind(text)
  except ValueError:
    return None
  return (value,) if value >= 0 and (kind is int or value > 0) else None


def _parse_set(text: str) -> tuple[str, object]:
  key, sep, raw = text.partition("=")
  if not sep or not key.strip():
    raise ConfigError(f"--set: '{text}' is not key=value (e.g. data.task.num_keys=5)")
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    value = raw  # a bare string (e.g. a variant or tokenizer name)
  return key.strip(), value


def _set(config: ml_collections.ConfigDict, key: str, value) -> None:
  *path, last = key.split(".")
  node = config
  for part in path:
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      raise ConfigError(f"study override '{key}': unknown config key")
    node = node[part]
  if last not in node:
    raise ConfigError(f"study override '{key}': unknown config key")
  try:
    node[last] = value
  except TypeError as e:
    raise ConfigError(f"study override '{key}': {e}") from None
