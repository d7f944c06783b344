"""Collect a sweep's final validation losses, fit L(N) and L(D) per variant, write JSON, a
markdown report and plots."""
from __future__ import annotations

import collections
import json
import os

import numpy as np

from diff_transformer import params
from diff_transformer.evaluation.common import pyplot
from diff_transformer.model.attention import spec_from_config
from diff_transformer.runs.folder import RunFolder
from diff_transformer.sweeps import fit
from diff_transformer.sweeps.definition import Sweep, SweepError, tokens


def collect(sweep: Sweep, root: str) -> list[dict]:
  rows = []
  for point in sweep.points():
    summary = RunFolder(os.path.join(root, point)).read_summary(SweepError)
    if not summary or "val_loss" not in summary:
      continue
    variant, size, budget = sweep.parse(point)
    config = sweep.get_config(point)
    counts = params.count(spec_from_config(config.model))
    rows.append(dict(point=point, variant=variant, size=size, budget=budget,
                     non_embedding_params=counts["non_embedding_params"],
                     paper_params=counts["paper_params"], tokens=tokens(config),
                     val_loss=float(summary["val_loss"])))
  return rows


def _most_common(rows, key):
  return collections.Counter(r[key] for r in rows).most_common(1)[0][0] if rows else None


def fits(rows: list[dict]) -> dict:
  """{'N': {variant: law}, 'D': {...}}; N-fits use the budget most sizes share, D-fits the size
  most budgets share. N counts non-embedding parameters (tiny models are embedding-dominated)."""
  out: dict[str, dict] = {"N": {}, "D": {}}
  budget = _most_common(rows, "budget")
  size = _most_common([r for r in rows if r["budget"] != budget], "size")
  for variant in sorted({r["variant"] for r in rows}):
    n_rows = [r for r in rows if r["variant"] == variant and r["budget"] == budget]
    d_rows = [r for r in rows if r["variant"] == variant and r["size"] == size]
    for key, sel, x in (("N", n_rows, "non_embedding_params"), ("D", d_rows, "tokens")):
      if len({r[x] for r in sel}) >= 3:
        out[key][variant] = fit.fit_power_law([r[x] for r in sel], [r["val_loss"] for r in sel])
  out["n_budget"], out["d_size"] = budget, size
  return out


def headlines(rows: list[dict], laws: dict) -> list[str]:
  lines = []
  for key, x, unit in (("N", "non_embedding_params", "params"), ("D", "tokens", "tokens")):
    base = laws[key].get("transformer")
    if base is None:
      continue
    sel = [r for r in rows if (r["budget"] == laws["n_budget"] if key == "N"
                               else r["size"] == laws["d_size"])]
    for variant in sorted(laws[key]):
      if variant == "transformer":
        continue
      mine = [r for r in sel if r["variant"] == variant]
      if mine:
        top = max(mine, key=lambda r: r[x])
        ratio = fit.matching_ratio(base, top[x], top["val_loss"])
        lines.append(fit.headline(variant, top[x], ratio, unit, reference=base))
  return lines


def plot(rows: list[dict], laws: dict, key: str, path: str) -> None:
  x_name = "non_embedding_params" if key == "N" else "tokens"
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for variant, law in sorted(laws[key].items()):
    sel = sorted((r for r in rows if r["variant"] == variant and
                  (r["budget"] == laws["n_budget"] if key == "N" else r["size"] == laws["d_size"])),
                 key=lambda r: r[x_name])
    xs = np.array([r[x_name] for r in sel], float)
    (line,) = ax.plot(xs, [r["val_loss"] for r in sel], "o", label=variant)
    grid = np.geomspace(xs.min() / 1.3, xs.max() * 1.3, 50)
    ax.plot(grid, law(grid), "-", color=line.get_color(), alpha=0.7)
  ax.set_xscale("log")
  ax.set_xlabel("non-embedding parameters" if key == "N" else "training tokens")
  ax.set_ylabel("validation loss")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(sweep: Sweep, root: str) -> dict:
  rows = collect(sweep, root)
  if not rows:
    raise SweepError(f"sweep {sweep.name}: no finished points under {root}")
  return report_rows(sweep.name, rows, root)


def report_rows(name: str, rows: list[dict], root: str) -> dict:
  """Fits, headlines, results.json, plots and report.md from collected rows (also from a saved
  results.json's "points")."""
  laws = fits(rows)
  lines = headlines(rows, laws)
  result = dict(sweep=name, points=rows, headlines=lines,
                fits={k: {v: law.__dict__ for v, law in laws[k].items()} for k in ("N", "D")})
  with open(os.path.join(root, "results.json"), "w") as f:
    json.dump(result, f, indent=1)
  for key in ("N", "D"):
    if laws[key]:
      plot(rows, laws, key, os.path.join(root, f"loss_vs_{key}.png"))
  with open(os.path.join(root, "report.md"), "w") as f:
    f.write(markdown(rows, laws, lines))
  return result


def markdown(rows, laws, lines) -> str:
  variants = sorted({r["variant"] for r in rows})
  cols = sorted({(r["size"], r["budget"]) for r in rows},
                key=lambda sb: min(r["tokens"] * r["non_embedding_params"] for r in rows
                                   if (r["size"], r["budget"]) == sb))
  out = ["| variant | " + " | ".join(f"{s} @ {b}" for s, b in cols) + " |",
         "|---|" + "---|" * len(cols)]
  for v in variants:
    vals = {(r["size"], r["budget"]): r["val_loss"] for r in rows if r["variant"] == v}
    cells = (f"{vals[c]:.4f}" if c in vals else "-" for c in cols)
    out.append(f"| {v} | " + " | ".join(cells) + " |")
  out += ["", "| fit | variant | E | A | alpha | points | R^2 |", "|---|---|---|---|---|---|---|"]
  for key in ("N", "D"):
    for v, law in sorted(laws[key].items()):
      out.append(f"| L({key}) | {v} | {law.E:.3f} ± {law.E_err:.3f} | {law.A:.3g} | "
                 f"{law.alpha:.3f} ± {law.alpha_err:.3f} | {law.n_points} | {law.r2:.2f} |")
  out += ["", f"A fit is read off only with >= {fit.MIN_POINTS} points, R^2 >= {fit.MIN_R2}, "
          f"alpha known to {fit.MAX_ALPHA_REL_ERR:.0%} and at most {fit.MAX_EXTRAPOLATION:g}x "
          "outside the measured range; otherwise the headline says why not."]
  out += [""] + [f"- {line}" for line in lines]
  return "\n".join(out) + "\n"
