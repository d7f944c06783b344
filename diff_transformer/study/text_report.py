"""The sections of a language-modelling study's report (study/markdown.py orders them): what the
design can resolve, whether the runs were past early descent, the gap at parts of the budget,
and the AR-hit split beside a context-free n-gram model (the DIFF paper's Table 6 analog)."""
from __future__ import annotations

import math

import numpy as np

from diff_transformer.study.formatting import against, diff, num, pair_seeds, plural, signed, table
from diff_transformer.stats import smallest_effect
from diff_transformer.evaluation.loss import FREQUENCY_CLASSES
from diff_transformer.study.definition import BASELINE
from diff_transformer.study.study_json import BREAKDOWNS

DESCENT_LIMIT = 0.05  # past early descent: the last 20% of steps made under 5% of the fall
SHARES = (25, 50, 100)


def _runs(result: dict, variant: str) -> list[dict]:
  return [r for r in result["runs"] if r["variant"] == variant]


def resolvable(result: dict) -> list[str]:
  """First lines: the smallest paired effect the design detects, in paired standard deviations
  and (from the measured spread) in nats, and what the study cannot speak to."""
  info, primary = result["study"], result["study"]["primary"]
  m = info.get("design", {}).get("primary", {}).get("comparisons") or 1
  n = len(info["seeds"])
  k = smallest_effect(n, m)
  seeds_of = pair_seeds(result)
  # each pair's SD with the threshold of its own seed count (the shared one where all have n)
  effects = [(e[primary]["sd"], smallest_effect(seeds_of.get(pair, n), m))
             for pair, e in result["paired"].items()
             if primary in e and e[primary].get("sd") is not None
             and math.isfinite(e[primary]["sd"])]
  sds, nats = [sd for sd, _ in effects], [sd * k_pair for sd, k_pair in effects]
  spread = (f"; the measured SD of the paired differences in `{primary}` is "
            f"{num(min(sds), 4)}-{num(max(sds), 4)} nats, so the smallest effect this study "
            f"resolves is about {num(min(nats), 4)}-{num(max(nats), 4)} nats" if sds else
            "; no paired differences are measured yet")
  fewer = {pair: n_pair for pair, n_pair in seeds_of.items() if n_pair != n}
  at_fewer = "".join(f"; with the {n_pair} seeds of `{pair}`, {smallest_effect(n_pair, m):.2f}"
                     for pair, n_pair in fewer.items())
  lines = [f"**What this design can resolve**: with {n} seeds and {plural(m, 'comparison')} "
           f"(Holm), a paired difference of {k:.2f} standard deviations of the per-seed "
           f"differences is detected with 80% power (paired t approximation at alpha = "
           f"0.05/{m}){at_fewer}{spread}. "
           "A smaller true difference is likely to read 'not resolved'."]
  if info.get("scope"):
    lines.append(f"**Out of reach**: {info['scope']}")
  return [x for line in lines for x in (line, "")]


def descent(result: dict) -> list[str]:
  """Was each run past early descent (under DESCENT_LIMIT of its fall below the unigram baseline
  made over its last 20% of steps)? The grid runs, at every lr, are the pilot."""
  rows = []
  for v in result["summary"]:
    falls = [r["tail_fall"] for r in _runs(result, v) if r.get("tail_fall") is not None]
    if falls:
      rows.append([v, "compared", f"{np.mean(falls):.3f}", f"{max(falls):.3f}",
                   f"{sum(f < DESCENT_LIMIT for f in falls)}/{len(falls)}"])
  for cell, by_lr in ((result.get("lr_grid") or {}).get("table") or {}).items():
    falls = [c["tail_fall"] for seeds in by_lr.values() for c in seeds.values()
             if c and c.get("tail_fall") is not None]
    if falls:
      rows.append([cell, "lr grid (pilot)", f"{np.mean(falls):.3f}", f"{max(falls):.3f}",
                   f"{sum(f < DESCENT_LIMIT for f in falls)}/{len(falls)}"])
  if not rows:
    return []
  return (["## Past early descent?", "",
           "Share of each run's fall below the unigram baseline (validation loss, training-time "
           "eval rows) made over its last 20% of steps; under "
           f"{DESCENT_LIMIT:g} counts as past early descent (a run still in early descent makes "
           "20-30% of its fall there)."] + [""] +
          table(["variant", "runs", "mean share", "largest share",
                 f"runs under {DESCENT_LIMIT:g}"], rows) + [""])


def budgets(result: dict) -> list[str]:
  """The paired gap at the last evaluation within 25%, 50% and 100% of the steps (named by its
  step), and whether it narrows between the first and the last."""
  paired = result["paired"]
  if not paired:
    return []
  names = [f"val_loss_at_{s}pct" for s in SHARES]
  steps = _share_steps(result)
  label = lambda i: f"step {steps[i]}" if steps else f"{SHARES[i]}%"
  rows, notes = [], []
  for v, entries in paired.items():
    rows.append([v] + [diff(entries.get(m)) for m in names])
    first, last = entries.get(names[0], {}), entries.get(names[-1], {})
    if first.get("n") and last.get("n"):
      change = "narrows" if abs(last["mean_diff"]) < abs(first["mean_diff"]) else "does not narrow"
      notes.append(f"{v}: {num(first['mean_diff'], 4)} -> {num(last['mean_diff'], 4)} ({change})")
  where = f" (steps {', '.join(map(str, steps))} of {steps[-1]})" if steps else ""
  return (["## The gap at part of the budget (descriptive)", "",
           f"Paired difference {against(result)} in validation loss (training-time eval rows) "
           f"at the last evaluation within {', '.join(f'{s}%' for s in SHARES)} of the steps"
           f"{where}; the same runs, read from their curves; the lr was tuned for the full "
           "budget. A change inside one schedule is not a tokens axis."] + [""] +
          table(["pair" if result["study"].get("comparisons") else "variant"] +
                [f"at {label(i)}" for i in range(len(SHARES))], rows) +
          (["", f"From {label(0)} to {label(len(SHARES) - 1)} the mean gap "
            + "; ".join(notes) + "."] if notes else []) + [""])


