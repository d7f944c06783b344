"""Run a study: the learning-rate grid (if any, study/grid.py), every compared point at its
variant's chosen lr (skipping points with a record for their setting, resuming interrupted runs),
the evaluation of each finished run, and one record per run (study/records.py), written as soon
as the run finishes. Children run `jobs` at once, each on its own core."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from diff_transformer import launch, params
from diff_transformer.data import synthetic
from diff_transformer.errors import ConfigError
from diff_transformer.evaluation import Settings, evaluate, floors
from diff_transformer.model.attention import spec_from_config
from diff_transformer.paths import write_atomic
from diff_transformer.runs.folder import RunFolder
from diff_transformer.study import pins, records, run_metrics, tuning
from diff_transformer.study.definition import Study
from diff_transformer.runs.record import setting

# The suites a study evaluates each finished run with (a subset of what eval.py can run).
STUDY_TASK_SUITES = ("task", "attention", "outliers")
STUDY_TEXT_SUITES = ("loss",)
GRID_DIR = "lr_grid"


def suites(study: Study) -> tuple[str, ...]:
  return STUDY_TASK_SUITES if study.is_task else STUDY_TEXT_SUITES


def _evaluated(workdir: Path, step: int, names: tuple[str, ...]) -> bool:
  folder = RunFolder(workdir)
  return all((folder.read_eval(s) or {}).get("step") == step for s in names)


def trained_floor(study: Study) -> float:
  """The best shortcut's accuracy on the trained task (256 eval-split rows); nan for text."""
  if not study.is_task:
    return math.nan
  spec = synthetic.task_spec(study.get_config(study.points()[0]).data)
  return floors.highest(floors.row_floors(spec, synthetic.generate(spec, "val", 1234, 0, 256)))


# Members per program under --population=auto, by jax platform. CPU: 1, measured:
# benchmarks/results/population.json finds 0.80-1.08x the member-steps/s of standalone runs and
# no more runs per hour at the LM and retrieval settings (the CPU step is already compute-bound),
# so one process per run costs nothing and keeps runs independent. An accelerator: 8, not yet
# measured there; the studies' sub-million-parameter models leave a GPU nearly idle, so members
# share its kernels and one compile.
AUTO_POPULATION = {"cpu": 1}
AUTO_POPULATION_ACCELERATOR = 8


def population_size(text: str) -> int:
  """--population: a positive number of members per program, or `auto` (AUTO_POPULATION)."""
  if text == "auto":
    import jax
    return AUTO_POPULATION.get(jax.default_backend(), AUTO_POPULATION_ACCELERATOR)
  if not text.isdigit() or int(text) < 1:
    raise ConfigError(f"--population: '{text}' is not a positive number of members or auto")
  return int(text)


def populations(study: Study, points: list[str], size: int, grid: bool = False
                ) -> list[list[str]]:
  """`points` in programs of up to `size` members: a compared cell's seeds, or one grid cell's
  lrs on one grid seed (members differ only in seed and lr; population_loop.py)."""
  if size <= 1:
    return []
  cells: dict[tuple, list[str]] = {}
  for point in points:
    p = study.parse(point)
    key = (p.variant, p.size, p.seed if grid else None)
    cells.setdefault(key, []).append(point)
  return [members[i:i + size] for members in cells.values()
          for i in range(0, len(members), size)]


def run(study: Study, study_file: str, root: str | Path, results: str | Path | None = None,
        jobs: int = 1, train: bool = True, retrain: bool = False, population: int = 1
        ) -> tuple[dict[str, str], dict]:
  """Trains (train.py per point, `jobs` at once; with `population` > 1 a cell's points in
  programs of up to that many members) and evaluates every point; returns the status per point
  and the lr grid. A failed run is recorded with its log and the others go on. With
  train=False nothing runs: the grid and the points are what their records hold. A workdir
  trained under another setting is refused, or with `retrain` set aside and trained anew."""
  root = Path(root)
  results = Path(results or root)
  status: dict[str, str] = {}
  grid: dict = {}
  if study.lr_grid:
    def run_grid(points: list[str]) -> dict[str, dict]:
      for p, why in _run_points(study, study_file, root / GRID_DIR, results, points, jobs,
                                train, retrain, population, grid=True).items():
        if p not in status or why != "recorded":  # a grown grid's second round keeps "ran"
          status[p] = why
      found = {p: _grid_read(study, results, p, point_setting(study, p)) for p in points}
      return {p: r for p, r in found.items() if r is not None}
    study, grid = tuning.tune(study, run_grid, trained_floor(study))
    write_atomic(results / "lr_grid.json", json.dumps(grid, indent=1) + "\n")
  lrs = point_lrs(study, grid)
  # every grid lr failed, or a tuned cell's setting is not chosen yet: nothing to train at
  skipped = [p for p in study.points() if grid and lrs[p] is None]
  status.update({p: ("not run: its tuned setting is not chosen yet (a candidate's grid is "
                     "incomplete)" if study.is_tuned(study.parse(p).variant) else
                     "not run: every lr of its grid failed") for p in skipped})
  status.update(_run_points(study, study_file, root, results,
                            [p for p in study.points() if p not in skipped], jobs, train,
                            retrain, population, lrs=lrs))
  return status, grid


