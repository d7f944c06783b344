"""Run a study: the learning-rate grid (if any), every compared point at its variant's best grid
lr (skipping finished runs, resuming interrupted ones), the evaluation of each finished run, and
one record per run."""
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
from diff_transformer.sweeps.definition import SweepError
from diff_transformer.training.run_record import read_config

TASK_SUITES = ("task", "attention", "outliers")
TEXT_SUITES = ("loss",)
GRID_DIR = "lr_grid"


def suites(study: Study) -> tuple[str, ...]:
  return TASK_SUITES if study.is_task else TEXT_SUITES


def _evaluated(workdir: Path, step: int, names: tuple[str, ...]) -> bool:
  out = workdir / "eval"
  return all((out / f"{s}.json").is_file() and
             json.loads((out / f"{s}.json").read_text()).get("step") == step for s in names)


def _final_loss(workdir: Path) -> float:
  summary = sweep_runner.read_summary(str(workdir)) or {}
  loss = summary.get("val_loss")
  return float(loss) if loss is not None and math.isfinite(loss) else math.inf


def lr_grid(study: Study, root: Path) -> dict:
  """{"lrs", "steps", "seed", "val_loss": {cell: [final val loss per lr; inf: failed or
  diverged]}, "chosen": {cell: lr}} from the grid runs under root/lr_grid."""
  if not study.lr_grid:
    return {}
  table, chosen = {}, {}
  for point in study.grid_points():
    variant, size, _, lr = study.parse(point)
    cell = study.cell_name(variant, size)
    table.setdefault(cell, []).append(_final_loss(root / GRID_DIR / point))
  for cell, losses in table.items():
    best = min(range(len(losses)), key=lambda i: (losses[i], i))  # ties: the smaller lr
    chosen[cell] = study.lr_grid[best] if math.isfinite(losses[best]) else None
  steps = study.get_config(study.grid_points()[0]).train.steps
  return dict(lrs=list(study.lr_grid), steps=steps, seed=study.lr_grid_seed, val_loss=table,
              chosen=chosen)


def run(study: Study, study_file: str, root: str | Path) -> tuple[dict[str, str], dict]:
  """Trains (train.py per point, as sweeps do) and evaluates every point; returns the status
  per point and the lr grid. A failed run is recorded with its log and the others go on."""
  root = Path(root)
  status, grid = {}, {}
  if study.lr_grid:
    status = sweep_runner.run(study, study_file, str(root / GRID_DIR),
                              points=study.grid_points(), extra_args=study.override_args(),
                              point_args={p: study.grid_args(p) for p in study.grid_points()},
                              keep_going=True)
    grid = lr_grid(study, root)
    (root / "lr_grid.json").write_text(json.dumps(grid, indent=1) + "\n")
  point_args, skipped = {}, []
  for point in study.points():
    if grid:
      lr = grid["chosen"][study.grid_cell(point)]
      if lr is None:  # every grid lr failed: nothing to compare this cell at
        skipped.append(point)
        continue
      point_args[point] = study.lr_args(point, lr)
      check_lr(root / point, point, lr)
  status.update({p: "not run: every lr of its grid failed" for p in skipped})
  status.update(sweep_runner.run(study, study_file, str(root),
                                 points=[p for p in study.points() if p not in skipped],
                                 extra_args=study.override_args(), point_args=point_args,
                                 keep_going=True))
  names = suites(study)
  for point in tqdm(study.points(), desc=f"evaluate {study.name}", unit="run"):
    workdir = root / point
    step = study.get_config(point).train.steps
    if not sweep_runner.finished(study, point, str(workdir)) or _evaluated(workdir, step, names):
      continue
    settings = Settings(task_rows=study.eval_rows, task_attention_rows=study.attention_rows,
                        seed=1234)  # the same eval rows for every run
    evaluate(workdir, list(names), step=step, settings=settings)
    status[point] += "+evaluated"
  return status, grid


def check_lr(workdir: Path, point: str, lr: float) -> None:
  """A run already started at another lr (the grid changed since) would be skipped or resumed at
  the wrong lr: one line instead."""
  trained = read_config(workdir)
  if trained is not None and abs(float(trained.train.lr) - lr) > 1e-12 * lr:
    raise SweepError(f"study point {point}: {workdir} trained at lr {trained.train.lr:g} but the "
                     f"lr grid now picks {lr:g}; move that run away or use another --root")


