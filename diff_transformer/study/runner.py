"""Run a study: the learning-rate grid (if any, study/grid.py), every compared point at its
variant's chosen lr (skipping points with a record for their setting, resuming interrupted runs),
the evaluation of each finished run, and one record per run (study/records.py), written as soon
as the run finishes. Children run `jobs` at once, each on its own core."""
from __future__ import annotations

import json
import math
from pathlib import Path

from diff_transformer import params, provenance
from diff_transformer.data import synthetic
from diff_transformer.evaluation import Settings, evaluate, floors
from diff_transformer.model.spec import ModelSpec
from diff_transformer.study import grid as lr_grid
from diff_transformer.study import records
from diff_transformer.study.definition import Study
from diff_transformer.sweeps import runner as sweep_runner
from diff_transformer.training.run_record import check_setting, read_code_versions

TASK_SUITES = ("task", "attention", "outliers")
TEXT_SUITES = ("loss",)
GRID_DIR = "lr_grid"


def suites(study: Study) -> tuple[str, ...]:
  return TASK_SUITES if study.is_task else TEXT_SUITES


def _evaluated(workdir: Path, step: int, names: tuple[str, ...]) -> bool:
  out = workdir / "eval"
  return all((out / f"{s}.json").is_file() and
             json.loads((out / f"{s}.json").read_text()).get("step") == step for s in names)


def trained_floor(study: Study) -> float:
  """The best shortcut's accuracy on the trained task (256 eval-split rows); nan for text."""
  if not study.is_task:
    return math.nan
  spec = synthetic.task_spec(study.get_config(study.points()[0]).data)
  return floors.highest(floors.row_floors(spec, synthetic.generate(spec, "val", 1234, 0, 256)))


def run(study: Study, study_file: str, root: str | Path, results: str | Path | None = None,
        jobs: int = 1, train: bool = True, retrain: bool = False
        ) -> tuple[dict[str, str], dict]:
  """Trains (train.py per point, `jobs` at once) and evaluates every point; returns the status
  per point and the lr grid. A failed run is recorded with its log and the others go on. With
  train=False nothing runs: the grid and the points are what their records hold. A workdir
  trained under another setting is refused, or with `retrain` set aside and trained anew."""
  root = Path(root)
  results = Path(results or root)
  status, grid = {}, {}
  if study.lr_grid:
    def run_grid(points: list[str]) -> dict[str, dict]:
      for p, why in _run_points(study, study_file, root / GRID_DIR, results, points, jobs,
                                train, retrain, grid=True).items():
        if p not in status or why != "recorded":  # a grown grid's second round keeps "ran"
          status[p] = why
      found = {p: records.read(results, p, study.get_config(p), grid=True) for p in points}
      return {p: r for p, r in found.items() if r is not None}
    grid = lr_grid.tune(study, run_grid, trained_floor(study))
    (results / "lr_grid.json").write_text(json.dumps(grid, indent=1) + "\n")
  lrs = point_lrs(study, grid)
  # every grid lr failed: nothing to compare these cells at
  skipped = [p for p in study.points() if grid and lrs[p] is None]
  status.update({p: "not run: every lr of its grid failed" for p in skipped})
  status.update(_run_points(study, study_file, root, results,
                            [p for p in study.points() if p not in skipped], jobs, train,
                            retrain, lrs=lrs))
  return status, grid


