"""A study's design, checked before any run: seeds, variants and derived cells, the lr grid,
the pre-named pairs, every point's config, and (with `design`) whether the primary family can
reach p < 0.05 at the study's seeds. `study` is a definition.Study (which calls check from
its validate)."""
from __future__ import annotations

from pathlib import Path

from diff_transformer.config import validate
from diff_transformer.data import synthetic
from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import known_variant, variant_names
from diff_transformer.study.named import candidate_cells
from diff_transformer.study.overrides import BySize
from diff_transformer.stats import ALPHA, MAX_EXACT_PAIRS


def _cells(study) -> None:
  """Derived cells name a chain that ends at a registered variant; an ablation's lr comes from
  a compared grid; the pre-named pairs compare two distinct compared names."""
  names = [c.name for c in study.derived]
  for cell in study.derived:
    if not isinstance(cell.overrides, tuple) or not all(
        isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) for o in cell.overrides):
      raise ConfigError(f"study {study.name}: derived cell '{cell.name}': overrides must be a "
                        "tuple of (key, value) pairs, e.g. ((\"model.num_heads\", 2),); got "
                        f"{cell.overrides!r}")
    if not cell.name or "-" in cell.name or known_variant(cell.name) or names.count(cell.name) > 1:
      raise ConfigError(f"study {study.name}: derived cell '{cell.name}' must be a new, unique "
                        "name without '-' (points are <name>-s<seed>)")
    chain, parent = [cell.name], cell.parent
    while study.derived_cell(parent) and parent not in chain:
      chain.append(parent)
      parent = study.derived_cell(parent).parent
    if parent in chain or not known_variant(parent):
      raise ConfigError(f"study {study.name}: derived cell '{cell.name}': its parents "
                        f"{chain[1:] + [parent]} must end at a registered variant, without a "
                        "cycle")
    source = study.lr_source(cell.name)
    candidates = {c.name for c in candidate_cells(study.tuned, reachable=True)}
    if (study.lr_grid and cell.name in study.variants and source not in study.variants
        and source not in candidates):
      raise ConfigError(f"study {study.name}: derived cell '{cell.name}' trains at the lr of "
                        f"'{source}', which is not compared here; add it "
                        "to the variants or give the cell own_lr=True")
    for key, value in cell.overrides:
      if isinstance(value, BySize) and sorted(dict(value.values)) != sorted(study.sizes):
        raise ConfigError(f"study {study.name}: derived cell '{cell.name}': {key} gives values "
                          f"for sizes {sorted(dict(value.values))}, the study has "
                          f"{sorted(study.sizes)}")
  for pair in study.comparisons:
    if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(study.variants):
      raise ConfigError(f"study {study.name}: comparison {pair} must be two distinct names "
                        f"among the compared {list(study.variants)}")
  if study.factorial:
    factors, corners = study.factorial
    if (len(factors) != 2 or len(corners) != 4 or len(set(corners)) != 4
        or not set(corners) <= set(study.variants)):
      raise ConfigError(f"study {study.name}: factorial must be ((factor A, factor B), (4 "
                        f"distinct compared cells: neither, A, B, both)); got {study.factorial}")
  if len(set(study.comparisons)) != len(study.comparisons):
    raise ConfigError(f"study {study.name}: comparisons repeat a pair: {study.comparisons}")
  for name, value in study.published_cells:
    if name not in study.variants or not isinstance(value, (int, float)):
      raise ConfigError(f"study {study.name}: published cell value {(name, value)} must name a "
                        "compared cell and a number")
  for a, b, value in study.published:
    if (a, b) not in study.comparisons or not isinstance(value, (int, float)):
      raise ConfigError(f"study {study.name}: published figure {(a, b, value)} must name one "
                        "of the comparisons and a number")


