"""Validation loss / perplexity, and the fine-grained split of DIFF Table 6.

AR-hit (associative-recall hit, the Zoology definition the DIFF paper uses, with a context of c
tokens): target y_t is an AR-hit when the (c + 1)-gram it completes, (x_{t-c+1}, ..., x_t, y_t),
already occurred earlier in the same document segment of the row, so a copy of the continuation
seen there predicts it. c = 1 (the default) is the paper's bigram; the byte-level LM study uses
c = 4 (a byte bigram recurs everywhere). "Others" are the remaining targets. Beside each split,
`ngram_loss` is a context-free n-gram model's loss on the same tokens (evaluation/ngram.py, fitted
on the training split with the same c tokens of context), when one is given. Losses are means
over target tokens with weight 1 (padding and cross-document targets excluded), in nats;
perplexity = exp(loss).

Descriptive breakdowns beside them: the loss by position in the segment (bins of
`POSITION_BIN` targets), and, given the training split, by the target's frequency there
(`FREQUENCY_CLASSES`: the most frequent ids that make up the first 50% of the training tokens,
the next 40%, the rarest 10%).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from tqdm import tqdm

from diff_transformer.evaluation import common
from diff_transformer.evaluation.ngram import NGram


def histories(inputs_BT: np.ndarray, segment_ids_BT: np.ndarray, context: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """([B, T, context] the `context` inputs ending at each position, [B, T] how many of them lie
  in the position's own segment)."""
  b, t = inputs_BT.shape
  padded = np.concatenate([np.zeros((b, context), inputs_BT.dtype), inputs_BT], axis=1)
  history = np.stack([padded[:, j + 1:j + 1 + t] for j in range(context)], axis=-1)
  starts = np.concatenate([np.ones((b, 1), bool), segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]],
                          axis=1)
  index = np.broadcast_to(np.arange(t), (b, t))
  first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)  # the segment's first position
  return history, index - first + 1


def ar_hits(inputs_BT: np.ndarray, targets_BT: np.ndarray, segment_ids_BT: np.ndarray,
            context: int = 1) -> np.ndarray:
  """bool [B, T]: the (context + 1)-gram ending at target t occurred before t in its segment."""
  return _hits(*histories(inputs_BT, segment_ids_BT, context), targets_BT, context)


def _hits(history: np.ndarray, available: np.ndarray, targets_BT: np.ndarray, context: int
          ) -> np.ndarray:
  hits = np.zeros(targets_BT.shape, bool)
  for b in range(targets_BT.shape[0]):
    seen: set[tuple[int, ...]] = set()
    for t in range(targets_BT.shape[1]):
      if available[b, t] == 1:
        seen = set()  # a new segment
      if available[b, t] >= context:
        gram = (*history[b, t].tolist(), int(targets_BT[b, t]))
        hits[b, t] = gram in seen
        seen.add(gram)
  return hits


POSITION_BIN = 32
FREQUENCY_CLASSES = (("frequent", 0.5), ("middle", 0.9), ("rare", 1.0))  # cumulative mass


def frequency_classes(train_tokens: np.ndarray, vocab: int) -> np.ndarray:
  """int [vocab]: each id's class (index into FREQUENCY_CLASSES) by its training frequency: ids
  sorted from most to least frequent, an id's class set by the training mass before it."""
  counts = np.bincount(np.asarray(train_tokens).reshape(-1), minlength=vocab)[:vocab]
  order = np.argsort(-counts, kind="stable")
  before = (np.cumsum(counts[order]) - counts[order]) / max(int(counts.sum()), 1)
  classes = np.empty(vocab, np.int64)
  classes[order] = np.searchsorted([edge for _, edge in FREQUENCY_CLASSES[:-1]], before,
                                   side="right")
  return classes


def _breakdown(sums: np.ndarray, counts: np.ndarray) -> dict:
  return dict(loss=[float(s / c) if c else None for s, c in zip(sums, counts)],
              tokens=[int(c) for c in counts])


