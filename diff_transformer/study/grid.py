"""The learning-rate grid: each variant's lr judged by the study's primary metric at the full
budget, on grid seeds no compared run uses, and bracketed.

- Score of an lr (over its grid seeds): for a steps-to-level primary, the most runs that reached
  the level, then the fewest steps (a run that never reached it counts at its last step), then
  the lowest final loss (which separates runs that all stayed below the level); for a loss
  primary, the mean final validation loss (Study.grid_metric: on the whole validation split
  with grid_by_primary, else on the training-time evaluation's rows). An lr whose every run
  failed (diverged) scores worst.
- Bracketed: the chosen lr has a tried lr on each side, the lower one working (the upper one may
  have diverged: divergence bounds the lr from above). At an end of the grid, the grid grows one
  point that way (the grid's ratio) and is judged again, up to `lr_grid_extend` points per side;
  still at the end then, the lr is reported 'not bracketed'.
- Untuned: every grid run of the variant stayed at or below the best shortcut (its final accuracy
  at or under the trained slice's highest floor; for text, its loss at or above the unigram
  baseline): its comparison is against a baseline that never learned the task at any lr tried.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from diff_transformer.study.definition import Study


def _round(lr: float) -> float:
  return float(f"{lr:.3g}")  # a point name (lr{lr:g}) that parses back to the same float


def score(study: Study, runs: list[dict]) -> tuple:
  """Lower is better; runs are one lr's grid records (failed runs have 'failed' set)."""
  ok = [r for r in runs if not r.get("failed")]
  if not ok:
    return (math.inf,) * 3
  loss = (float(np.mean([r[study.grid_metric] for r in ok])) if len(ok) == len(runs)
          else math.inf)
  if not study.level:
    return (loss,)
  reached = sum(bool(r["reached"]) for r in ok)
  steps = np.mean([r["budget"] if r.get("failed") or not r["reached"] else r["steps_to_level"]
                   for r in runs])
  return (-reached, float(steps), loss)


def untuned(study: Study, runs: list[dict], floor: float) -> bool:
  ok = [r for r in runs if not r.get("failed")]
  if study.level:
    return all(r["val_accuracy"] <= floor for r in ok)
  return all(r["final_loss"] >= r["unigram_entropy"] for r in ok)


def decide(study: Study, by_lr: dict[float, list[dict]], floor: float) -> dict:
  """{chosen, bracketed, untuned, extend: 'below' | 'above' | None, scores} of one cell's
  grid (by_lr: lr -> its runs' records)."""
  lrs = sorted(by_lr)
  scores = {lr: score(study, by_lr[lr]) for lr in lrs}
  best = min(lrs, key=lambda lr: (scores[lr], lr))  # ties: the smaller lr
  i = lrs.index(best)
  failed = {lr for lr in lrs if all(r.get("failed") for r in by_lr[lr])}
  chosen = None if best in failed else best
  below_ok = i > 0 and lrs[i - 1] not in failed
  bracketed = chosen is not None and below_ok and i < len(lrs) - 1
  extend = None
  if chosen is not None and not bracketed:
    extend = "below" if i == 0 else "above" if i == len(lrs) - 1 else None
  all_runs = [r for lr in lrs for r in by_lr[lr]]
  return dict(chosen=chosen, bracketed=bracketed, extend=extend,
              untuned=untuned(study, all_runs, floor),
              scores={f"{lr:g}": list(s) for lr, s in scores.items()})


def extended(lrs: list[float], side: str, base: tuple[float, ...]) -> float:
  """The next lr beyond the grid on `side`, at the base grid's ratio (1.5 for a one-point grid)."""
  ratio = base[1] / base[0] if len(base) > 1 else 1.5
  return _round(min(lrs) / ratio) if side == "below" else _round(max(lrs) * ratio)


def tune(study: Study, run_points: Callable[[list[str]], dict[str, dict]], floor: float) -> dict:
  """Runs the grid (run_points trains what is missing and returns each point's record), grows it
  where the choice sits at an end, and returns lr_grid.json's content."""
  lrs = {cell: list(study.lr_grid) for cell in study.grid_cells()}
  while True:
    points = {c: {lr: [study.grid_point(c, lr, s) for s in study.lr_grid_seeds] for lr in lrs[c]}
              for c in lrs}
    records = run_points([p for c in points.values() for ps in c.values() for p in ps])
    decisions: dict[str, dict] = {}
    grew = False
    for cell, by_lr in points.items():
      runs = {lr: [records[p] for p in ps if p in records] for lr, ps in by_lr.items()}
      if not any(runs.values()):  # nothing recorded yet (a report from records only)
        decisions[cell] = dict(chosen=None, bracketed=False, extend=None, untuned=False,
                               scores={}, complete=False)
        continue
      decisions[cell] = decide(study, {lr: r for lr, r in runs.items() if r}, floor)
      side = decisions[cell]["extend"]
      beyond = [lr for lr in lrs[cell] if (lr < study.lr_grid[0] if side == "below"
                                           else lr > study.lr_grid[-1])]
      grows = bool(side) and len(beyond) < study.lr_grid_extend
      complete = all(p in records for ps in by_lr.values() for p in ps)
      decisions[cell]["complete"] = complete and not grows
      if grows and complete:
        lrs[cell] = sorted(lrs[cell] + [extended(lrs[cell], side, study.lr_grid)])
        grew = True
    if not grew:
      break
  table = {cell: {f"{lr:g}": {str(study.parse(p).seed): _primary(study, records.get(p))
                              for p in ps} for lr, ps in points[cell].items()} for cell in points}
  return dict(lrs=list(study.lr_grid), seeds=list(study.lr_grid_seeds),
              steps=study.get_config(study.grid_points()[0]).train.steps,
              metric=study.primary if study.level else study.grid_metric, floor=floor, table=table,
              decisions=decisions,
              chosen={c: d["chosen"] for c, d in decisions.items()})


def at_chosen_lr(grid: dict, cell: str) -> tuple[float, float, list[float]] | None:
  """(the chosen lr, the grid seeds' mean there, each seed's value) of one cell of lr_grid.json,
  in the table's own terms (steps to the level, or the grid metric); None before a choice or
  with no finished run there."""
  lr = (grid["decisions"].get(cell) or {}).get("chosen")
  if lr is None:
    return None
  runs = grid["table"].get(cell, {}).get(f"{lr:g}", {}).values()
  values = [float(r["steps"] if "steps" in r else r[grid["metric"]])
            for r in runs if r and not r.get("failed")]
  return (float(lr), float(np.mean(values)), values) if values else None


def _primary(study: Study, record: dict | None) -> dict | None:
  """A grid run's cell in the table: the primary (steps to the level, or final loss), whether it
  was reached, and the final loss."""
  if record is None:
    return None
  if record.get("failed"):
    return dict(failed=record["failed"])
  out = dict(final_loss=record["final_loss"], val_accuracy=record.get("val_accuracy"),
             train_seconds=record.get("train_seconds"))
  if study.grid_metric != "final_loss":
    out[study.grid_metric] = record[study.grid_metric]
  if record.get("tail_fall") is not None:  # text: the share of its fall made in the last 20%
    out["tail_fall"] = record["tail_fall"]
  if record.get("reused_from"):  # another study's record, of exactly this setting
    out["reused_from"] = record["reused_from"]
  if study.level:
    out.update(steps=record["steps_to_level"], reached=record["reached"])
  return out
