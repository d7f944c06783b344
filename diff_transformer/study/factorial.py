"""A pre-named 2 x 2 (Study.factorial): its four cell means, both main effects and their
interaction in the primary metric, seed by seed over the seeds all four cells ran, each with its
95% t interval. Named in the study file before any run, reported beside the primary family; no
p is reported for it (the pre-named pairs are the family that is tested)."""
from __future__ import annotations

import math

from diff_transformer.study.formatting import pm, signed, table
from diff_transformer.stats import paired, summarize


def effects(study, runs: list[dict]) -> dict:
  """{factors, cells, means, effects: {name: paired-style entry of the per-seed effect}}."""
  (a, b), corners = study.factorial
  values = {c: {r["seed"]: r.get(study.primary, math.nan) for r in runs if r["variant"] == c}
            for c in corners}
  seeds = sorted(set.intersection(*(set(v) for v in values.values())))
  y00, y10, y01, y11 = ({s: values[c][s] for s in seeds} for c in corners)
  per_seed = {
      f"main effect of {a}": {s: (y10[s] - y00[s] + y11[s] - y01[s]) / 2 for s in seeds},
      f"main effect of {b}": {s: (y01[s] - y00[s] + y11[s] - y10[s]) / 2 for s in seeds},
      "interaction": {s: (y11[s] - y01[s]) - (y10[s] - y00[s]) for s in seeds},
  }
  zero = {s: 0.0 for s in seeds}
  out = {name: {k: x for k, x in paired(v, zero).items() if k != "p"}
         for name, v in per_seed.items()}
  return dict(factors=[a, b], cells=list(corners), seeds=seeds,
              means={c: summarize([values[c][s] for s in seeds]) for c in corners},
              effects=out)


def report(result: dict) -> list[str]:
  f = result.get("factorial")
  if not f:
    return []
  (a, b), (c00, c10, c01, c11) = f["factors"], f["cells"]
  m = f["means"]
  rows = [[f"{b}: no", f"{c00}: {pm(m[c00])}", f"{c10}: {pm(m[c10])}"],
          [f"{b}: yes", f"{c01}: {pm(m[c01])}", f"{c11}: {pm(m[c11])}"]]
  effect_rows = [[name, _interval(entry)] for name, entry in f["effects"].items()]
  primary = result["study"]["primary"]
  return ([f"## The pre-named 2 x 2: {a} x {b} (`{primary}`, the {len(f['seeds'])} seeds all "
           "four cells ran)", ""] +
          table(["", f"{a}: no", f"{a}: yes"], rows) + [""] +
          table(["effect (per seed, then mean)", "mean [95% t interval] (n)"], effect_rows) +
          ["", f"A main effect is the mean of its two simple effects (e.g. {a}: at either level "
           f"of {b}); the interaction is the difference between them (how much {a}'s effect "
           f"changes when {b} is on). Intervals only: the six pre-named pairs above are the "
           "tested family.", ""])


def _interval(e: dict) -> str:
  if not e["n"]:
    return "-"
  ci = "" if math.isnan(e["ci95_low"]) else f" [{signed(e['ci95_low'])}, {signed(e['ci95_high'])}]"
  return f"{signed(e['mean_diff'])}{ci} (n={e['n']})"
