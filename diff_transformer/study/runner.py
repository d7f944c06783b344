"""Run a study: the learning-rate grid (if any, study/grid.py), every compared point at its
variant's chosen lr (skipping points with a record for their setting, resuming interrupted runs),
the evaluation of each finished run, and one record per run (study/records.py), written as soon
as the run finishes. Children run `jobs` at once, each on its own core."""
from __future__ import annotations

import functools
import json
import math
import statistics
from pathlib import Path

from diff_transformer import launch
from diff_transformer.data import synthetic
from diff_transformer.errors import ConfigError
from diff_transformer.evaluation import floors
from diff_transformer.paths import write_atomic
from diff_transformer.study import markdown, pins, records, study_json, tuning
from diff_transformer.study.formatting import plural
from diff_transformer.study.definition import Study
from diff_transformer.study.points import COMPARED, GRID, PointKind
from diff_transformer.runs.record import setting


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
# What a point that did not train waits for (left_to_train counts these).
REPORT_ONLY = "not run (report only)"
WAITING = "not run: its lr or tuned setting is not chosen yet (a grid is incomplete)"
REUSABLE = "not run (report only): a record in reuse_from holds its setting"


# What a run's time depends on within one study: a left run is timed at the recorded runs of
# the same values (a 4-layer run takes about twice a 2-layer one).
RUN_SHAPE = ("model.d_model", "model.num_layers", "data.seq_len", "train.steps")


def left_to_train(study: Study, status: dict[str, str], recorded: list[dict], jobs: int) -> str:
  """What a report-only invocation found left to train: the grid's next round (a grid that grows
  adds more) and every compared run without a record, each timed at the median `train_seconds`
  of the `recorded` runs of its shape (RUN_SHAPE)."""
  left = [p for p, why in status.items() if why in (REPORT_ONLY, WAITING)]
  grid = sum(study.parse(p).lr is not None for p in left)
  reusable = sum(why == REUSABLE for why in status.values())
  what = (f"Left to train: {plural(grid, 'grid run')} in the grid's next round (more where a "
          f"grid grows) and {plural(len(left) - grid, 'compared run')}"
          + (f" ({reusable} more to be reused from reuse_from)" if reusable else ""))
  times: dict[tuple, list[float]] = {}
  for r in recorded:
    if isinstance(r.get("train_seconds"), (int, float)) and math.isfinite(r["train_seconds"]):
      times.setdefault(_shape(r["setting"]), []).append(r["train_seconds"])
  median = {shape: statistics.median(seconds) for shape, seconds in times.items()}
  shapes = [_shape(point_setting(study, p)) for p in left]
  untimed = sum(s not in median for s in shapes)
  if len(left) == untimed:
    return what + "."
  hours = sum(median[s] for s in shapes if s in median) / 3600
  medians = ", ".join(f"{median[s] / 60:.1f} min a run ({shapes.count(s)} at {_shown(s)})"
                      for s in dict.fromkeys(shapes) if s in median)
  return (f"{what}; at the recorded median per shape, {medians}: about {hours:.1f} h of run "
          f"time ({hours / jobs:.1f} h at --jobs={jobs})"
          + (f", and {plural(untimed, 'run')} of a shape no record has timed." if untimed else "."))


def _shape(setting: dict) -> tuple:
  return tuple(setting.get(key) for key in RUN_SHAPE)


def _shown(shape: tuple) -> str:
  return " ".join(f"{key.split('.')[-1]}={value}" for key, value in zip(RUN_SHAPE, shape))


def population_size(text: str) -> int:
  """--population: a positive number of members per program, or `auto` (AUTO_POPULATION)."""
  if text == "auto":
    import jax
    return AUTO_POPULATION.get(jax.default_backend(), AUTO_POPULATION_ACCELERATOR)
  if not text.isdigit() or int(text) < 1:
    raise ConfigError(f"--population: '{text}' is not a positive number of members or auto")
  return int(text)


