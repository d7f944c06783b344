"""study.json, report.md and plots of a study's collected runs."""
from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import numpy as np

from diff_transformer.data import synthetic
from diff_transformer.evaluation import common
from diff_transformer.study.definition import BASELINE, Study
from diff_transformer.study.stats import paired, summarize

SCALARS = ("final_loss", "val_accuracy", "steps_to_90", "first_query_accuracy", "answer_share",
           "distractor_share", "noise_share", "logit_top1")


def metric_values(run: dict) -> dict[str, float]:
  """A run's flat metrics: the scalars plus accuracy:<slice> for every slice."""
  out = {k: run[k] for k in SCALARS if run.get(k) is not None}
  out.update({f"accuracy:{k}": v for k, v in run["accuracy"].items()})
  return out


def build(study: Study, runs: list[dict], wall_seconds: float, command: str) -> dict:
  variants = [v for v in study.variants if any(r["variant"] == v for r in runs)]
  per = {v: [metric_values(r) for r in runs if r["variant"] == v] for v in variants}
  metrics = sorted({k for rows in per.values() for row in rows for k in row})
  summary = {v: {m: summarize([row.get(m, math.nan) for row in rows]) for m in metrics}
             for v, rows in per.items()}
  by_seed = {v: {r["seed"]: metric_values(r) for r in runs if r["variant"] == v} for v in variants}
  compared = {}
  if BASELINE in by_seed:
    for v in variants:
      if v != BASELINE:
        compared[v] = {m: paired({s: x.get(m, math.nan) for s, x in by_seed[v].items()},
                                 {s: x.get(m, math.nan) for s, x in by_seed[BASELINE].items()})
                       for m in metrics}
  config = study.get_config(study.points()[0])
  info = dict(name=study.name, description=study.description, variants=list(study.variants),
              seeds=list(study.seeds), task=config.data.name,
              task_params=synthetic.task_spec(config.data).settings(),
              seq_len=config.data.seq_len, steps=config.train.steps,
              batch=config.train.global_batch_size, d_model=config.model.d_model,
              layers=config.model.num_layers, short_conv=config.model.short_conv,
              overrides=dict(study.overrides), eval_rows=study.eval_rows, command=command,
              wall_seconds=round(wall_seconds, 1),
              machine=f"{platform.machine()}, {_cpu_name()}, {_cores()} cores")
  return dict(study=info, runs=runs, summary=summary, paired=compared,
              chance={k: v for r in runs for k, v in r["chance"].items()})


