"""The names a study is built from: a point, a derived cell, a tuned cell and its candidates
(study/tuning.py chooses among them)."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple


class Point(NamedTuple):
  variant: str
  size: str  # '' in a study without sizes
  seed: int
  lr: float | None  # a grid point's lr; None for a compared point


class Cell(NamedTuple):
  """A compared cell beyond the variants: `parent` (a variant or another cell) with config
  overrides, e.g. Cell("transformer@2x64", "transformer", (("model.num_heads", 2),
  ("model.head_dim", 64)), own_lr=True). An ablation (own_lr=False) trains at the lr its
  parent's grid chose; own_lr=True gives it a grid of its own."""
  name: str
  parent: str
  overrides: tuple[tuple[str, object], ...] = ()
  own_lr: bool = False


@dataclasses.dataclass(frozen=True)
class Tuned:
  """A compared cell whose setting of one config key is chosen on the grid seeds, as its lr is
  (study/tuning.py): each value a candidate cell with its own lr grid."""
  name: str  # the compared cell, e.g. "diff@tuned"
  parent: str  # a variant or a derived cell
  key: str  # the config key tuned, e.g. "model.norm_out_scale"
  values: tuple[str, ...]  # its candidate values, as the config takes them
  label: str = "scale"  # candidate cells are named <parent>@<label><value>
  extend: int = 1  # at most this many values added beyond either numeric end
  rule_at: float | None = None  # where a non-numeric value sits on the axis, if it does
  grown: tuple[str, ...] = ()  # values the growth added (the runner fills this in)
  # Another tuned cell's name: this one's values are that cell's chosen number /2, x1, x2 once
  # it is decided (its own `values` where that choice is not a number), named in advance.
  around: str = ""
  resolved: tuple[str, ...] = ()  # an `around` cell's values once known (the runner fills it)

  @property
  def base(self) -> tuple[str, ...]:
    """The values named before growth: its own, or (`around`) those its reference's choice
    gave, none until then."""
    return self.resolved if self.around else self.values

  @property
  def tried(self) -> tuple[str, ...]:
    return self.base + self.grown

  def reachable(self, values: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Every value the growth could add to `values` (default: its own; x2 steps beyond the
    named numeric ends), so a child process that loads the study afresh knows a grown
    candidate's cell."""
    values = self.values if values is None else values
    named = [x for x in map(number_or_none, values) if x is not None]
    if len(named) < 2:
      return values
    low = tuple(f"{min(named) / 2 ** i:g}" for i in range(1, self.extend + 1))
    high = tuple(f"{max(named) * 2 ** i:g}" for i in range(1, self.extend + 1))
    return values + low + high


def number_or_none(value: str) -> float | None:
  try:
    return float(value)
  except ValueError:
    return None


def around_values(value: str) -> tuple[str, ...] | None:
  """A choice's neighbours /2, x1, x2 (None where the choice is not a number)."""
  x = number_or_none(value)
  return None if x is None else (f"{x / 2:g}", value, f"{x * 2:g}")


def candidate(tuned: Tuned, value: str) -> str:
  return f"{tuned.parent}@{tuned.label}{value}"


def candidate_cells(tuned: tuple[Tuned, ...], reachable: bool = False) -> tuple[Cell, ...]:
  """The tuned cells' candidates: the parent with the key at each value tried (or, with
  `reachable`, each value the growth, or a choice it is `around`, could add), an lr grid each."""
  return tuple(Cell(candidate(t, v), t.parent, ((t.key, v),), own_lr=True)
               for t in tuned for v in (reachable_values(tuned, t) if reachable else t.tried))


def reachable_values(tuned: tuple[Tuned, ...], t: Tuned) -> tuple[str, ...]:
  if not t.around:
    return t.reachable()
  ref = next(r for r in tuned if r.name == t.around)
  out = dict.fromkeys(t.reachable())
  for choice in reachable_values(tuned, ref):
    out.update(dict.fromkeys(t.reachable(around_values(choice) or ())))
  return tuple(out)
