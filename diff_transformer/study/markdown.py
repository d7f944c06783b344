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
                  "abs_noise_share", "negative_mass", "noise_negative_mass", "logit_top1")
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
  """A paired entry: the mean difference (a bound when censored runs enter it; a t interval only
  for inferential, uncensored metrics), n, and p with its Holm-adjusted p unless descriptive."""
  if not p or p["n"] == 0:
    return "-"
  inferential = p.get("family", "primary") != "descriptive"
  if p.get("censored"):
    mean = ("not bounded (censored on both sides)" if p["bound"] == "undetermined" else
            f"{p['bound'] or ''} {_signed(p['mean_diff'])}".strip())
    text = (f"{mean} (n={p['n']}; determined {p['n_determined']}: {p['earlier']} earlier, "
            f"{p['later']} later, {p['tied']} tied)")
  else:
    ci = ("" if not inferential or math.isnan(p["ci95_low"]) else
          f" [{_signed(p['ci95_low'])}, {_signed(p['ci95_high'])}]")
    text = f"{_signed(p['mean_diff'])}{ci} (n={p['n']})"
  if not inferential:
    return text
  test = "sign test" if p.get("censored") else "sign-flip"
  return f"{text}, {test} p={_num(p['p'])}, p_holm={_num(p.get('p_holm', math.nan))}"


def _table(header: list[str], rows: list[list]) -> list[str]:
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
          ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _sizes(result: dict) -> list[str]:
  return result["study"]["sizes"] or [""]


def _at(metric: str, size: str) -> str:
  return f"{metric}@{size}" if size else metric


def _warnings(result: dict) -> list[str]:
  """The report's first lines: what limits every reading below."""
  info, grid = result["study"], result["lr_grid"]
  design = info.get("design", {})
  lines = []
  if info.get("exploratory"):
    primary = design.get("primary", {})
    lines.append(f"**Exploratory**: the primary family ({primary.get('comparisons')} "
                 f"comparisons, Holm) can reach p = {_num(primary.get('smallest_p'), 4)} at best "
                 f"with {len(info['seeds'])} seeds (it needs {primary.get('seeds_needed')}); "
                 "nothing below can be a finding.")
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
  return [x for line in lines for x in (line, "")]


def _how_to_read(info: dict) -> list[str]:
  design, n = info.get("design", {}), len(info["seeds"])
  def family(name: str, what: str) -> str:
    d = design.get(name, {})
    if not d.get("comparisons"):
      return ""
    reach = (f"can reach p = {_num(d['smallest_p'], 4)} after Holm" if d["can_resolve"] else
             f"cannot reach p < 0.05 after Holm (smallest {_num(d['smallest_p'], 4)}; it needs "
             f"{d['seeds_needed']} seeds), so it is read as descriptive")
    return f"- **{what}** ({d['comparisons']} comparisons, Holm within the family): {reach}.\n"
  secondary = ", ".join(f"`{m}`" for m in info.get("secondary", [])) or "none"
  lines = ["## How to read this", "",
           f"- **Primary metric, named before the run: `{info['primary']}`.** Pre-named "
           f"secondary metrics: {secondary}. Every other metric is **descriptive**: a mean "
           "difference with its n, no p.",
           (family("primary", "Primary family") + family("secondary", "Secondary family")).rstrip(),
           f"- p: an exact paired test over the {n} seeds (a sign-flip test; for a time censored "
           "at the budget, a sign test on the pairs whose order is determined). A mean "
           "difference that involves censored runs is a bound ('<=' or '>='), or not bounded; "
           "it never gets a t interval. 'Not resolved' means the data do not separate the "
           "variants, not that they are equal."]
  if info.get("stop_at_level"):
    lines.append(f"- Each compared and grid run stopped once it reached {info['stop_at_level']} "
                 "held-out accuracy on the trained slice; its other metrics are measured at that "
                 "step (at the budget for runs that never reached it).")
  return lines + [""]