def _tuned(study) -> None:
  """Tuned cells: compared, distinct, with values, chosen on an lr grid; their candidates' names
  new."""
  names = [t.name for t in study.tuned]
  taken = set(study.variants) | {c.name for c in study.derived}
  for t in study.tuned:
    if (t.name not in study.variants or names.count(t.name) > 1 or not study.lr_grid
        or not t.values or len(set(t.values)) != len(t.values) or t.extend < 0
        or study.derived_cell(t.parent) is None and not known_variant(t.parent)
        or t.around and t.around not in names[:names.index(t.name)]):
      raise ConfigError(f"study {study.name}: tuned cell '{t.name}' must be one of the compared "
                        "variants, named once, with distinct values, a known parent, an lr "
                        "grid to choose on and, if `around` another, that one named before it")
    clash = [c.name for c in candidate_cells(study.tuned, reachable=True)
             if c.name in taken and c.name.startswith(t.parent + "@")]
    if clash:
      raise ConfigError(f"study {study.name}: tuned cell '{t.name}': candidate names {clash} "
                        "are taken by other cells")


def check(study, design: bool = True) -> None:
  """Every point builds a valid config and (with `design`) the design can conclude; checked
  before any run."""
  if not study.seeds or len(set(study.seeds)) != len(study.seeds):
    raise ConfigError(f"study {study.name}: seeds must be distinct and non-empty, got "
                      f"{study.seeds}")
  most = max([len(study.seeds)] + [len(s) for _, s in study.cell_seeds])
  if most > MAX_EXACT_PAIRS:
    raise ConfigError(f"study {study.name}: {most} seeds; at most {MAX_EXACT_PAIRS} (each "
                      "comparison's exact sign-flip p counts every sign assignment of its pairs)")
  unknown = [v for v in study.variants if not known_variant(v) and not study.derived_cell(v)]
  if unknown or not study.variants or len(set(study.variants)) != len(study.variants):
    raise ConfigError(f"study {study.name}: variants must be distinct, non-empty and "
                      f"registered ({', '.join(variant_names())}), module:Class or a derived "
                      f"cell's name, got {study.variants}")
  _cells(study)
  _tuned(study)
  if study.eval_rows <= 0 or study.attention_rows <= 0 or study.ar_hit_context <= 0:
    raise ConfigError(f"study {study.name}: eval_rows, attention_rows and ar_hit_context must "
                      "be positive")
  for pair in study.size_contrasts:
    if len(pair) != 2 or pair[0] == pair[1] or not set(pair) <= set(study.sizes):
      raise ConfigError(f"study {study.name}: size contrast {pair} must be two distinct sizes "
                        f"among {list(study.sizes)}")
  if study.lr_grid_size and study.lr_grid_size not in study.sizes:
    raise ConfigError(f"study {study.name}: lr_grid_size '{study.lr_grid_size}' is not one of "
                      f"the sizes {list(study.sizes)}")
  if (any(not lr > 0 for lr in study.lr_grid) or not study.lr_grid_seeds or
      set(study.lr_grid_seeds) & set(study.seeds) or study.lr_grid_extend < 0):
    raise ConfigError(f"study {study.name}: lr_grid must be positive, lr_grid_seeds "
                      f"{study.lr_grid_seeds} non-empty and none of the compared seeds, "
                      "lr_grid_extend >= 0")
  gone = [f for f in study.reuse_from if not (Path(f) / "records").is_dir()]
  if gone:
    raise ConfigError(f"study {study.name}: reuse_from {gone}: no records/ folder there (a "
                      "study's --results folder, relative to the working directory)")
  if study.lr_grid and list(study.lr_grid) != sorted(set(study.lr_grid)):
    raise ConfigError(f"study {study.name}: lr_grid must be increasing, got {study.lr_grid}")
  primary = study.design()["primary"]
  if design and not study.exploratory and primary["comparisons"] and not primary["can_resolve"]:
    raise ConfigError(
        f"study {study.name}: the primary family ({primary['comparisons']} comparisons, Holm) "
        f"cannot reach p < {ALPHA} with {len(study.seeds)} seeds (smallest p "
        f"{primary['smallest_p']:.4f}); it needs {primary['seeds_needed']} seeds or more "
        "(--seeds), or --exploratory to run it anyway")
  for point in study.points() + study.grid_points():
    try:
      config = validate(study.get_config(point))
    except (ConfigError, ValueError, KeyError, AttributeError, TypeError) as e:
      raise ConfigError(f"study {study.name}: point {point}: {e}") from None
    if config.data.name not in synthetic.TASKS and study.level:
      raise ConfigError(f"study {study.name}: point {point} trains on text; primary metric "
                        f"'{study.primary}' needs a synthetic task")