def populations(study: Study, points: list[str], size: int, kind: PointKind = COMPARED
                ) -> list[list[str]]:
  """`points` in programs of up to `size` members: a compared cell's seeds, or one grid cell's
  lrs on one grid seed (members differ only in seed and lr; population_loop.py)."""
  if size <= 1:
    return []
  cells: dict[tuple, list[str]] = {}
  for point in points:
    cells.setdefault(kind.population_key(study, point), []).append(point)
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
      for p, why in _run_points(study, GRID, study_file, root, results, points, jobs, train,
                                retrain, population).items():
        if p not in status or why != "recorded":  # a grown grid's second round keeps "ran"
          status[p] = why
      found = {p: GRID.read(study, results, p, point_setting(study, p)) for p in points}
      return {p: r for p, r in found.items() if r is not None}
    study, grid = tuning.tune(study, run_grid, trained_floor(study))
    write_atomic(results / "lr_grid.json", json.dumps(grid, indent=1) + "\n")
  lrs = point_lrs(study, grid)
  # every grid lr failed, or its lr or tuned setting is not chosen yet: nothing to train at
  skipped = [p for p in study.points() if grid and lrs[p] is None]
  status.update({p: (WAITING if study.is_tuned(study.parse(p).variant) or not grid["decisions"]
                     .get(study.grid_cell(p), {}).get("complete", True)
                     else "not run: every lr of its grid failed") for p in skipped})
  status.update(_run_points(study, COMPARED, study_file, root, results,
                            [p for p in study.points() if p not in skipped], jobs, train,
                            retrain, population, lrs=lrs))
  return status, grid


def _run_points(study: Study, kind: PointKind, study_file: str, root: Path, results: Path,
                points: list[str], jobs: int, train: bool, retrain: bool, population: int,
                lrs: dict[str, float | None] | None = None) -> dict[str, str]:
  """Points of one kind without a record for their setting are trained (workdirs under another
  setting refused first) and recorded; a finished run without a record is recorded without
  training; a record under another setting is named, in every mode."""
  lrs = lrs or {}
  root = root / kind.folder
  settings = {p: point_setting(study, p, lrs.get(p)) for p in points}
  status = {p: "recorded" for p in points if kind.read(study, results, p, settings[p])}
  if study.reuse_from:
    status.update(_reuse(study, kind, results, [p for p in points if p not in status], settings,
                         write=train))
  todo = [p for p in points if p not in status]
  for p in todo:  # named once, in every mode: nothing is dropped silently
    why = kind.not_reused(results, p, settings[p])
    if why:
      print(f"{p}: {why}; not reused" + ("" if train else ", left out of the report"),
            flush=True)
  if not train:
    return dict(status, **{p: REPORT_ONLY for p in todo})
  configs = {p: study.resolved_config(p, lrs.get(p)) for p in todo}
  def on_done(point: str, workdir: str) -> None:
    kind.record(study, point, Path(workdir), results, configs[point], settings[point])
  ran = launch.run(study, study_file, str(root), points=todo,
                   point_args={p: pins.override_args(study, p) + kind.args(study, p, lrs.get(p))
                               for p in todo},
                   keep_going=True, jobs=jobs, on_done=on_done, settings=settings, retrain=retrain,
                   groups=populations(study, todo, population, kind))
  for p, why in ran.items():  # a point finished before this call was recorded by launch.run
    if why.startswith("failed"):
      kind.record_failure(study, p, root / p, results, configs[p], settings[p], why)
  status.update(ran)
  return status


@functools.lru_cache(maxsize=None)
def point_setting(study: Study, point: str, lr: float | None = None) -> dict:
  """The setting a point trains with (at `lr`, its grid's choice), computed once per point:
  what its record, the workdir guard and the report all compare against."""
  return setting(study.resolved_config(point, lr))


def _reuse(study: Study, kind: PointKind, results: Path, points: list[str],
           settings: dict[str, dict], write: bool) -> dict[str, str]:
  """Points whose exact setting a record of another study holds (study.reuse_from): the record
  is copied under this study's point name (`reused_from` says whose it was), nothing trains.
  Without `write` (a report-only invocation) they are only named REUSABLE."""
  pool = kind.reuse_pool(study) if points else []
  out = {}
  for p in points:
    found = records.same_setting(pool, settings[p], lambda r: kind.accepts(study, r))
    if found is None:
      continue
    if not write:
      out[p] = REUSABLE
      continue
    kind.write_reused(study, results, p, found, settings[p])
    out[p] = f"reused ({found['reused_from']})"
  return out


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


def write_results(study: Study, results: str | Path, grid: dict, origin: dict
                  ) -> tuple[Study, list[dict], Path]:
  """study.json and report.md from the records in `results`, the tuned cells as the grid chose
  them and every point without a record named as missing: (the study so resolved, its runs, the
  report's path). study.py and the committed studies' rebuild test both write through here."""
  study = tuning.resolve(study, grid)
  runs = collect(study, results, grid)
  missing = [p for p in study.points() if p not in {r["point"] for r in runs}]
  result = study_json.build(study, runs, grid, missing, origin)
  study_json.write_json(result, Path(results))
  return study, runs, markdown.write(result, Path(results))
