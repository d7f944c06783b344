"""study.json of a study's collected runs: per-variant summaries, floors, censoring, the design,
the paired comparisons (primary and pre-named secondary families Holm-corrected, the rest
descriptive) and the code versions (report.md and plots: study/markdown.py; where the runs
came from: study/invocations.py)."""
from __future__ import annotations

import json
import math
from typing import Any
from pathlib import Path

from diff_transformer.data import synthetic
from diff_transformer.evaluation import floors
from diff_transformer.paths import write_atomic
from diff_transformer.study import factorial
from diff_transformer.study.definition import BASELINE, Study
from diff_transformer.study.overrides import BySize
from diff_transformer.stats import (censored_median, holm, min_p, paired, paired_censored,
                                          summarize)

TASK_SCALARS = ("final_loss", "val_accuracy", "steps_to_90", "first_query_accuracy",
                "answer_share", "distractor_share", "noise_share", "abs_answer_share",
                "abs_distractor_share", "abs_noise_share", "negative_mass", "logit_top1")
BREAKDOWNS = ("loss_at_pos_", "loss_on_")  # evaluation/loss.py summary()'s breakdown keys
TEXT_SCALARS = ("loss", "ar_hit_loss", "others_loss", "final_loss", "val_loss_at_25pct",
                "val_loss_at_50pct", "val_loss_at_100pct", "tail_fall")


def metric_values(run: dict) -> dict[str, float]:
  """A run's flat metrics (scalars plus accuracy:<slice>), named <metric>@<size> in a study with
  sizes."""
  scalars = TASK_SCALARS if "accuracy" in run else TEXT_SCALARS
  out = {k: run[k] for k in scalars if run.get(k) is not None}
  out.update({k: v for k, v in run.items()  # the loss by position and by training frequency
              if k.startswith(BREAKDOWNS) and v is not None})
  if "negative_by_span" in run:  # anti-attention on the noise span alone (not every span's sum)
    out["noise_negative_mass"] = run["negative_by_span"]["noise"]
  out.update({f"accuracy:{k}": v for k, v in run.get("accuracy", {}).items()})
  return {f"{k}@{run['size']}" if run["size"] else k: v for k, v in out.items()}


def _by_seed(runs: list[dict], variant: str, contrasts: tuple[tuple[str, str], ...] = ()
             ) -> dict[int, dict[str, float]]:
  """{seed: {metric[@size]: value}} of a variant's runs, plus `<metric>@<hi>-<lo>` = value at
  size hi - value at size lo for each contrast whose both sizes the seed ran."""
  out: dict[int, dict[str, float]] = {}
  for r in runs:
    if r["variant"] == variant:
      out.setdefault(r["seed"], {}).update(metric_values(r))
  for values in out.values():
    for hi, lo in contrasts:
      for name, v in list(values.items()):
        metric, _, size = name.rpartition("@")
        if size == hi and f"{metric}@{lo}" in values:
          values[f"{metric}@{hi}-{lo}"] = v - values[f"{metric}@{lo}"]
  return out


def censoring(runs: list[dict], variant: str) -> dict:
  """reached_90 = "k/n" and the censored median of steps to 0.9 (task runs), and how many runs
  were still improving over their last 20% of steps (every run)."""
  out: dict[str, Any] = {}
  rising = [r["still_rising"] for r in runs if r["variant"] == variant and "still_rising" in r]
  if rising:
    out["still_rising"] = f"{sum(rising)}/{len(rising)}"
  mine = [r for r in runs if r["variant"] == variant and "reached_90" in r]
  if mine:
    median = censored_median([r["steps_to_90"] for r in mine], [r["reached_90"] for r in mine])
    censored = sum(not r["reached_90"] for r in mine)
    # A mean over censored times counts them at their last step: a lower bound on the true mean.
    out.update(reached_90=f"{sum(r['reached_90'] for r in mine)}/{len(mine)}",
               steps_to_90_median=median if math.isfinite(median) else None,
               steps_to_90_censored=censored, steps_to_90_bound=">=" if censored else None)
  return out


CENSORED = {"steps_to_90": "reached_90"}  # a time censored at the budget -> its event flag


def _censored_by_seed(runs: list[dict], variant: str, metric: str) -> dict[int, tuple]:
  """{seed: (time, reached)} of a censored metric (named <metric>@<size> in a sized study)."""
  name, _, size = metric.partition("@")
  return {r["seed"]: (r[name], bool(r[CENSORED[name]])) for r in runs
          if r["variant"] == variant and r["size"] == size and r.get(name) is not None}


def family(study: Study, metric: str) -> str:
  """'primary', 'secondary' (pre-named) or 'descriptive' (no p is reported)."""
  if metric == study.primary:
    return "primary"
  return "secondary" if metric in study.secondary else "descriptive"


