"""The two kinds of study point, one protocol: a grid point (one lr of a cell on a grid seed,
study/grid.py) and a compared point (a cell's seed at its chosen setting). Each says where its
runs live, how its record is read, judged and written, and the flags its run gets, so the
runner (study/runner.py) treats both alike. Records themselves: study/records.py."""
from __future__ import annotations

from pathlib import Path
from diff_transformer import params
from diff_transformer.evaluation import Settings, evaluate
from diff_transformer.model.attention import spec_from_config
from diff_transformer.runs.folder import RunFolder
from diff_transformer.study import pins, records, run_metrics
from diff_transformer.study.definition import Study

# The suites a study evaluates each finished run with (a subset of what eval.py can run).
STUDY_TASK_SUITES = ("task", "attention", "outliers")
STUDY_TEXT_SUITES = ("loss",)
GRID_DIR = "lr_grid"


def suites(study: Study) -> tuple[str, ...]:
  return STUDY_TASK_SUITES if study.is_task else STUDY_TEXT_SUITES


def _evaluated(workdir: Path, step: int | None, names: tuple[str, ...]) -> bool:
  folder = RunFolder(workdir)
  return step is not None and all((folder.read_eval(s) or {}).get("step") == step for s in names)


class PointKind:
  """What the runner needs of a kind of point; the grid/compared distinction lives here."""
  grid: bool  # its records under records/lr_grid/ (study/records.py)
  folder: str  # its workdirs under the study root ("": the root itself)

  def population_key(self, study: Study, point: str) -> tuple:
    """Points with one key may train in one program: a compared cell's seeds, a grid cell's lrs
    on one grid seed."""
    p = study.parse(point)
    return p.variant, p.size, p.seed if self.grid else None

  def not_reused(self, results: Path, point: str, setting: dict) -> str:
    return records.not_reused(results, point, setting, self.grid)

  def reuse_pool(self, study: Study) -> list[dict]:
    return records.pool(study.reuse_from, self.grid)

  def write_reused(self, study: Study, results: Path, point: str, found: dict,
                   setting: dict) -> None:
    """Another study's record of this setting, under this study's point name (a compared
    record names its cell)."""
    record = {k: v for k, v in found.items() if k not in ("point", "setting")}
    if not self.grid:
      record.update(variant=study.parse(point).variant, size=study.parse(point).size)
    records.write(results, point, record, setting, self.grid)

  def read(self, study: Study, results: Path, point: str, setting: dict) -> dict | None:
    raise NotImplementedError

  def accepts(self, study: Study, record: dict) -> bool:
    raise NotImplementedError

  def args(self, study: Study, point: str, lr: float | None) -> tuple[str, ...]:
    raise NotImplementedError

  def record(self, study: Study, point: str, workdir: Path, results: Path, config,
             setting: dict) -> None:
    raise NotImplementedError

  def record_failure(self, study: Study, point: str, workdir: Path, results: Path, config,
                     setting: dict, why: str) -> None:
    raise NotImplementedError


class GridPoint(PointKind):
  """One lr of a grid cell on one grid seed: workdirs under <root>/lr_grid/, records under
  records/lr_grid/; a run that diverged after its first step is a result of the grid too."""
  grid = True
  folder = GRID_DIR

  def read(self, study: Study, results: Path, point: str, setting: dict) -> dict | None:
    """The record, if it holds what the grid judges by (a diverged run always does): a record
    made before grid_by_primary lacks the whole-split loss, and its run is evaluated (or
    retrained where its workdir is gone)."""
    record = records.read(results, point, setting, grid=True)
    return record if record is None or self.accepts(study, record) else None

  def accepts(self, study: Study, record: dict) -> bool:
    return bool(record.get("failed")) or study.grid_metric in record

  def args(self, study: Study, point: str, lr: float | None) -> tuple[str, ...]:
    return pins.grid_args(study, point)

  def record(self, study: Study, point: str, workdir: Path, results: Path, config,
             setting: dict) -> None:
    _grid_record(study, point, workdir, results, config, setting)

  def record_failure(self, study: Study, point: str, workdir: Path, results: Path, config,
                     setting: dict, why: str) -> None:
    """A diverged grid run is a result of the grid (one that failed before its first step is
    not: a broken install or a missing file; it stays unrecorded and a rerun tries it again)."""
    if trained_a_step(workdir):
      _grid_record(study, point, workdir, results, config, setting, failed=why)


class ComparedPoint(PointKind):
  """One seed of a compared cell at its chosen setting: workdirs under the root, records under
  records/; a failed run is left unrecorded (the report counts n per cell)."""
  grid = False
  folder = ""

  def read(self, study: Study, results: Path, point: str, setting: dict) -> dict | None:
    return records.read(results, point, setting)

  def accepts(self, study: Study, record: dict) -> bool:
    return not record.get("failed")

  def args(self, study: Study, point: str, lr: float | None) -> tuple[str, ...]:
    return (pins.lr_args(study, point, lr) if lr is not None else ()) + pins.tuned_args(study,
                                                                                     point)

  def record(self, study: Study, point: str, workdir: Path, results: Path, config,
             setting: dict) -> None:
    """Evaluates the finished run at its last step (if not yet) and writes its record."""
    _evaluate(study, workdir)
    records.write(results, point, _record(study, point, workdir, config), setting)

  def record_failure(self, study: Study, point: str, workdir: Path, results: Path, config,
                     setting: dict, why: str) -> None:
    """Nothing: a failed compared run stays unrecorded, and a rerun trains it again."""


GRID: PointKind = GridPoint()
COMPARED: PointKind = ComparedPoint()


def trained_a_step(workdir: Path) -> bool:
  """Whether the run logged a training step (its failure, if any, is then one of training)."""
  return any(r.get("kind") == "train" for r in RunFolder(workdir).metric_rows())


def _grid_record(study: Study, point: str, workdir: Path, results: Path, config,
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
