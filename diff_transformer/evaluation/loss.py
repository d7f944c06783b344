"""Validation loss / perplexity, and the fine-grained split of DIFF Table 6.

AR-hit (associative-recall hit, the Zoology definition the DIFF paper uses): target y_t is an
AR-hit when the bigram it completes, (x_t, y_t), already occurred earlier in the same document
segment of the row; a copy of the seen continuation predicts it. "Others" are the remaining
targets. Losses are means over target tokens with weight 1 (padding and cross-document targets
excluded), in nats; perplexity = exp(loss).
"""
from __future__ import annotations

import math

import numpy as np
from tqdm import tqdm

from diff_transformer.evaluation import common


def ar_hits(inputs_BT: np.ndarray, targets_BT: np.ndarray, segment_ids_BT: np.ndarray
            ) -> np.ndarray:
  """bool [B, T]: the bigram (inputs[t], targets[t]) occurred before t within the segment."""
  hits = np.zeros(inputs_BT.shape, bool)
  for b in range(inputs_BT.shape[0]):
    seen: set[tuple[int, int]] = set()
    segment = None
    for t, (x, y, s) in enumerate(zip(inputs_BT[b].tolist(), targets_BT[b].tolist(),
                                      segment_ids_BT[b].tolist())):
      if s != segment:
        seen, segment = set(), s
      hits[b, t] = (x, y) in seen
      seen.add((x, y))
  return hits


def evaluate(fns: common.Fns, batches, progress: bool = False) -> dict:
  """Loss, perplexity and the AR-hit / others split over an iterable of validation batches."""
  sums = dict(all=0.0, ar_hit=0.0, others=0.0)
  counts = dict(all=0.0, ar_hit=0.0, others=0.0)
  for batch in tqdm(batches, desc="loss", disable=not progress, leave=False):
    nll = fns.nll(batch["inputs"], batch["targets"], batch["positions"], batch["segment_ids"])
    w = np.asarray(batch["weights"], np.float64)
    hit = ar_hits(batch["inputs"], batch["targets"], batch["segment_ids"])
    for key, mask in (("all", w), ("ar_hit", w * hit), ("others", w * ~hit)):
      sums[key] += float((nll * mask).sum())
      counts[key] += float(mask.sum())
  if counts["all"] == 0:
    raise common.EvalError("loss: the validation batches hold no target tokens")
  out = {}
  for key in sums:
    loss = sums[key] / counts[key] if counts[key] else float("nan")
    out[key] = dict(loss=loss, perplexity=math.exp(loss) if counts[key] else float("nan"),
                    tokens=int(counts[key]))
  out["ar_hit"]["fraction"] = counts["ar_hit"] / counts["all"]
  return out


def run(fns: common.Fns, batches, settings, out_dir) -> dict:
  del out_dir
  result = evaluate(fns, batches, progress=True)
  return dict(loss=result["all"]["loss"], perplexity=result["all"]["perplexity"],
              tokens=result["all"]["tokens"], ar_hit=result["ar_hit"], others=result["others"],
              definition="AR-hit: target completes a bigram seen earlier in its document segment")
