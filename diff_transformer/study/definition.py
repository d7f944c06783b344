"""A study: variants x seeds of one preset, each point an ordinary training run.

A study file (configs/studies/*.py) defines `STUDY = Study(...)` and `get_config =
STUDY.get_config`, so a point trains as `python train.py --config=<file>:<variant>-s<seed>`.
Seed s sets both data.seed (identical data order for every variant) and train.seed (init).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from diff_transformer.config import validate
from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import variant_names

BASELINE = "transformer"


@dataclasses.dataclass(frozen=True)
class Study:
  name: str
  make: Callable[[str], ml_collections.ConfigDict]  # variant -> full config
  seeds: tuple[int, ...] = (0, 1, 2)
  variants: tuple[str, ...] = variant_names()  # the built-in variants
  eval_rows: int = 512  # eval-split rows per task slice
  attention_rows: int = 32
  # --quick: these seeds and flat config overrides ("train.steps": 200), passed to every run.
  quick_seeds: tuple[int, ...] = (0, 1)
  quick_overrides: tuple[tuple[str, object], ...] = ()
  overrides: tuple[tuple[str, object], ...] = ()
  description: str = ""

  def quick(self) -> "Study":
    return dataclasses.replace(self, name=f"{self.name}-quick", seeds=self.quick_seeds,
                               overrides=self.quick_overrides,
                               eval_rows=min(self.eval_rows, 128),
                               attention_rows=min(self.attention_rows, 8))

  def points(self) -> list[str]:
    return [f"{v}-s{s}" for s in self.seeds for v in self.variants]

  def parse(self, point: str) -> tuple[str, int]:
    variant, _, seed = point.rpartition("-s")
    if variant not in self.variants or not seed.isdigit():
      raise ConfigError(f"study {self.name}: unknown point '{point}'; points are "
                        f"<variant>-s<seed> with variant in {list(self.variants)}")
    return variant, int(seed)

  def get_config(self, point: str) -> ml_collections.ConfigDict:
    variant, seed = self.parse(point)
    config = self.make(variant)
    config.data.seed = config.train.seed = seed
    for key, value in self.overrides:
      _set(config, key, value)
    config.source = f"study {self.name}, point {point}; " + config.source
    return config

  def override_args(self) -> tuple[str, ...]:
    """The overrides as train.py flags (the runs' own command lines carry them)."""
    return tuple(f"--config.{k}={v}" for k, v in self.overrides)

  def validate(self) -> "Study":
    """Every point builds a valid config; checked before any run starts."""
    if not self.seeds or len(set(self.seeds)) != len(self.seeds):
      raise ConfigError(f"study {self.name}: seeds must be distinct and non-empty, got "
                        f"{self.seeds}")
    unknown = [v for v in self.variants if v not in variant_names()]
    if unknown or not self.variants:
      raise ConfigError(f"study {self.name}: variants must be a non-empty subset of "
                        f"{variant_names()}, got {self.variants}")
    if self.eval_rows <= 0 or self.attention_rows <= 0:
      raise ConfigError(f"study {self.name}: eval_rows and attention_rows must be positive")
    for point in self.points():
      try:
        config = validate(self.get_config(point))
      except (ConfigError, ValueError, KeyError, AttributeError) as e:
        raise ConfigError(f"study {self.name}: point {point}: {e}") from None
      if config.data.name not in ("mqar", "needle"):
        raise ConfigError(f"study {self.name}: point {point} trains on '{config.data.name}'; "
                          "studies evaluate a synthetic task (data.name mqar or needle)")
    return self


def _set(config: ml_collections.ConfigDict, key: str, value) -> None:
  *path, last = key.split(".")
  node = config
  for part in path:
    node = node[part]
  if last not in node:
    raise ConfigError(f"study override '{key}': unknown config key")
  node[last] = value
