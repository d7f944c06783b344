"""A study: variants x seeds (x sizes) of one setting, each point an ordinary training run.

A study file (configs/studies/*.py) defines `STUDY = Study(...)` and `get_config =
STUDY.get_config`, so a point trains as `python train.py --config=<file>:<point>`. Points:

- `<variant>[-<size>]-s<seed>`: a compared run. Seed s sets both data.seed (the same data order
  for every variant) and train.seed (init). A compared name is a registered variant or a
  derived cell (`Cell`: a parent with config overrides, e.g. `transformer@2x64`), which trains
  at its own grid's lr or at its parent's.
- `<variant>[-<size>]-lr<lr>-s<seed>`: a learning-rate grid run, seed one of `lr_grid_seeds`,
  which no compared run uses, so the lr is not picked on the seeds that are then compared. The
  grid is judged at the full budget (study/grid.py): by a steps-to-level primary, or by the
  final validation loss, on the whole split with `grid_by_primary` (the primary a loss study
  compares on).

The runner pins what the in-process study decided (lr, grid steps and seed, overrides) on each
child's command line (study/pins.py), so a child that loads the study file afresh trains exactly
that point.

The design is checked before any run (`validate`): the primary family (one comparison per
variant against the Transformer, or the study's pre-named `comparisons`, Holm-corrected) must
be able to reach p < 0.05 at the study's number of seeds, or the study is refused unless marked
exploratory.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import ml_collections

from diff_transformer.data import synthetic
from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import PAPER_VARIANTS
from diff_transformer.study import checks
from diff_transformer.study.named import Cell, Point, Tuned, candidate_cells
from diff_transformer.study.overrides import BySize, at_lr, number, parse_set, set_key
from diff_transformer.stats import ALPHA, seeds_needed, smallest_holm_p

BASELINE = "transformer"


def level(metric: str) -> float | None:
  """The accuracy level of a `steps_to_<pct>` metric (0.9 for steps_to_90), else None."""
  head, _, pct = metric.partition("@")[0].partition("steps_to_")
  return int(pct) / 100 if not head and pct.isdigit() else None


@dataclasses.dataclass(frozen=True)
class Study:
  name: str
  # variant -> full config; with `sizes`, (variant, size) -> full config
  make: Callable[..., ml_collections.ConfigDict]
  seeds: tuple[int, ...] = tuple(range(8))
  # (cell, seeds): a cell on fewer of the seeds (its pairs: the seeds both cells have)
  cell_seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()
  variants: tuple[str, ...] = PAPER_VARIANTS  # what is compared: variants and derived cells
  derived: tuple[Cell, ...] = ()  # the cells among `variants` that are not registered variants
  # Cells with one key chosen on the grid seeds (study/tuning.py); decided ones named below.
  tuned: tuple[Tuned, ...] = ()
  decided_tuned: tuple[str, ...] = ()
  # The primary family's pre-named (a, b) pairs, each a - b; empty: each variant - BASELINE.
  comparisons: tuple[tuple[str, str], ...] = ()
  # A published figure per pre-named pair (a, b, a - b in the source's units), shown beside the
  # study's; `published_source` names the source and its units.
  published: tuple[tuple[str, str, float], ...] = ()
  published_cells: tuple[tuple[str, float], ...] = ()  # the source's own value per cell
  published_source: str = ""
  # A published difference this small or smaller (in its source's units) is read as within the
  # source's own run-to-run noise: shown, but given no sign (single runs without error bars).
  published_noise: float = 0.0
  sizes: tuple[str, ...] = ()  # model sizes (LM studies); empty: one setting
  # (hi, lo) sizes: each metric's per-seed change from lo to hi, `<metric>@<hi>-<lo>`, a metric
  # like any other (it can be the primary): a pair's a - b of it is, seed by seed, the gap at
  # size hi minus the gap at size lo (does a gap shrink with size?).
  size_contrasts: tuple[tuple[str, str], ...] = ()
  # The one metric named before the run (its family: one comparison per variant), and the few
  # pre-named secondary metrics (one family, Holm within it). Every other metric is descriptive.
  primary: str = "steps_to_90"
  # A pre-named 2 x 2: ((factor A, factor B), (cell with neither, A only, B only, both)); the
  # report gives its means, main effects and interaction, seed by seed with intervals.
  factorial: tuple[tuple[str, str], tuple[str, str, str, str]] | tuple[()] = ()
  secondary: tuple[str, ...] = ()
  # A study whose primary family cannot reach p < 0.05 runs only when marked exploratory.
  exploratory: bool = False
  stop_at_level: bool = False  # a steps_to_<level> primary: a run stops at the level
  lr_grid: tuple[float, ...] = ()  # empty: every variant at its preset's lr
  lr_grid_steps: int = 0  # 0: the compared runs' steps (the full budget)
  lr_grid_seeds: tuple[int, ...] = (1000, 1001)
  lr_grid_extend: int = 2  # at most this many points added beyond either end of the grid
  lr_grid_size: str = ""  # with sizes: run the grid at this size only and use its lr at every size
  # A loss primary: True evaluates each grid run as a compared run is (the whole validation
  # split) and judges the grid by the primary; False judges it by the training-time validation
  # loss (`final_loss`, train.eval_batches rows), as the LM and Table 6 studies did.
  grid_by_primary: bool = False
  eval_rows: int = 512  # eval-split rows per task slice
  attention_rows: int = 32
  ar_hit_context: int = 1  # text: tokens before a target in an AR-hit n-gram (evaluation/loss.py)
  # --quick: these seeds, grid and flat config overrides ("train.steps", 200) for every run.
  quick_seeds: tuple[int, ...] = (0, 1)
  quick_lr_grid: tuple[float, ...] = ()
  quick_overrides: tuple[tuple[str, object], ...] = ()
  overrides: tuple[tuple[str, object], ...] = ()
  description: str = ""
  scope: str = ""  # what the study cannot speak to: among the report's first lines
  reuse_from: tuple[str, ...] = ()  # other studies' --results folders (study/records.py: pool)

  def quick(self) -> "Study":
    return dataclasses.replace(self, name=f"{self.name}-quick", seeds=self.quick_seeds,
                               lr_grid=self.quick_lr_grid, lr_grid_steps=0,
                               lr_grid_seeds=self.lr_grid_seeds[:1], lr_grid_extend=0,
                               exploratory=True,
                               overrides=self.overrides + self.quick_overrides,
                               eval_rows=min(self.eval_rows, 128),
                               attention_rows=min(self.attention_rows, 8))

  def with_options(self, *, sets: tuple[str, ...] = (), variants: str = "", seeds: str = "",
                   name: str = "", exploratory: bool = False) -> "Study":
    """The study with study.py's command-line options folded in (`--set key=value` appended to
    the overrides; `--variants a,b`; `--seeds 0,1,2`; `--name`; `--exploratory`)."""
    study = self
    if sets:
      study = dataclasses.replace(study, overrides=study.overrides + tuple(map(parse_set, sets)))
    if variants:
      study = dataclasses.replace(study, variants=tuple(v.strip() for v in variants.split(",")))
    if seeds:
      try:
        study = dataclasses.replace(study, seeds=tuple(int(s) for s in seeds.split(",")))
      except ValueError:
        raise ConfigError(f"--seeds: '{seeds}' is not a comma-separated list of integers") from None
    if exploratory:
      study = dataclasses.replace(study, exploratory=True)
    return dataclasses.replace(study, name=name) if name else study

  def derived_cell(self, name: str) -> Cell | None:
    """A derived cell, a tuned cell's candidate, or (until decided) a tuned cell as its parent."""
    cells = self.derived + candidate_cells(self.tuned, reachable=True) + tuple(
        Cell(t.name, t.parent) for t in self.tuned if t.name not in self.decided_tuned)
    return next((c for c in cells if c.name == name), None)

  def root_variant(self, name: str) -> str:
    """The registered variant a compared name is built from."""
    cell = self.derived_cell(name)
    return name if cell is None else self.root_variant(cell.parent)

  def cell_overrides(self, name: str) -> tuple[tuple[str, object], ...]:
    """A derived cell's overrides after its parents' (a registered variant has none)."""
    cell = self.derived_cell(name)
    return () if cell is None else self.cell_overrides(cell.parent) + cell.overrides

  def lr_source(self, name: str) -> str:
    """The compared name whose grid chooses this one's lr (itself, or an ablation's parent)."""
    cell = self.derived_cell(name)
    return name if cell is None or cell.own_lr else self.lr_source(cell.parent)

  def pairs(self) -> list[tuple[str, str]]:
    """The primary family: the pre-named pairs, or each variant against the Transformer."""
    return list(self.comparisons) or [(v, BASELINE) for v in self.variants if v != BASELINE]

  def pair_name(self, a: str, b: str) -> str:
    """A pair's key in study.json: "a vs b"; the variant alone in a study without pre-named
    pairs (every pair is then against the Transformer)."""
    return f"{a} vs {b}" if self.comparisons else a

  def cells(self) -> list[tuple[str, str]]:
    """(variant, size) pairs; size '' for a study without sizes."""
    return [(v, s) for s in (self.sizes or ("",)) for v in self.variants]

  @staticmethod
  def cell_name(variant: str, size: str) -> str:
    return f"{variant}-{size}" if size else variant

  def seeds_of(self, variant: str) -> tuple[int, ...]:
    return dict(self.cell_seeds).get(variant, self.seeds)

  def points(self) -> list[str]:
    return [f"{self.cell_name(v, z)}-s{s}" for s in self.seeds for v, z in self.cells()
            if s in self.seeds_of(v)]

  def grid_cells(self) -> list[str]:
    """Compared cells with an lr grid of their own, and the tuned cells' candidates."""
    names = [v for v in self.variants if self.lr_source(v) == v and not self.is_tuned(v)]
    names += [c.name for c in candidate_cells(self.tuned)]
    return [self.cell_name(v, z) for z in (self.sizes or ("",)) for v in names
            if not self.lr_grid_size or z == self.lr_grid_size]

  def is_tuned(self, name: str) -> bool:
    """A tuned cell not decided yet (no grid of its own; its points wait for the choice)."""
    return any(t.name == name for t in self.tuned) and name not in self.decided_tuned

  def grid_point(self, cell: str, lr: float, seed: int) -> str:
    return f"{cell}-lr{lr:g}-s{seed}"

  def grid_points(self) -> list[str]:
    """The base grid's points (study/grid.py may grow it beyond either end)."""
    return [self.grid_point(c, lr, s) for c in self.grid_cells()
            for lr in self.lr_grid for s in self.lr_grid_seeds]

  def grid_cell(self, point: str) -> str:
    """The grid cell whose chosen lr a compared point trains at."""
    p = self.parse(point)
    return self.cell_name(self.lr_source(p.variant), self.lr_grid_size or p.size)

  @property
  def level(self) -> float | None:
    return level(self.primary)

  def parse(self, point: str) -> Point:
    cell, _, seed = point.rpartition("-s")
    cell, has_lr, lr_text = cell.rpartition("-lr") if "-lr" in cell else (cell, "", "")
    lr = number(lr_text, float) if has_lr else None
    variant, _, size = cell.partition("-")
    seed_number = number(seed, int)
    grid_seed = seed_number is not None and seed_number[0] in self.lr_grid_seeds
    known = self.variants + tuple(c.name for c in candidate_cells(self.tuned, reachable=True))
    if ((variant not in known or (not has_lr and variant not in self.variants)) or
        size not in (self.sizes or ("",)) or not seed_number or
        (has_lr and lr is None) or bool(has_lr) != grid_seed or
        (has_lr and self.lr_source(variant) != variant)):
      raise ConfigError(f"study {self.name}: unknown point '{point}'; points are "
                        f"<variant>{'-<size>' if self.sizes else ''}-s<seed> or "
                        f"-lr<lr>-s<grid seed {list(self.lr_grid_seeds)}> with variant in "
                        f"{list(self.variants)}"
                        + (f", size in {list(self.sizes)}" if self.sizes else ""))
    return Point(variant, size, seed_number[0], lr[0] if lr else None)

  def get_config(self, point: str) -> ml_collections.ConfigDict:
    p = self.parse(point)
    root = self.root_variant(p.variant)
    config = self.make(root, p.size) if self.sizes else self.make(root)
    for key, value in self.cell_overrides(p.variant) + self.overrides:
      set_key(config, key, value.at(p.size) if isinstance(value, BySize) else value)
    t = config.train
    if p.lr is not None:
      at_lr(t, p.lr)
      if self.lr_grid_steps:
        t.steps = t.checkpoint_every = self.lr_grid_steps
        t.eval_every = min(t.eval_every, t.steps)
    if self.stop_at_level and self.level:
      t.stop_at_val_accuracy = self.level
    config.data.seed = t.seed = p.seed
    config.source = f"study {self.name}, point {point}; " + config.source
    return config

  def resolved_config(self, point: str, lr: float | None = None) -> ml_collections.ConfigDict:
    """The config a point trains with: a compared point at the lr its grid chose."""
    config = self.get_config(point)
    if lr is not None:
      at_lr(config.train, lr)
    return config

  @functools.cached_property
  def is_task(self) -> bool:
    return self.get_config(self.points()[0]).data.name in synthetic.TASKS

  @property
  def grid_metric(self) -> str:
    """What the grid's loss score reads from a grid record."""
    return self.primary if self.grid_by_primary and not self.level else "final_loss"

  def families(self) -> dict[str, int]:
    """{family: number of comparisons}: the primary and the pre-named secondaries."""
    primary = len(self.pairs())
    return dict(primary=primary, secondary=primary * len(self.secondary))

  def design(self) -> dict:
    """What the design can show: per family its size, the smallest p it can reach after Holm at
    this number of seeds, and the seeds it needs to reach p < 0.05."""
    n = min(len(self.seeds_of(v)) for v in self.variants)  # the fewest seeds a cell has
    return {family: dict(comparisons=m, smallest_p=smallest_holm_p(m, n),
                         can_resolve=bool(m) and smallest_holm_p(m, n) < ALPHA,
                         seeds_needed=seeds_needed(m) if m else 0)
            for family, m in self.families().items()}

  def validate(self, design: bool = True) -> "Study":
    """Every point builds a valid config and (with `design`) the design can conclude; checked
    before any run (study/checks.py)."""
    checks.check(self, design)
    return self