def _header(result: dict) -> list[str]:
  info = result["study"]
  minutes = sum(r["train_seconds"] for r in result["runs"]
                if r["train_seconds"] is not None and math.isfinite(r["train_seconds"])) / 60
  setting = (f"Task `{info['task']}` {info.get('task_params', '')}" if "task_params" in info
             else f"Text corpus `{info['task']}`, sizes {info['sizes']}")
  lines = [f"# Study {info['name']}", ""] + _warnings(result) + [
      info["description"], "",
      f"{setting}; seq_len {info['seq_len']}; budget {info['steps']} steps of {info['batch']} "
      f"rows; seeds {info['seeds']} (the same data order for every variant per seed).", "",
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
  return lines + _how_to_read(info)


def _grid_cell(cell: dict | None, budget: int) -> str:
  if cell is None:
    return "-"
  if cell.get("failed"):
    return "failed"
  if "steps" in cell:
    return f"{cell['steps']:.0f}" if cell["reached"] else f">{budget} ({_num(cell['val_accuracy'], 2)})"
  return _num(cell["final_loss"], 4)


def _lr_grid(result: dict) -> list[str]:
  grid = result["lr_grid"]
  if not grid:
    return ["Every variant trained at its preset's learning rate (no grid).", ""]
  lrs = sorted({float(lr) for table in grid["table"].values() for lr in table})
  rows = []
  for cell, table in grid["table"].items():
    d = grid["decisions"][cell]
    for seed in map(str, grid["seeds"]):
      rows.append([cell, seed] + [_grid_cell(table.get(f"{lr:g}", {}).get(seed), grid["steps"])
                                  for lr in lrs] +
                  [f"{d['chosen']:g}" if d["chosen"] else "none",
                   "yes" if d["bracketed"] else "pending" if not d.get("complete", True)
                   else "**not bracketed**",
                   "**untuned**" if d["untuned"] else "no"])
  what = ("steps to reach the level (>budget: never, with the final accuracy)"
          if grid["metric"].startswith("steps_to") else "final validation loss")
  return ([f"## Learning rate per variant ({grid['steps']}-step budget, grid seeds "
           f"{grid['seeds']}, which no compared run uses; judged by `{grid['metric']}`)", "",
           f"Each cell: {what}; '-': not run (outside this variant's grid)."] + [""] +
          _table(["variant", "seed"] + [f"lr {lr:g}" for lr in lrs] +
                 ["chosen", "bracketed", "untuned"], rows) + [""])


def _task_primary(result: dict) -> list[str]:
  summary, compared = result["summary"], result["paired"]
  primary = result["study"]["primary"]
  rows = []
  for v, s in summary.items():
    bound = s.get("steps_to_90_bound")
    mean = _pm(s.get("steps_to_90"))
    rows.append([v, s.get("reached_90", "-"), _num(s.get("steps_to_90_median") or math.inf),
                 f"{bound} {mean}" if bound else mean, s.get("still_rising", "-"),
                 _diff(compared.get(v, {}).get(primary)) if v != BASELINE else "baseline"])
  return (["## Primary: steps to 0.9 held-out accuracy on the trained slice", ""] +
          _table(["variant", "reached 0.9", "median steps (Kaplan-Meier; inf: not reached)",
                  "mean steps ('>=': censored runs counted at their last step)",
                  "still rising over the last 20%", "paired difference vs Transformer"], rows) +
          ["", "A run that never reached 0.9 is censored at its last step, never dropped. A pair is "
           "earlier or later when its order is known, undetermined when not (both censored); p is "
           "a sign test on the determined pairs, and a mean difference involving censored runs "
           "is a bound, or not bounded.", ""])


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
  """The pre-named secondary family (with p and Holm), then every other metric (descriptive)."""
  compared = result["paired"]
  if not compared:
    return []
  def rows(family: str) -> list[list]:
    return [[m] + [_diff(compared[v].get(m)) for v in compared] for m in metrics
            if any(compared[v].get(m, {}).get("family") == family for v in compared)]
  design = result["study"].get("design", {}).get("secondary", {})
  named = rows("secondary")
  lines = []
  if named:
    why = ("" if design.get("can_resolve") else
           f" This family cannot reach p < 0.05 after Holm at {len(result['study']['seeds'])} "
           f"seeds (it needs {design.get('seeds_needed')}): read it as descriptive.")
    lines += (["## Pre-named secondary metrics: paired difference vs the Transformer", "",
               "mean [95% t interval] (n), exact p, Holm-adjusted p within this family." + why,
               ""] + _table(["metric"] + list(compared), named) + [""])
  lines += (["## Descriptive: paired difference vs the Transformer (no p)", "",
             "Mean difference over seeds (n). Not tested: a pattern here is a question for "
             "a study that names it in advance, not a finding.", ""] +
            _table(["metric"] + list(compared), rows("descriptive")) + [""])
  return lines


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
  if not result["runs"]:
    lines += ["No compared run has finished yet.", ""]
  elif "task_params" in result["study"]:
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
