"""A study's plots: accuracy per slice against its best shortcut, learning curves, the pre-named
pairs' differences, for a language-modelling study validation loss against tokens (per size)
and against parameters, and a tuned setting's grid score against its value."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from diff_transformer.evaluation import common, floors
from diff_transformer.study.grid import at_chosen_lr
from diff_transformer.study.named import number_or_none


def _std(x: dict) -> float:
  return 0.0 if math.isnan(x["std"]) else x["std"]


def slices(result: dict, names: list[str], path: Path) -> str:
  fig, ax = common.figure(size=(7, 3.4))
  variants = list(result["summary"])
  width = 0.8 / max(len(variants), 1)
  for i, v in enumerate(variants):
    s = [result["summary"][v].get(f"accuracy:{k}") for k in names]
    ax.bar(np.arange(len(names)) + (i - (len(variants) - 1) / 2) * width,
           [x["mean"] for x in s], width, yerr=[_std(x) for x in s], capsize=2, label=v)
  ax.scatter(range(len(names)), [floors.highest(result["chance"][k]) for k in names],
             marker="_", s=300, color="k", label="best shortcut", zorder=3)
  ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=7)
  ax.set_ylabel("answer accuracy")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7, ncols=3)
  return common.save_figure(fig, path)


def _mean_curves(result: dict, variant: str, size: str = ""):
  """(x, mean, std, n) over the seeds' curves, on the x values every seed has."""
  curves = [dict(r["curve"]) for r in result["runs"]
            if r["variant"] == variant and r["size"] == size and r["curve"]]
  xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
  if not xs:
    return None
  y = np.asarray([[c[x] for x in xs] for c in curves])
  return xs, y.mean(0), y.std(0), len(curves)


def curves(result: dict, path: Path) -> str:
  """Every run's curve faint (a run that stopped at the level ends there) and the mean ± std bold
  over the steps every run of the variant reached."""
  fig, ax = common.figure(size=(6, 3.4))
  for i, v in enumerate(result["summary"]):
    color = f"C{i}"
    for r in result["runs"]:
      if r["variant"] == v and r.get("curve"):
        steps, values = zip(*r["curve"])
        ax.plot(steps, values, color=color, lw=0.6, alpha=0.35)
    got = _mean_curves(result, v)
    if got:
      xs, mean, std, n = got
      ax.plot(xs, mean, color=color, lw=2, label=f"{v} (n={n}; mean to the first stop)")
      ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.15)
  ax.axhline(0.9, color="k", lw=0.5, ls=":")
  ax.set_xlabel("step")
  ax.set_ylabel("held-out answer accuracy")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)


def _log_x(ax, xs) -> None:
  """A log x axis labelled at the measured x values (1.2M, 410k), not at powers of ten whose
  minor labels overlap on ranges this short."""
  ax.set_xscale("log")
  xs = sorted({float(x) for x in xs})
  ax.set_xticks(xs, [f"{x / 1e6:.2g}M" if x >= 1e6 else f"{x / 1e3:.3g}k" for x in xs])
  ax.xaxis.set_minor_formatter("")


def loss_vs_tokens(result: dict, path: Path) -> str:
  """Validation loss against training tokens per size (DIFF Fig. 3 in tokens): every seed's
  curve faint, the mean over seeds bold, the unigram baseline dotted."""
  sizes = result["study"]["sizes"] or [""]
  fig, axes = common.figure(ncols=len(sizes), size=(4.2 * len(sizes), 3.4))
  axes = axes if isinstance(axes, list) else [axes]
  for ax, size in zip(axes, sizes):
    for i, v in enumerate(result["summary"]):
      runs = [r for r in result["runs"] if r["variant"] == v and r["size"] == size and r["curve"]]
      for r in runs:
        tokens, loss = zip(*r["curve"])
        ax.plot(np.asarray(tokens) / 1e6, loss, color=f"C{i}", lw=0.6, alpha=0.3)
      got = _mean_curves(result, v, size)
      if got:
        xs, mean, _, n = got
        ax.plot(np.asarray(xs) / 1e6, mean, color=f"C{i}", lw=2, label=f"{v} (mean of {n})")
    unigram = [r["unigram_entropy"] for r in result["runs"] if r.get("unigram_entropy")]
    if unigram:
      ax.axhline(unigram[0], color="k", lw=0.6, ls=":", label="unigram baseline")
    ax.set_xlabel("training tokens (millions)")
    ax.set_title(f"size {size}" if size else "", fontsize=8)
  axes[0].set_ylabel("validation loss (nats/token)")
  axes[0].legend(fontsize=7)
  return common.save_figure(fig, path)


def loss_vs_size(result: dict, path: Path) -> str:
  fig, ax = common.figure(size=(5, 3.2))
  for v in result["summary"]:
    points = []
    for size in result["study"]["sizes"] or [""]:
      runs = [r for r in result["runs"] if r["variant"] == v and r["size"] == size]
      if runs:
        loss = [r["loss"] for r in runs]
        points.append((runs[0]["params"], np.mean(loss), np.std(loss)))
    if points:
      p, m, s = map(np.asarray, zip(*points))
      ax.errorbar(p, m, yerr=s, marker="o", capsize=2, label=v)
  _log_x(ax, [r["params"] for r in result["runs"]])
  ax.set_xlabel("parameters")
  ax.set_ylabel("final validation loss (nats/token)")
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)