def evaluate(fns: common.Fns, batches, progress: bool = False, context: int = 1,
             ngram: NGram | None = None, classes: np.ndarray | None = None) -> dict:
  """Loss, perplexity and the AR-hit / others split over an iterable of validation batches
  (with `ngram`, its loss on each split's tokens too), and the loss by position in the segment
  and (with `classes`, frequency_classes()) by the target's training frequency."""
  if ngram is not None and ngram.context != context:
    raise ValueError(f"the n-gram model's context {ngram.context} is not the AR-hit's {context}")
  keys = ("all", "ar_hit", "others")
  sums, counts, base = (dict.fromkeys(keys, 0.0) for _ in range(3))
  by_position = np.zeros((2, 0))
  by_class = np.zeros((2, len(FREQUENCY_CLASSES)))
  for batch in tqdm(batches, desc="loss", disable=not progress, leave=False):
    nll = fns.nll(batch["inputs"], batch["targets"], batch["positions"], batch["segment_ids"])
    w = np.asarray(batch["weights"], np.float64)
    history, available = histories(batch["inputs"], batch["segment_ids"], context)
    hit = _hits(history, available, batch["targets"], context)
    bins = (available - 1) // POSITION_BIN  # the target's position in its segment, binned
    if bins.max() >= by_position.shape[1]:
      by_position = np.pad(by_position, ((0, 0), (0, bins.max() + 1 - by_position.shape[1])))
    for row, values in enumerate((nll * w, w)):
      by_position[row] += np.bincount(bins.reshape(-1), np.ravel(values),
                                      minlength=by_position.shape[1])
      if classes is not None:
        by_class[row] += np.bincount(classes[np.asarray(batch["targets"])].reshape(-1),
                                     np.ravel(values), minlength=len(FREQUENCY_CLASSES))
    if ngram is not None:  # fitted with the same context (run), so the histories are its own
      base_nll = -np.log(ngram.prob(history.reshape(-1, context), available.reshape(-1),
                                    batch["targets"].reshape(-1))).reshape(w.shape)
    for key, mask in (("all", w), ("ar_hit", w * hit), ("others", w * ~hit)):
      sums[key] += float((nll * mask).sum())
      counts[key] += float(mask.sum())
      if ngram is not None:
        base[key] += float((base_nll * mask).sum())
  if counts["all"] == 0:
    raise common.EvalError("loss: the validation batches hold no target tokens")
  out: dict[str, Any] = {}
  for key in keys:
    loss = sums[key] / counts[key] if counts[key] else float("nan")
    out[key] = dict(loss=loss, perplexity=math.exp(loss) if counts[key] else float("nan"),
                    tokens=int(counts[key]))
    if ngram is not None:
      out[key]["ngram_loss"] = base[key] / counts[key] if counts[key] else float("nan")
  out["ar_hit"]["fraction"] = counts["ar_hit"] / counts["all"]
  out["by_position"] = dict(bin=POSITION_BIN, **_breakdown(*by_position))
  if classes is not None:
    out["by_frequency"] = dict(classes=[f"{name} (to {edge:.0%} of training tokens)"
                                        for name, edge in FREQUENCY_CLASSES],
                               **_breakdown(*by_class))
  return out


def run(fns: common.Fns, batches, settings, out_dir, train_tokens: np.ndarray | None = None,
        vocab: int = 0) -> dict:
  """The loss suite; with the training split's token stream, the n-gram baseline beside it."""
  del out_dir
  c = settings.ar_hit_context
  if c < 1:
    raise common.EvalError(f"--ar_hit_context: must be >= 1 (tokens before a target), got {c}")
  try:
    ngram = NGram(train_tokens, vocab, c) if train_tokens is not None else None
  except ValueError as e:
    raise common.EvalError(f"--ar_hit_context: {e}") from None
  classes = frequency_classes(train_tokens, vocab) if train_tokens is not None else None
  result = evaluate(fns, batches, progress=True, context=c, ngram=ngram, classes=classes)
  return dict(loss=result["all"]["loss"], perplexity=result["all"]["perplexity"],
              tokens=result["all"]["tokens"], ar_hit=result["ar_hit"], others=result["others"],
              by_position=result["by_position"], by_frequency=result.get("by_frequency"),
              ngram_loss=result["all"].get("ngram_loss"), ar_hit_context=c,
              definition=f"AR-hit: target completes a {c + 1}-gram seen earlier in its document "
                         f"segment; ngram_loss: a context-free {c + 1}-gram model (Witten-Bell) "
                         "fitted on the training split, on the same tokens")


def summary(result: dict) -> dict:
  """The loss suite's numbers, flat: the loss, its AR-hit / others split and their share, and
  the n-gram baseline's losses on the same tokens (when it was fitted)."""
  out = dict(loss=result["loss"], ar_hit_loss=result["ar_hit"]["loss"],
             others_loss=result["others"]["loss"], ar_hit_fraction=result["ar_hit"]["fraction"],
             ar_hit_context=result.get("ar_hit_context", 1))
  position = result.get("by_position") or {}
  for i, value in enumerate(position.get("loss", [])):
    out[f"loss_at_pos_{i * position['bin']:03d}"] = value
  frequency = result.get("by_frequency") or {}
  for (name, _), value in zip(FREQUENCY_CLASSES, frequency.get("loss", [])):
    out[f"loss_on_{name}"] = value
  if result["ar_hit"].get("ngram_loss") is not None:
    out.update(ngram_loss=result["ngram_loss"], ngram_ar_hit_loss=result["ar_hit"]["ngram_loss"],
               ngram_others_loss=result["others"]["ngram_loss"])
  return out