def _metrics(workdir: Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  return [json.loads(l) for l in path.read_text().splitlines()] if path.is_file() else []


def curve(rows: list[dict], key: str = "val_accuracy") -> list[tuple[int, float]]:
  """(step, value) of a validation metric from a run's metrics log, in order (the last record
  of a step)."""
  points = {int(r["step"]): float(r[key]) for r in rows if key in r}
  return sorted(points.items())


def first_step(points: list[tuple[int, float]], level: float) -> tuple[float, bool]:
  """(the first evaluated step whose held-out accuracy reaches `level`, True), or (the last
  evaluated step, False) when it never did: a time censored at the budget, never dropped."""
  hit = next((float(step) for step, acc in points if acc >= level), None)
  if hit is not None:
    return hit, True
  return (float(points[-1][0]) if points else math.nan), False


def still_rising(points: list[tuple[int, float]], tail: float = 0.2, margin: float = 0.01
                 ) -> bool:
  """Whether a held-out metric (higher is better: accuracy, or minus the loss) rose by more than
  `margin` over the last `tail` of the steps: a run that has not plateaued may close a gap with
  more steps."""
  if len(points) < 2:
    return False
  last_step, last = points[-1]
  start = last_step * (1 - tail)
  before = [acc for step, acc in points if step <= start] or [points[0][1]]
  return last - before[-1] > margin


def _train_seconds(rows: list[dict]) -> float:
  times = [r["time"] for r in rows]
  return float(max(times) - min(times)) if times else math.nan


def _task_record(ev: dict, points: list[tuple[int, float]]) -> dict:
  signed, absolute = ev["attention"]["averaged"], ev["attention"]["averaged_abs"]
  steps_to_90, reached = first_step(points, 0.9)
  return dict(
      accuracy={k: v["accuracy"] for k, v in ev["task"]["slices"].items()},
      chance={k: v["chance"] for k, v in ev["task"]["slices"].items()},
      first_query_accuracy=ev["task"]["by_query"][0],
      answer_share=signed["answer"], distractor_share=signed["distractors"],
      noise_share=signed["noise"], abs_answer_share=absolute["answer"],
      abs_distractor_share=absolute["distractors"], abs_noise_share=absolute["noise"],
      negative_mass=sum(ev["attention"]["averaged_negative"].values()),
      shares_by_layer=dict(signed=ev["attention"]["by_layer"],
                           abs=ev["attention"]["by_layer_abs"],
                           negative=ev["attention"]["by_layer_negative"]),
      logit_top1=ev["outliers"]["overall"]["attention_logits"]["top1"],
      steps_to_90=steps_to_90, reached_90=reached, still_rising=still_rising(points),
      curve=points)


def _text_record(ev: dict, rows: list[dict], tokens_per_step: int) -> dict:
  loss, points = ev["loss"], curve(rows, "val_loss")
  return dict(loss=loss["loss"], ar_hit_loss=loss["ar_hit"]["loss"],
              others_loss=loss["others"]["loss"], ar_hit_fraction=loss["ar_hit"]["fraction"],
              still_rising=still_rising([(step, -v) for step, v in points]),  # loss still falling
              curve=[(step * tokens_per_step, v) for step, v in points])


def collect(study: Study, root: str | Path) -> list[dict]:
  """One record per finished, evaluated point: identity, size, lr, final loss, the task or text
  metrics, the learning curve. Unfinished points are left out (the report counts n per cell)."""
  root = Path(root)
  records, names = [], suites(study)
  for point in study.points():
    variant, size, _, seed = study.parse(point)
    workdir = root / point
    config = study.get_config(point)
    if not (sweep_runner.finished(study, point, str(workdir)) and
            _evaluated(workdir, config.train.steps, names)):
      continue
    summary = sweep_runner.read_summary(str(workdir)) or {}
    ev = {s: json.loads((workdir / "eval" / f"{s}.json").read_text()) for s in names}
    spec = ModelSpec.from_config(config.model)
    rows = _metrics(workdir)
    trained = read_config(workdir)
    record = dict(variant=variant, size=size, seed=seed, point=point,
                  params=params.count(spec)["params"], lr=float(trained.train.lr),
                  steps=summary.get("step"), final_loss=summary.get("val_loss"),
                  val_accuracy=summary.get("val_accuracy"), train_seconds=_train_seconds(rows))
    if study.is_task:
      record.update(_task_record(ev, curve(rows)))
    else:
      tokens = config.train.global_batch_size * config.data.seq_len
      record.update(_text_record(ev, rows, tokens))
    records.append(record)
  return records
