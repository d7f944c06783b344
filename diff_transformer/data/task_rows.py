"""The rows of the built-in synthetic tasks (data/synthetic.py describes the layouts): one
generator per task, each drawing `rows` i.i.d. examples from a numpy Generator."""
from __future__ import annotations

from typing import Any

import numpy as np

TaskSpec = Any  # data/synthetic.TaskSpec (that module imports this one)

PAD, BLANK, NEEDLE, QUERY = 0, 1, 2, 3  # the special ids (data/synthetic.py)


def distinct(rng: np.random.Generator, rows: int, pool: tuple[int, int], k: int) -> np.ndarray:
  """[rows, k] distinct ids per row from the pool (first k of a random permutation)."""
  start, size = pool
  return start + np.argsort(rng.random((rows, size)), axis=1)[:, :k]


def top_k_slots(rng, rows: int, slots: int, k: int, log_weight: np.ndarray) -> np.ndarray:
  """k distinct slots per row drawn without replacement with probabilities ~ exp(log_weight)
  (Gumbel top-k), sorted ascending."""
  keys = log_weight[None, :] - np.log(-np.log(rng.random((rows, slots))))
  return np.sort(np.argsort(-keys, axis=1)[:, :k], axis=1)


def mqar_rows(s: TaskSpec, rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
  pools, L, n, R = s.pools(), s.item_len, s.stored, s.num_queries
  b = np.arange(rows)[:, None]
  if s.compositional:
    g = s.num_keys
    # pair p = (p//g, p%g)
    key1 = distinct(rng, rows, pools["key1"], g)[:, np.repeat(np.arange(g), g)]
    key2 = distinct(rng, rows, pools["key2"], g)[:, np.tile(np.arange(g), g)]
    keys = [key1, key2]
  else:
    keys = [distinct(rng, rows, pools["key"], n)]
  values = distinct(rng, rows, pools["value"], n)
  item = np.stack(keys + [values], axis=-1)  # [rows, pair, L]
  order = np.argsort(rng.random((rows, n)), axis=1)  # stored position -> pair
  seq = np.full((rows, s.seq_len + 1), BLANK, np.int32)
  if s.filler == "random":  # key-pool ids (key1 and key2 pools are adjacent)
    first, size = pools["key"] if not s.compositional else (pools["key1"][0], 2 * pools["key1"][1])
    seq[:] = first + rng.integers(0, size, seq.shape)
  seq[:, :n * L] = item[b, order].reshape(rows, n * L)
  stored_at = np.argsort(order, axis=1) * L  # pair -> start of its stored item
  asked = np.argsort(rng.random((rows, n)), axis=1)[:, :R]  # pair asked by query r
  region = n * L
  slots = (s.seq_len + 1 - region) // L
  slot = top_k_slots(rng, rows, slots, R, (s.query_power - 1) * np.log(np.arange(1, slots + 1)))
  starts = region + slot * L  # [rows, R]
  for j in range(L):
    seq[b, starts + j] = item[b, asked, j]
  answer_pos = starts + L - 2  # the input position whose target is the value
  return dict(seq=seq, answer_pos=answer_pos, query_start=starts, source_start=stored_at[b, asked],
              asked=asked, stored_at=stored_at)


def needle_rows(s: TaskSpec, rng: np.random.Generator, rows: int) -> dict[str, np.ndarray]:
  pools, N, D, R = s.pools(), s.needles, s.distractors, s.asked
  b = np.arange(rows)[:, None]
  start, size = pools["filler"]
  seq = (start + rng.integers(0, size, (rows, s.seq_len + 1))).astype(np.int32)
  ka = distinct(rng, rows, pools["key1"], N)
  kb = distinct(rng, rows, pools["key2"], N)
  val = distinct(rng, rows, pools["value"], N + D)
  asked = np.argsort(rng.random((rows, N)), axis=1)[:, :R]  # needle asked by question r
  d = np.arange(D)  # distractor d copies one asked key and pairs it with another's
  ka_all = np.concatenate([ka, ka[b, asked[:, d % R]]], axis=1)
  kb_all = np.concatenate([kb, kb[b, asked[:, (d + 1 + d // R) % R]]], axis=1)
  item = np.stack([np.full_like(ka_all, NEEDLE), ka_all, kb_all, val], axis=-1)  # [rows, N+D, 4]
  # The haystack is everything before the questions; needles sit at non-overlapping starts
  # inside its [depth_min, depth_max] band, in random order.
  K = N + D
  lo, slots = needle_band(s)
  pos = lo + top_k_slots(rng, rows, slots, K, np.zeros(slots)) + 3 * np.arange(K)
  which = np.argsort(rng.random((rows, K)), axis=1)  # needle placed at pos[:, i]
  for j in range(4):
    seq[b, pos + j] = item[b, which, j]
  stored_at = np.zeros((rows, K), np.int64)
  stored_at[b, which] = pos
  starts = haystack_len(s) + 4 * np.arange(R)[None, :].repeat(rows, 0)
  question = np.stack([np.full_like(ka[b, asked], QUERY), ka[b, asked], kb[b, asked],
                       val[b, asked]], axis=-1)
  for j in range(4):
    seq[b, starts + j] = question[..., j]
  return dict(seq=seq, answer_pos=starts + 2, query_start=starts, source_start=stored_at[b, asked],
              asked=asked, stored_at=stored_at)


def haystack_len(s: TaskSpec) -> int:
  return s.seq_len + 1 - 4 * s.asked


def needle_band(s: TaskSpec) -> tuple[int, int]:
  """(first allowed needle start, number of free slots): K needles of 4 tokens fit at starts
  lo + x_i + 3i for sorted distinct x_i in [0, slots)."""
  hay = haystack_len(s)
  lo, hi = int(s.depth_min * (hay - 4)), int(s.depth_max * (hay - 4))
  return lo, hi - lo + 1 - 3 * (s.stored - 1)


GENERATORS = {"mqar": mqar_rows, "needle": needle_rows}
