"""report.md of a study (from report.build's result): the preamble (study/preamble.py), the primary
comparison, floors beside every accuracy, the pre-named secondary family with Holm-adjusted p,
then every other metric as descriptive (no p); n in every cell."""
from __future__ import annotations

import math
from pathlib import Path

from diff_transformer.evaluation import floors
from diff_transformer.paths import write_atomic
from diff_transformer.study import factorial, plots, preamble, text_report
from diff_transformer.study.formatting import against, diff, num, pm, signed, table
from diff_transformer.study.definition import BASELINE
from diff_transformer.study.study_json import informative_slices

TASK_METRICS = ("val_accuracy", "final_loss", "first_query_accuracy", "answer_share",
                  "abs_answer_share", "distractor_share", "abs_distractor_share", "noise_share",
                  "abs_noise_share", "negative_mass", "noise_negative_mass", "logit_top1")
TEXT_METRICS = ("loss", "ar_hit_loss", "others_loss")


def _sizes(result: dict) -> list[str]:
  return result["study"]["sizes"] or [""]


def _at(metric: str, size: str) -> str:
  return f"{metric}@{size}" if size else metric


def _task_primary(result: dict) -> list[str]:
  summary, compared = result["summary"], result["paired"]
  primary = result["study"]["primary"]
  rows = []
  for v, s in summary.items():
    bound = s.get("steps_to_90_bound")
    mean = pm(s.get("steps_to_90"))
    rows.append([v, s.get("reached_90", "-"), num(s.get("steps_to_90_median") or math.inf),
                 f"{bound} {mean}" if bound else mean, s.get("still_rising", "-"),
                 diff(compared.get(v, {}).get(primary)) if v != BASELINE else "baseline"])
  return (["## Primary: steps to 0.9 held-out accuracy on the trained slice", ""] +
          table(["variant", "reached 0.9", "median steps (Kaplan-Meier; inf: not reached)",
                  "mean steps ('>=': censored runs counted at their last step)",
                  "still rising over the last 20%", "paired difference vs Transformer"], rows) +
          ["", "A run that never reached 0.9 is censored at its last step, never dropped. A pair "
           "is earlier or later when its order is known, undetermined when not (both censored); "
           "p is a sign test on the determined pairs, and a mean difference involving censored "
           "runs is a bound, or not bounded.", ""])


