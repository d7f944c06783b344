"""A sweep: variants x sizes x token budgets, each point an ordinary training run.

A sweep file (configs/sweeps/*.py) defines `SWEEP = Sweep(...)` and exposes
`get_config = SWEEP.get_config`, so a point trains as
`python train.py --config=configs/sweeps/cpu.py:<variant>-<size>-<budget> --workdir=...`.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import ml_collections

from diff_transformer.config import validate
from diff_transformer.errors import ConfigError, UserError
from diff_transformer.model.attention import PAPER_VARIANTS, known_variant, variant_names


class SweepError(UserError, RuntimeError):
  """A sweep that cannot run or report (a failed point, no finished points); one line."""


@dataclasses.dataclass(frozen=True)
class Sweep:
  name: str
  # size name -> function(variant) -> full config (a preset, or a base config with overrides)
  sizes: dict[str, Callable[[str], ml_collections.ConfigDict]]
  # budget name -> training steps (tokens = steps * global_batch_size * seq_len)
  budgets: dict[str, int]
  variants: tuple[str, ...] = PAPER_VARIANTS  # others only when listed
  # Explicit (size, budget) pairs to run; default: every size at every budget.
  grid: tuple[tuple[str, str], ...] = ()

  def points(self) -> list[str]:
    pairs = self.grid or tuple(itertools.product(self.sizes, self.budgets))
    return [f"{v}-{s}-{b}" for s, b in pairs for v in self.variants]

  def parse(self, point: str) -> tuple[str, str, str]:
    variant, rest = point.split("-", 1) if "-" in point else (point, "")
    size, _, budget = rest.rpartition("-")
    if variant not in self.variants or size not in self.sizes or budget not in self.budgets:
      raise ConfigError(f"sweep {self.name}: unknown point '{point}'; points are "
                        f"<variant>-<size>-<budget> with variant in {list(self.variants)}, size in "
                        f"{list(self.sizes)}, budget in {list(self.budgets)}")
    return variant, size, budget

  def get_config(self, point: str) -> ml_collections.ConfigDict:
    variant, size, budget = self.parse(point)
    config = self.sizes[size](variant)
    config.train.steps = self.budgets[budget]
    config.train.warmup_steps = min(config.train.warmup_steps, max(1, config.train.steps // 10))
    config.source = f"sweep {self.name}, point {point}; " + config.source
    return config

  def validate(self) -> "Sweep":
    """Every point builds a valid config; checked before any run starts."""
    for budget, steps in self.budgets.items():
      if not isinstance(steps, int) or steps <= 0:
        raise ConfigError(f"sweep {self.name}: budget '{budget}' must be a positive number of "
                          f"steps, got {steps}")
    for size, budget in self.grid:
      if size not in self.sizes or budget not in self.budgets:
        raise ConfigError(f"sweep {self.name}: grid entry ({size}, {budget}) names an unknown "
                          "size or budget")
    unknown = [v for v in self.variants if not known_variant(v)]
    if unknown:
      raise ConfigError(f"sweep {self.name}: unknown variant(s) {unknown}; choose from "
                        f"{variant_names()} or module:Class")
    for point in self.points():
      try:
        validate(self.get_config(point))
      except (ConfigError, ValueError) as e:
        raise ConfigError(f"sweep {self.name}: point {point}: {e}") from None
    return self


def tokens(config: ml_collections.ConfigDict) -> int:
  return config.train.steps * config.train.global_batch_size * config.data.seq_len