def _share_steps(result: dict) -> list[int]:
  """The steps the budget columns read (from the first run's curve, in tokens), or [] when the
  runs hold no curve."""
  runs = [r for r in result["runs"] if r.get("curve")]
  info = result["study"]
  if not runs or not info.get("batch") or not info.get("seq_len"):
    return []
  per_step = info["batch"] * info["seq_len"]
  points = [round(x / per_step) for x, _ in runs[0]["curve"]]
  return [max((p for p in points if p <= points[-1] * s / 100 + 1e-9), default=points[0])
          for s in SHARES]


def ar_hit(result: dict) -> list[str]:
  """Table 6 analog, shown only where the models copy in context: every run's AR-hit loss below
  the context-free n-gram model's on the same tokens."""
  runs = [r for r in result["runs"] if r.get("ngram_ar_hit_loss") is not None]
  if not runs:
    return []
  context = runs[0].get("ar_hit_context", 1)
  below = sum(r["ar_hit_loss"] < r["ngram_ar_hit_loss"] for r in runs)
  head = ["## AR-hit split beside a context-free n-gram model (Table 6 analog)", "",
          f"AR-hit: the {context} tokens before a target, followed by it, occurred earlier in the "
          f"same context. The n-gram model (Witten-Bell, {context} tokens of context, fitted on "
          "the training split) never sees the rest of the context: a model whose AR-hit loss is "
          "not clearly below it shows no sign of copying in context.", ""]
  if below < len(runs):
    model = np.mean([r["ar_hit_loss"] for r in runs])
    ngram = np.mean([r["ngram_ar_hit_loss"] for r in runs])
    return head + [f"**Dropped**: the AR-hit loss is below the n-gram model's on only {below} of "
                   f"{len(runs)} runs (mean {model:.3f} against the n-gram model's {ngram:.3f} "
                   "nats), so these models show no sign of copying in context, and a difference "
                   "between variants on these tokens would not be about it. The split stays in "
                   "the descriptive table below.", ""]
  rows = []
  for v in result["summary"]:
    mine = [r for r in runs if r["variant"] == v]
    mean = lambda k: float(np.mean([r[k] for r in mine]))  # noqa: E731
    rows.append([v, num(mean("ar_hit_fraction"), 3), num(mean("ar_hit_loss"), 4),
                 num(mean("ngram_ar_hit_loss"), 4), num(mean("others_loss"), 4),
                 num(mean("ngram_others_loss"), 4),
                 num((mean("ngram_ar_hit_loss") - mean("ar_hit_loss")) -
                     (mean("ngram_others_loss") - mean("others_loss")), 4)])
  return head + [f"Every run's AR-hit loss is below the n-gram model's ({below}/{len(runs)})."
                 " Means over seeds; the last column is how much more the model gains over the "
                 "n-gram model on AR-hit tokens than on the others.", ""] + table(
      ["variant", "AR-hit share", "AR-hit loss", "n-gram AR-hit", "others loss",
       "n-gram others", "extra gain on AR-hit"], rows) + [
      "", "Paired differences in the AR-hit loss are in the secondary family below."
      if "ar_hit_loss" in result["study"].get("secondary", []) else "", ""]


def breakdowns(result: dict) -> list[str]:
  """Per pair, the paired gap in whole-split loss by position in the context and by the target's
  training frequency (descriptive): mean over seeds and how many seeds have it positive."""
  paired, runs = result["paired"], result["runs"]
  classes = [name for name, _ in FREQUENCY_CLASSES]
  names = sorted({k for r in runs for k in r if k.startswith(BREAKDOWNS)},
                 key=lambda k: (k.startswith("loss_on_"),
                                classes.index(k[8:]) if k[8:] in classes else -1, k))
  if not paired or not names:
    return []
  pairs = list(paired)
  by = {(r["variant"], r["seed"]): r for r in runs}

  def positive(pair: str, m: str) -> int:
    a, _, b = pair.partition(" vs ")  # a study without pre-named pairs keys them by variant
    b = b or BASELINE
    return sum(by[a, s][m] > by[b, s][m] for (v, s) in by if v == a and (b, s) in by
               and by[a, s].get(m) is not None and by[b, s].get(m) is not None)

  rows = []
  for m in names:
    cells = []
    for pair in pairs:
      e = paired[pair].get(m)
      cells.append("-" if not e or not e["n"] else
                   f"{signed(e['mean_diff'])} ({positive(pair, m)}/{e['n']} > 0)")
    label = (f"positions {int(m.rsplit('_', 1)[1])}-{int(m.rsplit('_', 1)[1]) + 31}"
             if m.startswith("loss_at_pos_") else m.removeprefix("loss_on_") + " bytes")
    rows.append([label] + cells)
  return (["## The gap by position and by byte frequency (descriptive)", "",
           f"Paired difference {against(result)} in whole-split validation loss, by the "
           "target's position in its context (bins of 32) and by its frequency in the training "
           "split (frequent: the most frequent ids making up 50% of the training tokens; middle: "
           "the next 40%; rare: the last 10%). Mean over seeds (seeds with a positive "
           "difference / n). Not tested."] + [""] +
          table(["where"] + pairs, rows) + [""])