def _run_points(study: Study, study_file: str, root: Path, results: Path, points: list[str],
                jobs: int, train: bool, retrain: bool, population: int,
                lrs: dict[str, float | None] | None = None, grid: bool = False
                ) -> dict[str, str]:
  """Points without a record for their setting are trained (workdirs under another setting
  refused first) and recorded; a finished run without a record is recorded without training."""
  lrs = lrs or {}
  settings = {p: point_setting(study, p, lrs.get(p)) for p in points}
  read = functools.partial(_grid_read, study) if grid else records.read
  status = {p: "recorded" for p in points if read(results, p, settings[p])}
  todo = [p for p in points if p not in status]
  for p in todo:  # named once, in every mode: nothing is dropped silently
    why = records.not_reused(results, p, settings[p], grid)
    if why:
      print(f"{p}: {why}; not reused" + ("" if train else ", left out of the report"),
            flush=True)
  if not train:
    return dict(status, **{p: "not run (report only)" for p in todo})
  configs = {p: study.resolved_config(p, lrs.get(p)) for p in todo}
  record = _grid_point_record if grid else _point_record
  def on_done(point: str, workdir: str) -> None:
    record(study, point, Path(workdir), results, configs[point], settings[point])
  point_args = {p: (pins.grid_args(study, p) if grid else
                    (pins.lr_args(study, p, lrs[p]) if lrs.get(p) is not None else ())
                    + pins.tuned_args(study, p))
                for p in todo}
  ran = launch.run(study, study_file, str(root), points=todo,
                   extra_args=pins.override_args(study), point_args=point_args,
                   keep_going=True, jobs=jobs, on_done=on_done, settings=settings, retrain=retrain,
                   groups=populations(study, todo, population, grid))
  for p, why in ran.items():  # a point finished before this call was recorded by launch.run
    if why.startswith("failed") and grid and trained_a_step(root / p):
      # a diverged grid run is a result of the grid (one that failed before its first step is
      # not: a broken install or a missing file; it stays unrecorded and a rerun tries it again)
      _grid_point_record(study, p, root / p, results, configs[p], settings[p], failed=why)
  status.update(ran)
  return status


def _grid_read(study: Study, results: Path, point: str, setting: dict) -> dict | None:
  """A grid point's record, if it holds what the grid judges by (a diverged run always does): a
  record made before grid_by_primary lacks the whole-split loss, and its run is evaluated (or
  retrained where its workdir is gone)."""
  record = records.read(results, point, setting, grid=True)
  if record is None or record.get("failed") or study.grid_metric in record:
    return record
  return None


def trained_a_step(workdir: Path) -> bool:
  """Whether the run logged a training step (its failure, if any, is then one of training)."""
  return any(r.get("kind") == "train" for r in RunFolder(workdir).metric_rows())


