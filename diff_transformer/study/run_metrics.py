"""What a finished run's record holds beyond its identity: its learning curve from the metrics
log, the time to a level (censored at the budget), whether it was still improving, how far past
early descent it was, and the task or text metrics read from its evaluation results."""
from __future__ import annotations

import math
from pathlib import Path

from diff_transformer import provenance
from diff_transformer.evaluation import loss, outliers, tasks
from diff_transformer.runs.record import read_code_versions


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
  if ceiling is not None and (ceiling - last <= margin
                              or last - before <= 0.1 * (ceiling - before)):
    return False  # no gap left to close, or less than a tenth of the headroom closed
  return last - before > margin


def code_versions(workdir: Path) -> list[str]:
  """The code that trained the run, one label per version (a resume under other code adds one)."""
  return [provenance.label(v) for v in read_code_versions(workdir)]


def train_seconds(rows: list[dict]) -> float:
  """Wall time the run's attempts took, each from its start (the `flops` row every start logs)
  to its last row: the time between a stopped attempt and its resume is not counted."""
  attempts: list[list[float]] = []
  for r in rows:
    if r.get("kind") == "flops" or not attempts:
      attempts.append([])
    attempts[-1].append(r["time"])
  return float(sum(max(t) - min(t) for t in attempts)) if attempts else math.nan


def task_record(ev: dict, points: list[tuple[int, float]], level: float) -> dict:
  """A synthetic-task run's metrics from its task, attention and outlier results and its curve."""
  steps_to_90, reached = first_step(points, level)
  return dict(**tasks.task_summary(ev["task"]), **tasks.attention_summary(ev["attention"]),
              **outliers.summary(ev["outliers"]), steps_to_90=steps_to_90, reached_90=reached,
              still_rising=still_rising(points, ceiling=1.0, level=level), curve=points)


def text_record(ev: dict, rows: list[dict], tokens_per_step: int, unigram: float | None
                ) -> dict:
  """A text run's metrics from its loss result and its validation-loss curve (in tokens)."""
  points = curve(rows, "val_loss")
  out = dict(loss.summary(ev["loss"]), unigram_entropy=unigram,
             still_rising=still_rising([(step, -v) for step, v in points]),  # loss still falling
             tail_fall=tail_fall(points, unigram),
             curve=[(step * tokens_per_step, v) for step, v in points])
  for share in BUDGET_SHARES:  # the held-out loss (training-time eval rows) at part of the budget
    out[f"val_loss_at_{round(share * 100)}pct"] = at_share(points, share)
  return out


BUDGET_SHARES = (0.25, 0.5, 1.0)


def at_share(points: list[tuple[int, float]], share: float) -> float | None:
  """The value at the last evaluated step within `share` of the run's last step."""
  if not points:
    return None
  limit = points[-1][0] * share
  return next((v for step, v in reversed(points) if step <= limit + 1e-9), None)


def tail_fall(points: list[tuple[int, float]], unigram: float | None, tail: float = 0.2
              ) -> float | None:
  """How much of its total fall below the unigram baseline a loss curve made over its last
  `tail` of the steps: under 0.05 is past early descent (the LM study's criterion)."""
  if len(points) < 2 or unigram is None or not math.isfinite(unigram):
    return None
  last_step, last = points[-1]
  before = at_share(points, 1 - tail)
  total = unigram - last
  return (before - last) / total if before is not None and total > 0 else None