def compare(study: Study, runs: list[dict]) -> dict:
  """paired[pair][metric] over the seeds both sides ran, a - b for each pair of the primary
  family (study.pairs(); keyed by study.pair_name): {mean_diff, ci95_low, ci95_high, p, n} (a
  censored time: {mean_diff, bound, n, n_determined, earlier, later, p}); p_holm within the
  primary family (one entry per pair) and within the pre-named secondary family; descriptive
  metrics carry no p."""
  ran = {r["variant"] for r in runs}
  out: dict[str, dict] = {}
  for a, b in study.pairs():
    if a not in ran or b not in ran:
      continue
    mine, base = (_by_seed(runs, a, study.size_contrasts),
                  _by_seed(runs, b, study.size_contrasts))
    names = sorted({k for x in list(mine.values()) + list(base.values()) for k in x})
    table = out[study.pair_name(a, b)] = {}
    for m in names:
      if m.split("@")[0] in CENSORED:
        entry = paired_censored(_censored_by_seed(runs, a, m), _censored_by_seed(runs, b, m))
      else:
        entry = paired({s: x.get(m, math.nan) for s, x in mine.items()},
                       {s: x.get(m, math.nan) for s, x in base.items()})
      entry["family"] = family(study, m)
      if entry["family"] == "descriptive":
        entry["p"] = math.nan
      table[m] = entry
  for name in ("primary", "secondary"):
    ps = {(v, m): e["p"] for v, table in out.items() for m, e in table.items()
          if e["family"] == name}
    for (v, m), p in holm(ps).items():
      out[v][m]["p_holm"] = p
  return out


def cells_info(study: Study, runs: list[dict], grid: dict) -> dict:
  """Per compared name beyond the variants: what it is built from, its overrides, where its lr
  comes from, and the parameters its runs have."""
  out, published = {}, dict(study.published_cells)
  for v in study.variants:
    cell = study.derived_cell(v)
    params = sorted({r["params"] for r in runs if r["variant"] == v and "params" in r})
    out[v] = dict(parent=cell.parent if cell else None,
                  overrides={k: dict(x.values) if isinstance(x, BySize) else x
                             for k, x in cell.overrides} if cell else {},
                  lr_from=study.lr_source(v),
                  lr=(grid.get("chosen") or {}).get(study.lr_source(v)), params=params,
                  published=published.get(v))
  return out


def build(study: Study, runs: list[dict], grid: dict, missing: list[str],
          origin: dict) -> dict:
  """study.json's content; `origin` (provenance()) names what trained the runs."""
  variants = [v for v in study.variants if any(r["variant"] == v for r in runs)]
  summary = {}
  for v in variants:
    rows = [metric_values(r) for r in runs if r["variant"] == v]
    metrics = sorted({k for row in rows for k in row})
    summary[v] = {m: summarize([row.get(m, math.nan) for row in rows]) for m in metrics}
    summary[v].update(censoring(runs, v))
    if study.size_contrasts:  # per seed, across its runs' sizes
      ends = tuple(f"@{hi}-{lo}" for hi, lo in study.size_contrasts)
      seeds = list(_by_seed(runs, v, study.size_contrasts).values())
      summary[v].update({m: summarize([row.get(m, math.nan) for row in seeds])
                         for m in sorted({k for row in seeds for k in row if k.endswith(ends)})})
  config = study.get_config(study.points()[0])
  info = dict(name=study.name, description=study.description, scope=study.scope,
              variants=list(study.variants),
              seeds=list(study.seeds), sizes=list(study.sizes), primary=study.primary,
              secondary=list(study.secondary), exploratory=study.exploratory,
              design=study.design(), stop_at_level=study.stop_at_level and study.level,
              min_p=min_p(len(study.seeds)), task=config.data.name,
              seq_len=config.data.seq_len, steps=config.train.steps,
              batch=config.train.global_batch_size, overrides=dict(study.overrides),
              eval_rows=study.eval_rows, **origin)
  if study.comparisons:  # only then: the studies without pairs keep their study.json as it was
    info.update(comparisons=[list(p) for p in study.comparisons],
                published=[list(p) for p in study.published],
                published_source=study.published_source, cells=cells_info(study, runs, grid))
    if study.published_noise:
      info["published_noise"] = study.published_noise
  info["code_versions"] = code_versions(runs)
  if study.is_task:
    info.update(task_params=synthetic.task_spec(config.data).settings(),
                d_model=config.model.d_model, layers=config.model.num_layers,
                short_conv=config.model.short_conv)
  chance = {k: v for r in runs for k, v in r.get("chance", {}).items()}
  out = dict(study=info, runs=runs, summary=summary, paired=compare(study, runs),
             chance=chance, lr_grid=grid, missing=missing)
  if study.factorial:  # only then: the other studies keep their study.json as it was
    out["factorial"] = factorial.effects(study, runs)
  return out


def code_versions(runs: list[dict]) -> dict[str, int]:
  """{code version label: how many runs it trained (part of)}; 'not recorded' for runs from
  before runs recorded it."""
  counts: dict[str, int] = {}
  for r in runs:
    for label in r.get("code_versions") or ["not recorded"]:
      counts[label] = counts.get(label, 0) + 1
  return counts


def informative_slices(result: dict) -> list[str]:
  """Slices where the Transformer is clearly above the best shortcut (+0.1) and below ceiling
  (0.95): only there can a difference in retrieval show."""
  base = result["summary"].get(BASELINE, {})
  out = []
  for key, s in base.items():
    if key.startswith("accuracy:") and isinstance(s, dict) and s["n"]:
      floor = floors.highest(result["chance"][key.split(":", 1)[1]])
      if floor + 0.1 < s["mean"] < 0.95:
        out.append(key.split(":", 1)[1])
  return out


def strict(x):
  """NaN (a metric that does not exist) and inf (a median never reached) as JSON null."""
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, dict):
    return {k: strict(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [strict(v) for v in x]
  return x


def write_json(result: dict, root: Path) -> Path:
  root.mkdir(parents=True, exist_ok=True)
  return write_atomic(root / "study.json", json.dumps(strict(result), indent=1) + "\n")