def pairs(result: dict, path: Path) -> str:
  """The primary pairs a - b, one row each: every seed's difference faint, the mean with its 95%
  t interval bold, the published difference hollow (its own units; grey within its noise), zero
  dotted."""
  info, primary = result["study"], result["study"]["primary"]
  published = {(a, b): x for a, b, x in info.get("published", [])}
  value = {(r["variant"], r["size"], r["seed"]): r.get(primary) for r in result["runs"]}
  rows = list(reversed(info["comparisons"]))  # the first pair on top
  labelled: set[str] = set()

  def once(label: str) -> str | None:  # each legend entry on the first row that draws it
    if label in labelled:
      return None
    labelled.add(label)
    return label

  fig, ax = common.figure(size=(6.4, 0.5 * len(rows) + 1.6))
  for y, (a, b) in enumerate(rows):
    seeds = [(z, s) for (v, z, s), x in value.items() if v == a and x is not None
             and value.get((b, z, s)) is not None]
    if seeds:
      ax.scatter([value[a, z, s] - value[b, z, s] for z, s in seeds], [y] * len(seeds),
                 s=10, color="C0", alpha=0.35, label=once("one seed"))
    entry = result["paired"].get(f"{a} vs {b}", {}).get(primary) or {}
    low, high = entry.get("ci95_low"), entry.get("ci95_high")
    if entry.get("n") and low is not None and high is not None:
      mean = entry["mean_diff"]
      ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color="C0", capsize=3,
                  label=once("mean, 95% interval"))
    if entry.get("p_holm") is not None:
      ax.annotate(f"Holm p {entry['p_holm']:.2g}", (1.0, y), xycoords=("axes fraction", "data"),
                  xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    if (a, b) in published:
      quiet = abs(published[a, b]) <= info.get("published_noise", 0.0)
      ax.scatter([published[a, b]], [y], marker="D", facecolors="none",
                 edgecolors="0.6" if quiet else "C3", zorder=3,
                 label=once("published, within its noise (no sign)" if quiet
                            else "published (its own units)"))
  ax.axvline(0, color="k", lw=0.6, ls=":")
  ax.set_yticks(range(len(rows)), [f"{a} - {b}" for a, b in rows], fontsize=7)
  ax.set_xlabel(f"paired difference a - b in `{primary}`")
  if labelled:  # no pair has both sides recorded yet: an empty legend only warns
    fig.legend(fontsize=7, loc="outside lower center", ncol=2, frameon=False)
  return common.save_figure(fig, path)


def tuned_values(result: dict, path: Path) -> str:
  """Each tuned cell's grid score against its value (log axis), every grid seed faint, the mean
  bold (hollow while that value's lr grid is not finished), the best value starred; a value off
  the axis (a layer-dependent rule) a dashed line."""
  grid = result["lr_grid"]
  fig, ax = common.figure(size=(6, 3.6))
  xs: list[float] = []
  for i, (name, c) in enumerate(grid["tuned"].items()):
    on_axis: list[tuple[float, str, tuple[float, float, list[float]]]] = []
    off_axis: list[tuple[str, tuple[float, float, list[float]]]] = []
    for value, cell in c["candidates"].items():
      got = at_chosen_lr(grid, cell)
      x = number_or_none(value)
      x = c["rule_at"] if x is None else x
      if got is not None and x is not None:
        on_axis.append((x, value, got))
      elif got is not None:
        off_axis.append((value, got))
    on_axis.sort(key=lambda t: t[0])
    for x, value, (_, mean, seeds) in on_axis:
      ax.scatter([x] * len(seeds), seeds, color=f"C{i}", s=8, alpha=0.35)
      done = (grid["decisions"].get(c["candidates"][value]) or {}).get("complete")
      ax.scatter([x], [mean], color=f"C{i}", zorder=3, facecolor=f"C{i}" if done else "white",
                 marker="*" if value == c["value"] and done else "o",
                 s=140 if value == c["value"] and done else 30)
    if on_axis:
      ax.plot([t[0] for t in on_axis], [t[2][1] for t in on_axis], color=f"C{i}", lw=1.8,
              label=name)
      xs += [t[0] for t in on_axis]
    for value, (_, mean, _) in off_axis:
      ax.axhline(mean, color=f"C{i}", lw=1, ls="--", label=f"{name}: {value}"
                 + (" (chosen)" if value == c["value"] else ""))
  if xs:
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(xs)), [f"{x:g}" for x in sorted(set(xs))])
    ax.xaxis.set_minor_formatter("")
    ax.tick_params(axis="x", labelrotation=45)  # neighbours such as 0.1 and 0.125 stay apart
  keys = sorted({c["key"] for c in grid["tuned"].values()})
  ax.set_xlabel(", ".join(keys) + " (star: best; hollow: its lr grid not finished)")
  ax.set_ylabel(f"{grid['metric']} at its best lr (grid seeds)")
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)
