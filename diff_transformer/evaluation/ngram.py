"""A context-free n-gram model: the baseline beside the AR-hit split (evaluation/loss.py).

It is fitted on the training split's token stream and sees only the `context` tokens before a
target, never the rest of the row, so it shows what frequent n-grams alone predict. A model's
AR-hit loss clearly below this baseline's on the same tokens is evidence of copying in context.

Witten-Bell interpolation (Chen & Goodman 1998, section 2.5), from order 0 up to `context`:

    P_k(w | h) = (c(h, w) + T(h) P_{k-1}(w | h')) / (c(h) + T(h))    when c(h) > 0, else P_{k-1}

h the last k tokens, h' its last k - 1, c(h) the count of h followed by any token, T(h) the
number of distinct tokens seen after h, and P_{-1} = 1 / vocab (every id, seen or not, keeps
mass). Counts are exact: an n-gram is one int64 key in base `vocab` (nltk.lm's models are pure
Python, hours on millions of tokens; numpy's sort and search do this in seconds).
"""
from __future__ import annotations

import numpy as np


class NGram:
  """Counts of every (k + 1)-gram, k = 0..context, of a 1-D token stream."""

  def __init__(self, tokens: np.ndarray, vocab: int, context: int):
    if vocab ** (context + 1) >= 2 ** 62:
      raise ValueError(f"an n-gram of {context + 1} ids of a {vocab}-id vocabulary does not fit "
                       "one int64 key; use a shorter context")
    self.vocab, self.context = vocab, context
    tokens = np.asarray(tokens, np.int64)
    # tables[k]: sorted (k+1)-gram keys with counts; contexts[k]: sorted k-gram context keys,
    # their counts c(h) and distinct followers T(h)
    self.tables, self.contexts = [], []
    for k in range(context + 1):
      keys, counts = np.unique(self.keys(np.lib.stride_tricks.sliding_window_view(tokens, k + 1)),
                               return_counts=True)
      heads, start = np.unique(keys // vocab, return_index=True)
      self.tables.append((keys, counts))
      followers = np.diff(start, append=len(keys))
      self.contexts.append((heads, np.add.reduceat(counts, start), followers))

  def keys(self, grams_NK: np.ndarray) -> np.ndarray:
    out = np.zeros(grams_NK.shape[0], np.int64)
    for j in range(grams_NK.shape[1]):
      out = out * self.vocab + grams_NK[:, j]
    return out

  @staticmethod
  def _lookup(table: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """values at query keys (0 where absent)."""
    if not len(table):
      return np.zeros(len(query), values.dtype)
    i = np.clip(np.searchsorted(table, query), 0, len(table) - 1)
    return np.where(table[i] == query, values[i], 0)

  def prob(self, history_NK: np.ndarray, available_N: np.ndarray, targets_N: np.ndarray
           ) -> np.ndarray:
    """P(target | the last min(available, context) tokens of its history row); history_NK holds
    the `context` tokens before each target (left-aligned padding ignored past `available`)."""
    history_NK = np.asarray(history_NK, np.int64).reshape(len(targets_N), self.context)
    targets_N = np.asarray(targets_N, np.int64)
    p = np.full(len(targets_N), 1.0 / self.vocab)
    for k in range(self.context + 1):
      h = history_NK[:, self.context - k:]
      context_key = self.keys(h)
      heads, c_h, t_h = self.contexts[k]
      c = self._lookup(heads, c_h, context_key).astype(np.float64)
      t = self._lookup(heads, t_h, context_key).astype(np.float64)
      keys, counts = self.tables[k]
      c_hw = self._lookup(keys, counts, context_key * self.vocab + targets_N)
      use = (c > 0) & (np.asarray(available_N) >= k)
      p = np.where(use, (c_hw + t * p) / np.where(use, c + t, 1.0), p)
    return p
