"""The preamble of a study report: the warnings that limit every reading (exploratory design,
runs from several code versions, untuned or unbracketed lrs, an unfinished grid), the setting,
how to read the tables, the lr grid and the tuned settings."""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Sequence

from diff_transformer.study import plots
from diff_transformer.study.formatting import num, plural, seeds_phrase, table
from diff_transformer.study.grid import at_chosen_lr
from diff_transformer.study.tuning import final


def limits(result: dict) -> list[str]:
  """The report's first lines: what limits every reading below."""
  info, grid = result["study"], result["lr_grid"]
  design = info.get("design", {})
  lines = []
  if info.get("exploratory"):
    primary = design.get("primary", {})
    comparisons = plural(primary.get("comparisons") or 0, "comparison")
    lines.append(f"**Exploratory**: the primary family ({comparisons}, Holm) can reach "
                 f"p = {num(primary.get('smallest_p'), 4)} at best "
                 f"with {len(info['seeds'])} seeds (it needs {primary.get('seeds_needed')}); "
                 "nothing below can be a finding.")
  versions = info.get("code_versions") or {}
  if len(versions) > 1:
    lines.append(f"**Runs from {len(versions)} code versions**: " + "; ".join(
        f"{v} ({plural(n, 'run')})" for v, n in versions.items()) + ". A difference between "
        "variants may be partly a difference between code versions.")
  decisions = (grid or {}).get("decisions", {})
  untuned = [c for c, d in decisions.items() if d["untuned"]]
  if untuned:
    lines.append(f"**Untuned**: {', '.join(untuned)}: every grid run stayed at or below the best "
                 "shortcut, so comparisons with it are against a model that never learned the "
                 "task at any lr tried.")
  loose = [c for c, d in decisions.items()
           if d["chosen"] is not None and not d["bracketed"] and d.get("complete", True)]
  pending = [c for c, d in decisions.items() if not d.get("complete", True)]
  if pending:
    lines.append(f"**Grid not finished**: {', '.join(pending)}: the lr below is provisional.")
  if loose:
    lines.append(f"**Not bracketed**: {', '.join(loose)}: the chosen lr is at an end of the grid "
                 "(after extending it); its best lr may lie beyond.")
  tuned = (grid or {}).get("tuned") or {}
  at_end = [f"{name} (`{c['key']}` {c['value']})" for name, c in tuned.items()
            if final(c) and c.get("at_end")]
  if at_end:
    lines.append(f"**Tuned value not bracketed**: {', '.join(at_end)}: the chosen value is the "
                 "smallest or largest tried, after the growth the design allows; its best value "
                 "may lie beyond.")
  return [x for line in lines for x in (line, "")]


def _how_to_read(result: dict) -> list[str]:
  info = result["study"]
  design = info.get("design", {})
  def family(name: str, what: str) -> str:
    d = design.get(name, {})
    if not d.get("comparisons"):
      return ""
    reach = (f"can reach p = {num(d['smallest_p'], 4)} after Holm" if d["can_resolve"] else
             f"cannot reach p < 0.05 after Holm (smallest {num(d['smallest_p'], 4)}; it needs "
             f"{d['seeds_needed']} seeds), so it is read as descriptive")
    return (f"- **{what}** ({plural(d['comparisons'], 'comparison')}, Holm within the "
            f"family): {reach}.\n")
  secondary = ", ".join(f"`{m}`" for m in info.get("secondary", [])) or "none"
  lines = ["## How to read this", "",
           f"- **Primary metric, named before the run: `{info['primary']}`.** Pre-named "
           f"secondary metrics: {secondary}. Every other metric is **descriptive**: a mean "
           "difference with its n, no p.",
           (family("primary", "Primary family") + family("secondary", "Secondary family")).rstrip(),
           f"- p: an exact paired test over the {seeds_phrase(result)} (a sign-flip test; for a "
           "time censored at the budget, a sign test on the pairs whose order is determined). A "
           "mean difference that involves censored runs is a bound ('<=' or '>='), or not "
           "bounded; it never gets a t interval. 'Not resolved' means the data do not separate the "
           "variants, not that they are equal."]
  if info.get("stop_at_level"):
    lines.append(f"- Each compared and grid run stopped once it reached {info['stop_at_level']} "
                 "held-out accuracy on the trained slice; its other metrics are measured at that "
                 "step (at the budget for runs that never reached it).")
  return lines + [""]