def _grid_point_record(study: Study, point: str, workdir: Path, results: Path, config,
                       setting: dict, failed: str = "") -> None:
  """A grid run's record; a failed run's holds the last line of its log instead of results."""
  out = dict(lr=study.parse(point).lr, seed=study.parse(point).seed, budget=config.train.steps)
  folder = RunFolder(workdir)
  if failed:
    log = folder.log
    lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
    records.write(results, point, dict(out, failed=(lines or [failed])[-1][-300:]), setting,
                  grid=True)
    return
  summary, rows = folder.read_summary() or {}, folder.metric_rows()
  out |= _program(summary)
  if study.grid_metric != "final_loss":  # evaluated as a compared run is, and its metrics kept
    _evaluate(study, workdir)
    out |= {k: v for k, v in _record(study, point, workdir, config).items()
            if k not in out and k not in ("curve", "variant", "size")}
  points = run_metrics.curve(rows, "val_accuracy" if study.level else "val_loss")
  unigram = summary.get("unigram_entropy")
  out.update(steps=summary.get("step"), final_loss=summary.get("val_loss"),
             val_accuracy=summary.get("val_accuracy"), unigram_entropy=unigram,
             train_seconds=run_metrics.train_seconds(rows),
             tail_fall=None if study.level else run_metrics.tail_fall(points, unigram),
             code_versions=run_metrics.code_versions(workdir), curve=points)
  if study.level:
    out["steps_to_level"], out["reached"] = run_metrics.first_step(points, study.level)
  records.write(results, point, out, setting, grid=True)


def _point_record(study: Study, point: str, workdir: Path, results: Path, config,
                  setting: dict) -> None:
  """Evaluates a finished compared run at its last step (if not yet) and writes its record."""
  _evaluate(study, workdir)
  records.write(results, point, _record(study, point, workdir, config), setting)


def _evaluate(study: Study, workdir: Path) -> None:
  """The study's suites on a finished run at its last step (once)."""
  names = suites(study)
  step = (RunFolder(workdir).read_summary() or {}).get("step")
  if not _evaluated(workdir, step, names):
    settings = Settings(task_rows=study.eval_rows, task_attention_rows=study.attention_rows,
                        ar_hit_context=study.ar_hit_context,
                        seed=1234)  # the same eval rows for every run
    evaluate(workdir, list(names), step=step, settings=settings)


def _record(study: Study, point: str, workdir: Path, config) -> dict:
  """A finished, evaluated run's record: identity, size, lr, final loss, the task or text
  metrics, the learning curve, its wall time."""
  p = study.parse(point)
  folder = RunFolder(workdir)
  summary, rows = folder.read_summary() or {}, folder.metric_rows()
  ev = {s: folder.read_eval(s) for s in suites(study)}
  record = dict(variant=p.variant, size=p.size, seed=p.seed,
                params=params.count(spec_from_config(config.model))["params"],
                lr=float(config.train.lr), steps=summary.get("step"),
                budget=config.train.steps, stopped_at_level=bool(summary.get("stopped_at_level")),
                final_loss=summary.get("val_loss"), val_accuracy=summary.get("val_accuracy"),
                train_seconds=run_metrics.train_seconds(rows),
                code_versions=run_metrics.code_versions(workdir))
  record |= _program(summary)
  if study.is_task:
    record.update(run_metrics.task_record(ev, run_metrics.curve(rows), study.level or 0.9))
  else:
    tokens = config.train.global_batch_size * config.data.seq_len
    record.update(run_metrics.text_record(ev, rows, tokens, summary.get("unigram_entropy")))
  return record


def _program(summary: dict) -> dict:
  """The one field by which a population member's record differs from a standalone run's."""
  return {"population": summary["population"]["members"]} if "population" in summary else {}


@functools.lru_cache(maxsize=None)
def point_setting(study: Study, point: str, lr: float | None = None) -> dict:
  """The setting a point trains with (at `lr`, its grid's choice), computed once per point:
  what its record, the workdir guard and the report all compare against."""
  return setting(study.resolved_config(point, lr))


def point_lrs(study: Study, grid: dict) -> dict[str, float | None]:
  """The lr each compared point trains at: its grid cell's choice (None: the preset's, or every
  grid lr failed when there is a grid)."""
  return {p: grid["chosen"].get(study.grid_cell(p)) if grid and not
          study.is_tuned(study.parse(p).variant) else None for p in study.points()}


def collect(study: Study, results: str | Path, grid: dict) -> list[dict]:
  """The records of the study's points, for the setting each would train with now (its grid's
  lr); points without one are left out (the report counts n per cell)."""
  out, lrs = [], point_lrs(study, grid)
  for point in study.points():
    record = records.read(Path(results), point, point_setting(study, point, lrs[point]))
    if record is not None:
      out.append({k: v for k, v in record.items() if k != "setting"})
  return out