def _task_slices(result: dict, root: Path) -> list[str]:
  summary, chance = result["summary"], result["chance"]
  slices = list(result["runs"][0]["accuracy"])
  def cell(v: str, s: str) -> str:
    got = summary[v].get(f"accuracy:{s}")
    at_floor = got and got["n"] and got["mean"] <= floors.highest(chance[s]) + 0.02
    return pm(got) + (" **at floor**" if at_floor else "")

  rows = [[s] + [num(chance[s][k]) for k in floors.KINDS] + [cell(v, s) for v in summary]
          for s in slices]
  informative = informative_slices(result)
  lines = (["## Accuracy per slice (mean ± std over seeds) beside its floors", ""] +
           table(["slice"] + [f"floor: {k}" for k in floors.KINDS] + list(summary), rows) +
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
    return [[m] + [diff(compared[v].get(m)) for v in compared] for m in metrics
            if any(compared[v].get(m, {}).get("family") == family for v in compared)]
  design = result["study"].get("design", {}).get("secondary", {})
  named = rows("secondary")
  lines = []
  if named:
    why = ("" if design.get("can_resolve") else
           f" This family cannot reach p < 0.05 after Holm at {len(result['study']['seeds'])} "
           f"seeds (it needs {design.get('seeds_needed')}): read it as descriptive.")
    lines += ([f"## Pre-named secondary metrics: paired difference {against(result)}", "",
               "mean [95% t interval] (n), exact p, Holm-adjusted p within this family." + why,
               ""] + table(["metric"] + list(compared), named) + [""])
  lines += ([f"## Descriptive: paired difference {against(result)} (no p)", "",
             "Mean difference over seeds (n). Not tested: a pattern here is a question for "
             "a study that names it in advance, not a finding.", ""] +
            table(["metric"] + list(compared), rows("descriptive")) + [""])
  return lines


def _cells(result: dict) -> list[str]:
  """The compared cells: what each is built from, at which lr it trained, its primary metric
  beside the published source's value for it."""
  primary = result["study"]["primary"]
  rows = []
  for v, c in result["study"]["cells"].items():
    lr = "-" if c["lr"] is None else f"{c['lr']:g}"
    source = "its own grid" if c["lr_from"] == v else f"{c['lr_from']}'s grid"
    rows.append([v, c["parent"] or "registered variant",
                 ", ".join(f"{k}={x}" for k, x in c["overrides"].items()) or "-",
                 f"{lr} ({source})",
                 ", ".join(f"{n:,}" for n in c["params"]) or "-",
                 pm(result["summary"].get(v, {}).get(primary)),
                 "-" if c.get("published") is None else f"{c['published']:g}"])
  return (["## Cells", ""] +
          table(["cell", "built from", "overrides (after its parent's)", "lr", "parameters",
                 f"`{primary}` (mean ± std)", "published"], rows) + [""])


def _pairs_primary(result: dict, root: Path) -> list[str]:
  """The primary family of pre-named pairs, each beside its published figure."""
  info, summary, paired = result["study"], result["summary"], result["paired"]
  primary = info["primary"]
  published = {(a, b): x for a, b, x in info.get("published", [])}
  noise = info.get("published_noise", 0.0)
  rows = []
  for a, b in info["comparisons"]:
    entry = (paired.get(f"{a} vs {b}") or {}).get(primary)
    ours = entry["mean_diff"] if entry and entry["n"] else math.nan
    theirs = published.get((a, b))
    same = ("-" if theirs is None or math.isnan(ours) or not ours or not theirs else
            "within the source's noise" if abs(theirs) <= noise else
            "yes" if (ours > 0) == (theirs > 0) else "no")
    rows.append([f"{a} - {b}", pm(summary.get(a, {}).get(primary)),
                 pm(summary.get(b, {}).get(primary)), diff(entry),
                 "-" if theirs is None else signed(theirs), same])
  source = info.get("published_source") or "the published figure"
  return ([f"## Primary: `{primary}`, {len(rows)} pre-named pairs (a - b), Holm over "
           f"{len(rows)}", ""] +
          table(["pair", "a: mean ± std", "b: mean ± std", "paired difference a - b",
                 "published a - b", "same sign"], rows) +
          ["", f"Published: {source}. 'Same sign' compares the two mean differences' signs "
           "only; a pair whose Holm p is 0.05 or more is not resolved here, and its sign is "
           "not a finding." + (f" A published difference of {noise:g} or less is read as within "
                               "its source's run-to-run noise and given no sign." if noise
                               else ""), "",
           f"![pre-named pairs]({plots.pairs(result, root / 'pairs.png')})", ""] +
          factorial.report(result))


def _speed_notes(result: dict) -> list[str]:
  rising = {v: s.get("still_rising", "0/0") for v, s in result["summary"].items()}
  flagged = [v for v, k in rising.items() if not k.startswith("0/")]
  if not flagged:
    return ["No variant was still improving over its last 20% of steps (a run stopped at its "
            "accuracy level stops there by design): the gaps are those at the last step, not "
            "evidence of convergence.", ""]
  return [f"Still improving (accuracy rising, or validation loss falling by more than 0.01) over "
          f"the last 20% of steps: {', '.join(f'{v} ({rising[v]})' for v in flagged)}. A gap at "
          "the last step involving these may change with more steps; that they still improve "
          "does not say whether the gap is one of speed or of capability.", ""]


def _text_tables(result: dict, root: Path) -> list[str]:
  summary = result["summary"]
  lines = []
  for size in _sizes(result):
    rows = [[v] + [pm(summary[v].get(_at(m, size))) for m in TEXT_METRICS] for v in summary]
    lines += [f"## {'Size ' + size + ': v' if size else 'V'}alidation loss and its AR-hit / "
              "others split (mean ± std over seeds)", ""] + table(
                  ["variant", "val loss", "AR-hit loss", "others loss"], rows) + [""]
  lines += [f"![loss vs tokens]({plots.loss_vs_tokens(result, root / 'loss_vs_tokens.png')})"]
  if len(_sizes(result)) > 1:
    lines += [f"![loss vs size]({plots.loss_vs_size(result, root / 'loss_vs_size.png')})"]
  return lines + [""] + (text_report.descent(result) + text_report.budgets(result) +
                         text_report.breakdowns(result) + text_report.ar_hit(result))


def write(result: dict, root: Path) -> Path:
  text = "task_params" not in result["study"]
  lines = (preamble.header(result, text_report.resolvable(result) if text else [])
           + preamble.lr_grid(result) + preamble.tuned_values(result, root))
  if not result["runs"]:
    lines += ["No compared run has finished yet.", ""] + (text_report.descent(result) if text
                                                           else [])
  elif "task_params" in result["study"]:
    slices = [f"accuracy:{s}" for s in result["runs"][0]["accuracy"]]
    primary = (_cells(result) + _pairs_primary(result, root) if result["study"].get("comparisons")
               else _task_primary(result))
    lines += primary + _speed_notes(result) + _task_slices(result, root)
    lines += _secondary(result, [m for m in TASK_METRICS + tuple(slices)
                                 if m != result["study"]["primary"]])
  else:
    metrics = [_at(m, z) for z in _sizes(result) for m in TEXT_METRICS]
    primary = result["study"]["primary"]
    head = (_cells(result) + _pairs_primary(result, root) if result["study"].get("comparisons") else
            [f"## Primary: `{primary}`", ""] +
            table(["variant", "mean ± std", "paired difference vs Transformer"],
                  [[v, pm(s.get(primary)), diff(result["paired"].get(v, {}).get(primary))
                    if v != BASELINE else "baseline"] for v, s in result["summary"].items()])
            + [""])
    lines += (head + _speed_notes(result) + _text_tables(result, root) +
              _secondary(result, [m for m in metrics if m != primary]))
  path = root / "report.md"
  write_atomic(path, "\n".join(lines))
  return path