def _grid_runs(result: dict) -> list[dict]:
  grid = (result.get("lr_grid") or {}).get("table", {})
  return [c for by_lr in grid.values() for by_seed in by_lr.values() for c in by_seed.values()
          if c]


def train_seconds(result: dict) -> tuple[list[float], list[float]]:
  """The compared runs' and the grid runs' own training times, from their records (a reused
  record's as first measured)."""
  return ([r["train_seconds"] for r in result.get("runs", ())
           if r["train_seconds"] is not None and math.isfinite(r["train_seconds"])],
          [c["train_seconds"] for c in _grid_runs(result) if c.get("train_seconds") is not None])


def _reused(result: dict) -> list[str]:
  """Which records another study trained (study.reuse_from)."""
  compared = [r["reused_from"] for r in result["runs"] if r.get("reused_from")]
  grid = [c["reused_from"] for c in _grid_runs(result) if c.get("reused_from")]
  if not compared and not grid:
    return []
  sources = sorted({name.split("/")[0] for name in compared + grid})
  return [f"Reused: {plural(len(compared), 'compared run')} and {plural(len(grid), 'grid run')} "
          f"are records of {', '.join(sources)}, each taken because it was trained under "
          "exactly this point's setting (`reused_from` in the record)."]


def header(result: dict, first: Sequence[str] = ()) -> list[str]:
  """Title, the limits, `first` (more first lines), the setting and how to read the tables."""
  info = result["study"]
  minutes = sum(train_seconds(result)[0]) / 60
  setting = (f"Task `{info['task']}` {info.get('task_params', '')}" if "task_params" in info
             else f"Text corpus `{info['task']}`"
             + (f", sizes {info['sizes']}" if info["sizes"] else ", one size"))
  lines = [f"# Study {info['name']}", ""] + limits(result) + list(first) + [
      info["description"], "",
      f"{setting}; seq_len {info['seq_len']}; budget {info['steps']} steps of {info['batch']} "
      f"rows; seeds {info['seeds']} (the same data order for every variant per seed).", "",
      f"Command: `{info['command']}`", "",
      f"Wall time of this invocation: {info['wall_seconds'] / 60:.1f} min on "
      f"{info['machine']}; the runs' own training time, summed: {minutes:.1f} min."]
  if info.get("rebuilt"):
    r = info["rebuilt"]
    lines += [f"This report was rebuilt from the run records ({r['time']}, {r['machine']}: "
              f"`{r['command']}`); the runs and the lines above are the training invocations'."]
  calls = info.get("invocations") or []
  if len(calls) > 1 or any(c.get("stopped_by") for c in calls):  # a study run in parts
    lines += ["Invocations on this root, in order: " + "; ".join(
        f"{c['wall_seconds'] / 60:.1f} min ({c['trained']} runs trained"
        + (f", stopped by {c['stopped_by']})" if c.get("stopped_by") else ")")
        for c in calls) + "."]
  lines += _reused(result) + [""]
  if result["missing"]:
    lines += [f"**Not in the tables** (failed or unfinished): {', '.join(result['missing'])}.", ""]
  return lines + _how_to_read(result)


def _grid_metric_note(metric: str, primary: str) -> str:
  """Says so when the grid chose its lrs by another metric than the study's primary."""
  if metric == primary:
    return ""
  return (f" The grid chose by `{metric}`, not by the primary `{primary}`: the two can rank the "
          "lrs differently, so an lr chosen here is the best by the grid's metric.")


def _grid_cost(result: dict) -> str:
  seconds = train_seconds(result)[1]
  if not seconds:
    return ""
  return (f" The {len(seconds)} grid runs' own training time (`train_seconds`): median "
          f"{statistics.median(seconds) / 60:.1f} min, summed {sum(seconds) / 3600:.1f} h.")


