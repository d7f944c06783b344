"""report.md of a study (from report.build's result): the primary comparison first, then the
secondary tables with Holm-adjusted p, floors beside every accuracy, n in every cell."""
from __future__ import annotations

import math
from pathlib import Path

from diff_transformer.evaluation import floors
from diff_transformer.study import plots
from diff_transformer.study.definition import BASELINE
from diff_transformer.study.report import informative_slices

SECONDARY_TASK = ("val_accuracy", "final_loss", "first_query_accuracy", "answer_share",
                  "abs_answer_share", "distractor_share", "abs_distractor_share", "noise_share",
                  "abs_noise_share", "negative_mass", "logit_top1")
SECONDARY_TEXT = ("loss", "ar_hit_loss", "others_loss")


def _num(x: float, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def _pm(s: dict | None) -> str:
  if not s or s["n"] == 0:
    return "- (n=0)"
  std = "" if math.isnan(s["std"]) else f" ± {_num(s['std'])}"
  return f"{_num(s['mean'])}{std} (n={s['n']})"


def _signed(x: float) -> str:
  return "-" if math.isnan(x) else (f"{x:+.0f}" if abs(x) >= 100 else f"{x:+.3f}")


def _diff(p: dict | None) -> str:
  if not p or p["n"] == 0:
    return "-"
  ci = "" if math.isnan(p["ci95_low"]) else f" [{_signed(p['ci95_low'])}, {_signed(p['ci95_high'])}]"
  return (f"{_signed(p['mean_diff'])}{ci}, p={_num(p['p'])}, "
          f"p_holm={_num(p.get('p_holm', math.nan))} (n={p['n']})")


def _table(header: list[str], rows: list[list]) -> list[str]:
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
          ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _sizes(result: dict) -> list[str]:
  return result["study"]["sizes"] or [""]


def _at(metric: str, size: str) -> str:
  return f"{metric}@{size}" if size else metric


def _header(result: dict) -> list[str]:
  info = result["study"]
  minutes = sum(r["train_seconds"] for r in result["runs"]
                if r["train_seconds"] is not None and math.isfinite(r["train_seconds"])) / 60
  setting = (f"Task `{info['task']}` {info.get('task_params', '')}" if "task_params" in info
             else f"Text corpus `{info['task']}`, sizes {info['sizes']}")
  lines = [f"# Study {info['name']}", "", info["description"], "",
           f"{setting}; seq_len {info['seq_len']}; {info['steps']} steps of {info['batch']} rows; "
           f"seeds {info['seeds']} (the same data order for every variant per seed).", "",
           f"Command: `{info['command']}`", "",
           f"Wall time of this invocation: {info['wall_seconds'] / 60:.1f} min on "
           f"{info['machine']}; the runs' own training time, summed: {minutes:.1f} min."]
  calls = info.get("invocations") or []
  if len(calls) > 1:  # a resumed study: finished runs were skipped by the later invocations
    lines += ["Invocations on this root, in order: " + "; ".join(
        f"{c['wall_seconds'] / 60:.1f} min ({c['trained']} runs trained)" for c in calls) + "."]
  lines += [""]
  if result["missing"]:
    lines += [f"**Not in the tables** (failed or unfinished): {', '.join(result['missing'])}.", ""]
  n = len(info["seeds"])
  lines += ["## How to read this", "",
            f"- **Primary metric, named before the run: `{info['primary']}`.** Everything else "
            "is secondary; its p values are Holm-adjusted over all secondary entries together.",
            f"- p is an exact paired sign-flip test over seeds. With n = {n} pairs the smallest "
            f"two-sided p is {info['min_p']:.4f}: "
            + ("no comparison here can reach p < 0.05, whatever the data."
               if info["min_p"] >= 0.05 else "only a difference of the same sign on (nearly) "
               "every seed can reach p < 0.05.")
            + " A 95% t interval that excludes 0 leans on normality that n this small cannot "
            "check. 'Not resolved' means the data do not separate the variants, not that they "
            "are equal.", ""]
  return lines


def _lr_grid(result: dict) -> list[str]:
  grid = result["lr_grid"]
  if not grid:
    return ["Every variant trained at its preset's learning rate (no grid).", ""]
  rows = [[cell] + [_num(x, 4) if x is not None else "failed" for x in losses] +
          [grid["chosen"].get(cell)] for cell, losses in grid["val_loss"].items()]
  edge = [cell for cell, lr in grid["chosen"].items()
          if lr is not None and lr in (min(grid["lrs"]), max(grid["lrs"]))]
  note = ([f"At the edge of the grid: {', '.join(edge)}. Its best lr may lie beyond the grid, so "
           "its comparison is at the best lr tried, not at a bracketed optimum.", ""]
          if edge else ["Every chosen lr is inside the grid.", ""])
  return ([f"## Learning rate per variant ({grid['steps']}-step runs, seed {grid['seed']}, "
           "which no compared run uses; final validation loss)", ""] +
          _table(["variant"] + [f"lr {lr:g}" for lr in grid["lrs"]] + ["chosen"], rows) + [""] +
          note)


def _task_primary(result: dict) -> list[str]:
  summary, compared = result["summary"], result["paired"]
  primary = result["study"]["primary"]
  rows = []
  for v, s in summary.items():
    rows.append([v, s.get("reached_90", "-"), _num(s.get("steps_to_90_median") or math.inf),
                 _pm(s.get("steps_to_90")), s.get("still_rising", "-"),
                 _diff(compared.get(v, {}).get(primary)) if v != BASELINE else "baseline"])
  return (["## Primary: steps to 0.9 held-out accuracy on the trained slice", ""] +
          _table(["variant", "reached 0.9", "median steps (Kaplan-Meier; inf: not reached)",
                  "mean steps (censored at the budget)", "still rising over the last 20%",
                  "paired difference vs Transformer"], rows) +
          ["", "A run that never reached 0.9 counts at its last step (censored, a lower bound), "
           "never dropped; so a difference involving such a run is a bound on the true one.", ""])


def _task_slices(result: dict, root: Path) -> list[str]:
  summary, chance = result["summary"], result["chance"]
  slices = list(result["runs"][0]["accuracy"])
  def cell(v: str, s: str) -> str:
    got = summary[v].get(f"accuracy:{s}")
    at_floor = got and got["n"] and got["mean"] <= floors.highest(chance[s]) + 0.02
    return _pm(got) + (" **at floor**" if at_floor else "")

  rows = [[s] + [_num(chance[s][k]) for k in floors.KINDS] + [cell(v, s) for v in summary]
          for s in slices]
  informative = informative_slices(result)
  lines = (["## Accuracy per slice (mean ± std over seeds) beside its floors", ""] +
           _table(["slice"] + [f"floor: {k}" for k in floors.KINDS] + list(summary), rows) +
           ["", "Floors: what a shortcut scores on the same rows (random stored value; "
            "elimination of already answered items; one key token; both). **at floor**: the "
            "mean is within 0.02 of the best shortcut (or below it).", ""])
  lines += [("Slices where the Transformer is more than 0.1 above the best shortcut and below "
             "0.95 (where a difference can show): " + ", ".join(f"`{s}`" for s in informative))
            if informative else "No slice has the Transformer clearly between its best "
            "shortcut and ceiling: this study cannot separate the variants as configured.", ""]
  lines += [f"![accuracy per slice]({plots.slices(result, slices, root / 'accuracy.png')})",
            f"![learning curves]({plots.curves(result, root / 'learning_curves.png')})", ""]
  return lines


def _secondary(result: dict, metrics: list[str]) -> list[str]:
  compared = result["paired"]
  if not compared:
    return []
  rows = [[m] + [_diff(compared[v].get(m)) for v in compared] for m in metrics
          if any(m in compared[v] for v in compared)]
  return (["## Secondary: paired difference vs the Transformer (same seed)", "",
           "mean [95% t interval], exact sign-flip p, Holm-adjusted p over every secondary entry.",
           ""] + _table(["metric"] + list(compared), rows) + [""])


def _speed_notes(result: dict) -> list[str]:
  rising = {v: s.get("still_rising", "0/0") for v, s in result["summary"].items()}
  flagged = [v for v, k in rising.items() if not k.startswith("0/")]
  if not flagged:
    return ["No variant was still improving over its last 20% of steps: the gaps at the last "
            "step are gaps at convergence of this budget.", ""]
  return [f"Still improving (accuracy rising, or validation loss falling by more than 0.01) over "
          f"the last 20% of steps: {', '.join(f'{v} ({rising[v]})' for v in flagged)}. A gap at "
          "the last step involving these is **speed, not capability**: more steps may close "
          "it.", ""]


def _text_tables(result: dict, root: Path) -> list[str]:
  summary = result["summary"]
  lines = []
  for size in _sizes(result):
    rows = [[v] + [_pm(summary[v].get(_at(m, size))) for m in SECONDARY_TEXT] for v in summary]
    lines += [f"## Size {size}: validation loss and its AR-hit / others split (Table 6 analog)",
              ""] + _table(["variant", "val loss", "AR-hit loss", "others loss"], rows) + [""]
  lines += [f"![loss vs tokens]({plots.loss_vs_tokens(result, root / 'loss_vs_tokens.png')})",
            f"![loss vs size]({plots.loss_vs_size(result, root / 'loss_vs_size.png')})", ""]
  return lines


def write(result: dict, root: Path) -> Path:
  lines = _header(result) + _lr_grid(result)
  if "task_params" in result["study"]:
    slices = [f"accuracy:{s}" for s in result["runs"][0]["accuracy"]]
    lines += _task_primary(result) + _speed_notes(result) + _task_slices(result, root)
    lines += _secondary(result, [m for m in SECONDARY_TASK + tuple(slices)
                                 if m != result["study"]["primary"]])
  else:
    metrics = [_at(m, z) for z in _sizes(result) for m in SECONDARY_TEXT]
    primary = result["study"]["primary"]
    lines += ([f"## Primary: `{primary}`", ""] +
              _table(["variant", "mean ± std", "paired difference vs Transformer"],
                     [[v, _pm(s.get(primary)), _diff(result["paired"].get(v, {}).get(primary))
                       if v != BASELINE else "baseline"] for v, s in result["summary"].items()]) +
              [""] + _speed_notes(result) + _text_tables(result, root) +
              _secondary(result, [m for m in metrics if m != primary]))
  path = root / "report.md"
  path.write_text("\n".join(lines))
  return path