def _run_points(study: Study, study_file: str, root: Path, results: Path, points: list[str],
                jobs: int, train: bool, retrain: bool,
                lrs: dict[str, float | None] | None = None, grid: bool = False
                ) -> dict[str, str]:
  """Points without a record for their setting are trained (workdirs under another setting
  refused first) and recorded; a finished run without a record is recorded without training."""
  lrs = lrs or {}
  configs = {p: study.resolved_config(p, lrs.get(p)) for p in points}
  status = {p: "recorded" for p in points if records.read(results, p, configs[p], grid=grid)}
  todo = [p for p in points if p not in status]
  if not train:
    return dict(status, **{p: "not run (report only)" for p in todo})
  for p in todo:
    check_setting(root / p, p, configs[p], retrain)
  record = _grid_point_record if grid else _point_record
  def on_done(point: str, workdir: str) -> None:
    record(study, point, Path(workdir), results, configs[point])
  point_args = {p: (study.grid_args(p) if grid else
                    study.lr_args(p, lrs[p]) if lrs.get(p) is not None else ()) for p in todo}
  ran = sweep_runner.run(study, study_file, str(root), points=todo,
                         extra_args=study.override_args(), point_args=point_args,
                         keep_going=True, jobs=jobs, on_done=on_done)
  for p, why in ran.items():
    if why == "skipped":  # finished before this invocation, not yet recorded
      on_done(p, str(root / p))
      sweep_runner.raise_if_stopped()
    elif why.startswith("failed") and grid:  # a diverged grid run is a result of the grid
      _grid_point_record(study, p, root / p, results, configs[p], failed=why)
  status.update(ran)
  return status


def _grid_point_record(study: Study, point: str, workdir: Path, results: Path, config,
                       failed: str = "") -> None:
  """A grid run's record; a failed run's holds the last line of its log instead of results."""
  out = dict(lr=study.parse(point).lr, seed=study.parse(point).seed, budget=config.train.steps)
  if failed:
    log = workdir / "sweep.log"
    lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    records.write(results, point, dict(out, failed=(lines or [failed])[-1][-300:]), config,
                  grid=True)
    return
  summary = sweep_runner.read_summary(str(workdir)) or {}
  rows = _metrics(workdir)
  points = curve(rows, "val_accuracy" if study.level else "val_loss")
  out.update(steps=summary.get("step"), final_loss=summary.get("val_loss"),
             val_accuracy=summary.get("val_accuracy"),
             unigram_entropy=summary.get("unigram_entropy"), train_seconds=_train_seconds(rows),
             code_versions=_code_versions(workdir), curve=points)
  if study.level:
    out["steps_to_level"], out["reached"] = first_step(points, study.level)
  records.write(results, point, out, config, grid=True)


def _point_record(study: Study, point: str, workdir: Path, results: Path, config) -> None:
  """Evaluates a finished compared run at its last step (if not yet) and writes its record."""
  names = suites(study)
  step = (sweep_runner.read_summary(str(workdir)) or {}).get("step")
  if not _evaluated(workdir, step, names):
    settings = Settings(task_rows=study.eval_rows, task_attention_rows=study.attention_rows,
                        seed=1234)  # the same eval rows for every run
    evaluate(workdir, list(names), step=step, settings=settings)
  records.write(results, point, _record(study, point, workdir, config), config)


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


def still_rising(points: list[tuple[int, float]], tail: float = 0.2, margin: float = 0.01,
                 ceiling: float | None = None, level: float | None = None) -> bool:
  """Whether a held-out metric (higher is better: accuracy, or minus the loss) rose by more than
  `margin` over the last `tail` of the steps: a run that has not plateaued may close a gap with
  more steps. With a `ceiling` (accuracy: 1) the rise must also close more than a tenth of the
  headroom left at the start of the tail, and a run within `margin` of the ceiling has no gap
  left to close; a run at or above `level` (the primary's) has reached what the study measures
  and is not flagged."""
  if len(points) < 2:
    return False
  last_step, last = points[-1]
  start = last_step * (1 - tail)
  before = ([acc for step, acc in points if step <= start] or [points[0][1]])[-1]
  if level is not None and last >= level:
    return False
  if ceiling is not None and (ceiling - last <= margin or last - before <= 0.1 * (ceiling - before)):
    return False  # no gap left to close, or less than a tenth of the headroom closed
  return last - before > margin


def _code_versions(workdir: Path) -> list[str]:
  """The code that trained the run, one label per version (a resume under other code adds one)."""
  return [provenance.label(v) for v in read_code_versions(workdir)]