def _grid_cell(cell: dict | None, budget: int, metric: str) -> str:
  if cell is None:
    return "-"
  if cell.get("failed"):
    return "failed"
  if "steps" in cell:
    if cell["reached"]:
      return f"{cell['steps']:.0f}"
    return f">{budget} ({num(cell['val_accuracy'], 2)})"
  return num(cell[metric], 4)  # the value the grid chose by


def lr_grid(result: dict) -> list[str]:
  grid = result["lr_grid"]
  if not grid:
    return ["Every variant trained at its preset's learning rate (no grid).", ""]
  lrs = sorted({float(lr) for by_lr in grid["table"].values() for lr in by_lr})
  rows = []
  for cell, by_lr in grid["table"].items():
    d = grid["decisions"][cell]
    for seed in map(str, grid["seeds"]):
      rows.append([cell, seed] + [_grid_cell(by_lr.get(f"{lr:g}", {}).get(seed), grid["steps"],
                                             grid["metric"])
                                  for lr in lrs] +
                  [f"{d['chosen']:g}" if d["chosen"] else "none",
                   "yes" if d["bracketed"] else "pending" if not d.get("complete", True)
                   else "**not bracketed**",
                   "**untuned**" if d["untuned"] else "no"])
  what = ("steps to reach the level (>budget: never, with the final accuracy)"
          if grid["metric"].startswith("steps_to") else
          "final validation loss on the training-time eval rows" if grid["metric"] == "final_loss"
          else f"`{grid['metric']}`, on the whole validation split as a compared run's")
  return ([f"## Learning rate per variant ({grid['steps']}-step budget, grid seeds "
           f"{grid['seeds']}, which no compared run uses; judged by `{grid['metric']}`)", "",
           f"Each cell: {what}; '-': not run (outside this variant's grid)."
           + _grid_metric_note(grid["metric"], result["study"]["primary"])
           + _grid_cost(result)] + [""] +
          table(["variant", "seed"] + [f"lr {lr:g}" for lr in lrs] +
                 ["chosen", "bracketed", "untuned"], rows) + [""])


def tuned_values(result: dict, root: Path) -> list[str]:
  """Each tuned cell's values, each at its own best lr on the grid seeds, the choice marked."""
  grid = result["lr_grid"] or {}
  tuned = grid.get("tuned") or {}
  if not tuned:
    return []
  rows, states = [], []
  for name, c in tuned.items():
    for value, cell in c["candidates"].items():
      d = grid["decisions"].get(cell) or {}
      got = at_chosen_lr(grid, cell)
      state = ("**chosen**" if value == c["value"] and final(c) else
               "not run yet" if got is None and not d.get("complete") else
               "grid not finished: provisional" if not d.get("complete") else
               "complete" if value in c["scores"] else "no working lr")
      rows.append([name, value, cell, f"{d['chosen']:g}" if d.get("chosen") else "-",
                   num(got[1] if got else None, 4), state])
    states.append(f"- `{name}`: " + (
        f"{c['value']} at lr {c['lr']:g}" + (" (an end of the values tried: not bracketed)"
                                              if c.get("at_end") else "") if final(c) else
        f"grows to {c['extend']} next" if c.get("extend") else
        f"waits for `{c['around']}`'s choice (its value /2, x1, x2)" if not c["candidates"] else
        "not decided: a candidate's grid is not finished"))
  keys = sorted({c["key"] for c in tuned.values()})
  return ([f"## Tuned settings ({', '.join(f'`{k}`' for k in keys)}), each value at its own "
           "best lr", "",
           f"The grid seeds' mean `{grid['metric']}` at each value's chosen lr (the table above); "
           "a cell trains its compared runs at the best (value, lr) pair. A value beyond the "
           "named ones is one the x2 growth added where a numeric end won.", ""] +
          table(["tuned cell", "value", "candidate", "its lr", grid["metric"], "state"], rows) +
          ["", "Choices:"] + states +
          ["", f"![loss against the tuned value]({plots.tuned_values(result, root / 'tuned.png')})",
           ""])