def _strict(x):
  """NaN (a metric that does not exist, e.g. a step never reached) as JSON null."""
  if isinstance(x, float) and math.isnan(x):
    return None
  if isinstance(x, dict):
    return {k: _strict(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_strict(v) for v in x]
  return x


def _cpu_name() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _cores() -> int:
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _pm(s: dict, digits: int = 3) -> str:
  if not s or s["n"] == 0:
    return "-"
  if abs(s["mean"]) >= 100:
    digits = 0
  std = "" if math.isnan(s["std"]) else f" ± {s['std']:.{digits}f}"
  return f"{s['mean']:.{digits}f}{std}"


def _ci(p: dict) -> str:
  if p["n"] == 0:
    return "-"
  if max(abs(v) for v in (p["mean_diff_vs_transformer"], p["ci95_low"], p["ci95_high"])
         if not math.isnan(v)) >= 100:
    return f"{p['mean_diff_vs_transformer']:+.0f} [{p['ci95_low']:+.0f}, {p['ci95_high']:+.0f}]"
  if math.isnan(p["ci95_low"]):
    return f"{p['mean_diff_vs_transformer']:+.3f} (n={p['n']}, no interval)"
  return f"{p['mean_diff_vs_transformer']:+.3f} [{p['ci95_low']:+.3f}, {p['ci95_high']:+.3f}]"


def informative_slices(result: dict) -> list[str]:
  """Slices where the Transformer is clearly above chance (+0.1) and below ceiling (0.95)."""
  base = result["summary"].get(BASELINE, {})
  out = []
  for key, s in base.items():
    if key.startswith("accuracy:") and s["n"]:
      chance = result["chance"][key.split(":", 1)[1]]
      if chance + 0.1 < s["mean"] < 0.95:
        out.append(key.split(":", 1)[1])
  return out


def write(result: dict, root: Path) -> Path:
  root.mkdir(parents=True, exist_ok=True)
  (root / "study.json").write_text(json.dumps(_strict(result), indent=1) + "\n")
  info, summary, variants = result["study"], result["summary"], list(result["summary"])
  slices = list(result["runs"][0]["accuracy"])  # the task suite's order: trained first
  lines = [f"# Study {info['name']}", "", info["description"], "",
           f"Task `{info['task']}` {info['task_params']}, seq_len {info['seq_len']}; "
           f"D={info['d_model']}, {info['layers']} layers, short_conv {info['short_conv']}; "
           f"{info['steps']} steps of {info['batch']} rows; seeds {info['seeds']} (same data "
           f"order for every variant per seed); {info['eval_rows']} held-out rows per slice.",
           "", f"Command: `{info['command']}`", "",
           f"Wall time of this invocation: {info['wall_seconds'] / 60:.1f} min on {info['machine']}"
           " (runs finished earlier are skipped, so a resumed study shows less); the runs' own "
           f"training time (first to last logged step, summed): {_train_minutes(result):.1f} min.",
           "",
           "## Per variant (mean ± std over seeds)", ""]
  header = ["variant", "params", "final loss", "val accuracy", "steps to 0.9", "first-query acc.",
            "answer share", "distractor share", "noise share", "logit top-1"]
  lines += _table(header, [[v, _params(result, v)] + [_pm(summary[v].get(m)) for m in SCALARS]
                           for v in variants])
  lines += ["", "## Accuracy per slice (mean ± std over seeds)", ""]
  lines += _table(["slice", "chance"] + variants,
                  [[s, f"{result['chance'][s]:.3f}"] + [_pm(summary[v].get(f"accuracy:{s}"))
                                                       for v in variants] for s in slices])
  informative = informative_slices(result)
  lines += ["", ("Slices where the Transformer is clearly above chance and below ceiling (where a "
                 "difference can show): " + ", ".join(f"`{s}`" for s in informative))
            if informative else "No slice has the Transformer clearly between chance and "
            "ceiling: this study cannot separate the variants as configured.", ""]
  if result["paired"]:
    lines += ["## Paired difference vs the Transformer (same seed), mean [95% t interval]", ""]
    keys = ["final_loss", "val_accuracy", "steps_to_90"] + [f"accuracy:{s}" for s in slices] + [
        "answer_share", "noise_share", "logit_top1"]
    lines += _table(["metric"] + list(result["paired"]),
                    [[k] + [_ci(result["paired"][v][k]) if k in result["paired"][v] else "-"
                            for v in result["paired"]] for k in keys])
    lines += ["", "An interval that contains 0 means no difference was resolved at this number "
              "of seeds.", ""]
  lines += [f"![accuracy per slice]({plot_slices(result, slices, root / 'accuracy.png')})",
            f"![learning curves]({plot_curves(result, root / 'learning_curves.png')})", ""]
  (root / "report.md").write_text("\n".join(lines))
  return root / "report.md"


def _train_minutes(result: dict) -> float:
  return sum(r["train_seconds"] for r in result["runs"]
             if r["train_seconds"] is not None and not math.isnan(r["train_seconds"])) / 60


def _params(result: dict, variant: str) -> str:
  counts = sorted({r["params"] for r in result["runs"] if r["variant"] == variant})
  return ", ".join(f"{c:,}" for c in counts)


def _table(header: list[str], rows: list[list]) -> list[str]:
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
          ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def plot_slices(result: dict, slices: list[str], path: Path) -> str:
  fig, ax = common.figure(size=(7, 3.4))
  variants = list(result["summary"])
  width = 0.8 / max(len(variants), 1)
  for i, v in enumerate(variants):
    s = [result["summary"][v].get(f"accuracy:{k}") for k in slices]
    ax.bar(np.arange(len(slices)) + (i - (len(variants) - 1) / 2) * width,
           [x["mean"] for x in s], width, yerr=[0 if math.isnan(x["std"]) else x["std"] for x in s],
           capsize=2, label=v)
  ax.scatter(range(len(slices)), [result["chance"][k] for k in slices], marker="_", s=300,
             color="k", label="chance", zorder=3)
  ax.set_xticks(range(len(slices)), slices, rotation=25, ha="right", fontsize=7)
  ax.set_ylabel("answer accuracy")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7, ncols=3)
  return common.save_figure(fig, path)


def plot_curves(result: dict, path: Path) -> str:
  fig, ax = common.figure(size=(6, 3.4))
  for v in result["summary"]:
    curves = [dict(r["curve"]) for r in result["runs"] if r["variant"] == v and r["curve"]]
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    if not steps:
      continue
    acc = np.asarray([[c[s] for s in steps] for c in curves])
    mean, std = acc.mean(0), acc.std(0)
    ax.plot(steps, mean, label=f"{v} (n={len(curves)})")
    ax.fill_between(steps, mean - std, mean + std, alpha=0.2)
  ax.set_xlabel("step")
  ax.set_ylabel("held-out answer accuracy")
  ax.set_ylim(0, 1.02)
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)
