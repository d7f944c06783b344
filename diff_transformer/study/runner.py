"""Train every point of a study (skipping finished ones, resuming interrupted ones), evaluate each
on its task, and collect one record per run."""
from __future__ import annotations

import json
import math
from pathlib import Path

from tqdm import tqdm

from diff_transformer import params
from diff_transformer.evaluation import Settings, evaluate
from diff_transformer.model.spec import ModelSpec
from diff_transformer.study.definition import Study
from diff_transformer.sweeps import runner as sweep_runner

SUITES = ("task", "attention", "outliers")


def _evaluated(workdir: Path, step: int) -> bool:
  out = workdir / "eval"
  return all((out / f"{s}.json").is_file() and
             json.loads((out / f"{s}.json").read_text()).get("step") == step for s in SUITES)


def run(study: Study, study_file: str, root: str | Path) -> dict[str, str]:
  """Trains (train.py per point, as sweeps do) and evaluates every point; returns its status."""
  root = Path(root)
  status = sweep_runner.run(study, study_file, str(root), extra_args=study.override_args())
  for point in tqdm(study.points(), desc=f"evaluate {study.name}", unit="run"):
    workdir = root / point
    step = study.get_config(point).train.steps
    if _evaluated(workdir, step):
      continue
    settings = Settings(task_rows=study.eval_rows, task_attention_rows=study.attention_rows,
                        seed=1234)  # the same eval rows for every run
    evaluate(workdir, list(SUITES), step=step, settings=settings)
    status[point] += "+evaluated"
  return status


def _metrics(workdir: Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  return [json.loads(l) for l in path.read_text().splitlines()] if path.is_file() else []


def curve(rows: list[dict]) -> list[tuple[int, float]]:
  """(step, val_accuracy) from a run's metrics log, in order (the last record of a step)."""
  points = {int(r["step"]): float(r["val_accuracy"]) for r in rows if "val_accuracy" in r}
  return sorted(points.items())


def _first_step(points: list[tuple[int, float]], level: float) -> float:
  """The first evaluated step whose held-out accuracy reaches `level` (nan: never): when
  recall formed, at the resolution of train.eval_every."""
  return next((float(step) for step, acc in points if acc >= level), math.nan)


def _train_seconds(rows: list[dict]) -> float:
  times = [r["time"] for r in rows]
  return float(max(times) - min(times)) if times else math.nan


def collect(study: Study, root: str | Path) -> list[dict]:
  """One record per point: identity, size, final loss, accuracy per slice, attention shares,
  the largest attention logit, the learning curve."""
  root = Path(root)
  records = []
  for point in study.points():
    variant, seed = study.parse(point)
    workdir = root / point
    summary = sweep_runner.read_summary(str(workdir)) or {}
    ev = {s: json.loads((workdir / "eval" / f"{s}.json").read_text()) for s in SUITES}
    spec = ModelSpec.from_config(study.get_config(point).model)
    shares = ev["attention"]["averaged"]
    rows = _metrics(workdir)
    points = curve(rows)
    records.append(dict(
        variant=variant, seed=seed, point=point, params=params.count(spec)["params"],
        steps=summary.get("step"), final_loss=summary.get("val_loss"),
        val_accuracy=summary.get("val_accuracy"),
        accuracy={k: v["accuracy"] for k, v in ev["task"]["slices"].items()},
        chance={k: v["chance"] for k, v in ev["task"]["slices"].items()},
        first_query_accuracy=ev["task"]["by_query"][0],
        answer_share=shares["answer"], distractor_share=shares["distractors"],
        noise_share=shares["noise"],
        logit_top1=ev["outliers"]["overall"]["attention_logits"]["top1"],
        steps_to_90=_first_step(points, 0.9), train_seconds=_train_seconds(rows), curve=points))
  return records
