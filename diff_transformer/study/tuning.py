"""Tuned cells: a compared cell whose setting of one config key is chosen on the grid seeds, as
its lr is.

`Tuned("diff@tuned", "diff", "model.norm_out_scale", ("0.1", "0.2", "0.4", "rule"))` gives each
value a candidate cell of its own (`diff@scale0.1`, ...: the parent with the key set, its own lr
grid); the compared cell trains at the (value, lr) pair whose grid score is best by the grid's own
judge (study/grid.py). Where the best value is the smallest or the largest number tried, the
values grow by x2 that way (as an lr grid grows), up to `extend` values per side; a value that is
not a number ("rule") takes part in the choice but not in the growth, unless `rule_at` places it
on the axis (the Transformer's rule is a fixed 1). Ties go to the earlier value. Once every
candidate's grid is complete, `decided` turns the tuned cell into an ordinary derived cell of
the chosen candidate (its overrides, its grid's lr), so compared points, records and the report
treat it like any other cell.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from diff_transformer.study import grid as lr_grid
from diff_transformer.study.definition import Study
from diff_transformer.study.named import (Cell, Tuned, around_values, candidate,
                                         number_or_none)


def _position(tuned: Tuned, value: str) -> float | None:
  """Where a value sits on the axis: its number, or `rule_at` for a named rule."""
  x = number_or_none(value)
  return tuned.rule_at if x is None else x


def choose(study: Study, tuned: Tuned, grid: dict) -> dict:
  """{value, candidate, lr, scores, extend, at_end, complete} of one tuned cell from the grid's
  decisions: `value` None until every candidate's grid is complete and one of them has a working
  lr; `extend` the value to add next (x2 beyond the winning end), else None; `at_end` whether
  the best value is the smallest or largest number tried (once growth is spent: not bracketed)."""
  decisions = grid.get("decisions", {})
  scores, complete = {}, True
  for value in tuned.tried:
    d = decisions.get(candidate(tuned, value))
    if d is None or not d.get("complete"):
      complete = False
      continue
    if d["chosen"] is not None:
      scores[value] = d["scores"][f"{d['chosen']:g}"]
  out: dict[str, Any] = dict(value=None, candidate=None, lr=None, complete=complete, extend=None,
                             at_end=False, scores=scores)
  if not complete or not scores:
    return out
  best = min(scores, key=lambda v: (scores[v], tuned.tried.index(v)))
  out.update(value=best, candidate=candidate(tuned, best),
             lr=decisions[candidate(tuned, best)]["chosen"])
  named = [p for v in tuned.base if (p := _position(tuned, v)) is not None]
  tried = [p for v in tuned.tried if (p := _position(tuned, v)) is not None]
  where = _position(tuned, best)
  if where is None or len(named) < 2:
    return out
  out["at_end"] = where in (min(tried), max(tried))
  if where == min(tried) and sum(p < min(named) for p in tried) < tuned.extend:
    out["extend"] = f"{where / 2:g}"
  elif where == max(tried) and sum(p > max(named) for p in tried) < tuned.extend:
    out["extend"] = f"{where * 2:g}"
  return out


def with_value(study: Study, tuned: Tuned, value: str) -> Study:
  """The study with one more (grown) candidate value for `tuned`."""
  return _replace(study, dataclasses.replace(tuned, grown=tuned.grown + (value,)))


def decided(study: Study, choices: dict[str, dict]) -> Study:
  """The study with every decided tuned cell as a derived cell of its chosen candidate (its
  overrides, its grid's lr); undecided ones stay tuned (their points cannot train yet)."""
  cells = tuple(Cell(t.name, choices[t.name]["candidate"], (), own_lr=False)
                for t in study.tuned if (choices.get(t.name) or {}).get("candidate"))
  return dataclasses.replace(study, derived=study.derived + cells,
                             decided_tuned=tuple(c.name for c in cells))


def undecided(study: Study) -> list[str]:
  return [t.name for t in study.tuned if t.name not in study.decided_tuned]


def tune(study: Study, run_points: Callable[[list[str]], dict[str, dict]], floor: float
         ) -> tuple[Study, dict]:
  """The lr grid of every grid cell, candidates included (study/grid.py), grown where a tuned
  cell's best value sits at a numeric end, then each tuned cell's choice: (the study with the
  decided tuned cells resolved, lr_grid.json's content with a `tuned` entry)."""
  grid = lr_grid.tune(study, run_points, floor)
  while True:
    changed = study
    for t in study.tuned:
      c = choose(changed, t, grid)
      if c["extend"]:
        changed = with_value(changed, t, c["extend"])
    for t in changed.tuned:  # an `around` cell's values, once its reference is chosen
      ref = final(choose(changed, _named(changed, t.around), grid)) if t.around else None
      if ref and not t.resolved:
        values = around_values(ref["value"]) or t.values
        changed = _replace(changed, dataclasses.replace(t, resolved=values))
    if changed == study:
      break
    study = changed
    grid = lr_grid.tune(study, run_points, floor)
  if study.tuned:
    grid["tuned"] = {t.name: dict(choose(study, t, grid), grown=list(t.grown),
                                  resolved=list(t.resolved), key=t.key, rule_at=t.rule_at,
                                  around=t.around, candidates={v: candidate(t, v) for v in t.tried})
                     for t in study.tuned}
  return resolve(study, grid), grid


def final(choice: dict) -> dict | None:
  """The choice if it is final: every candidate's grid complete, a candidate chosen, no growth
  pending."""
  return choice if choice.get("candidate") and choice.get("complete") and not choice.get(
      "extend") else None


def _named(study: Study, name: str) -> Tuned:
  return next(t for t in study.tuned if t.name == name)


def _replace(study: Study, tuned: Tuned) -> Study:
  return dataclasses.replace(study, tuned=tuple(tuned if t.name == tuned.name else t
                                                for t in study.tuned))


def resolve(study: Study, grid: dict) -> Study:
  """The study as lr_grid.json decided it: grown candidate values, and each tuned cell whose
  choice is final as a derived cell of its chosen candidate."""
  tuned = (grid or {}).get("tuned") or {}
  if not study.tuned:
    return study
  study = dataclasses.replace(study, tuned=tuple(
      dataclasses.replace(t, grown=tuple(tuned.get(t.name, {}).get("grown", ())),
                          resolved=tuple(tuned.get(t.name, {}).get("resolved", ())))
      for t in study.tuned))
  return decided(study, {name: c for name, c in tuned.items() if final(c)})