def _train_seconds(rows: list[dict]) -> float:
  times = [r["time"] for r in rows]
  return float(max(times) - min(times)) if times else math.nan


def _task_record(ev: dict, points: list[tuple[int, float]], level: float) -> dict:
  signed, absolute = ev["attention"]["averaged"], ev["attention"]["averaged_abs"]
  steps_to_90, reached = first_step(points, level)
  return dict(
      accuracy={k: v["accuracy"] for k, v in ev["task"]["slices"].items()},
      chance={k: v["chance"] for k, v in ev["task"]["slices"].items()},
      first_query_accuracy=ev["task"]["by_query"][0],
      answer_share=signed["answer"], distractor_share=signed["distractors"],
      noise_share=signed["noise"], abs_answer_share=absolute["answer"],
      abs_distractor_share=absolute["distractors"], abs_noise_share=absolute["noise"],
      negative_mass=sum(ev["attention"]["averaged_negative"].values()),
      negative_by_span=ev["attention"]["averaged_negative"],
      shares_by_layer=dict(signed=ev["attention"]["by_layer"],
                           abs=ev["attention"]["by_layer_abs"],
                           negative=ev["attention"]["by_layer_negative"]),
      logit_top1=ev["outliers"]["overall"]["attention_logits"]["top1"],
      steps_to_90=steps_to_90, reached_90=reached,
      still_rising=still_rising(points, ceiling=1.0, level=level), curve=points)


def _text_record(ev: dict, rows: list[dict], tokens_per_step: int) -> dict:
  loss, points = ev["loss"], curve(rows, "val_loss")
  return dict(loss=loss["loss"], ar_hit_loss=loss["ar_hit"]["loss"],
              others_loss=loss["others"]["loss"], ar_hit_fraction=loss["ar_hit"]["fraction"],
              still_rising=still_rising([(step, -v) for step, v in points]),  # loss still falling
              curve=[(step * tokens_per_step, v) for step, v in points])


def _record(study: Study, point: str, workdir: Path, config) -> dict:
  """A finished, evaluated run's record: identity, size, lr, final loss, the task or text
  metrics, the learning curve, its wall time."""
  p = study.parse(point)
  summary = sweep_runner.read_summary(str(workdir)) or {}
  ev = {s: json.loads((workdir / "eval" / f"{s}.json").read_text()) for s in suites(study)}
  rows = _metrics(workdir)
  record = dict(variant=p.variant, size=p.size, seed=p.seed,
                params=params.count(ModelSpec.from_config(config.model))["params"],
                lr=float(config.train.lr), steps=summary.get("step"),
                budget=config.train.steps, stopped_at_level=bool(summary.get("stopped_at_level")),
                final_loss=summary.get("val_loss"), val_accuracy=summary.get("val_accuracy"),
                train_seconds=_train_seconds(rows), code_versions=_code_versions(workdir))
  if study.is_task:
    record.update(_task_record(ev, curve(rows), study.level or 0.9))
  else:
    tokens = config.train.global_batch_size * config.data.seq_len
    record.update(_text_record(ev, rows, tokens))
  return record


def point_lrs(study: Study, grid: dict) -> dict[str, float | None]:
  """The lr each compared point trains at: its grid cell's choice (None: the preset's, or every
  grid lr failed when there is a grid)."""
  return {p: grid["chosen"][study.grid_cell(p)] if grid else None for p in study.points()}


def collect(study: Study, results: str | Path, grid: dict) -> list[dict]:
  """The records of the study's points, for the setting each would train with now (its grid's
  lr); points without one are left out (the report counts n per cell)."""
  out, lrs = [], point_lrs(study, grid)
  for point in study.points():
    config = study.resolved_config(point, lrs[point])
    record = records.read(Path(results), point, config)
    if record is not None:
      out.append({k: v for k, v in record.items() if k != "setting"})
  return out
