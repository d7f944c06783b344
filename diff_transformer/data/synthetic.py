"""Built-in synthetic retrieval tasks generated from a seed: no files, no downloads.

`mqar`   multi-query associative recall. Compositional (default): g first-key tokens x g
         second-key tokens give g*g stored triples `k1 k2 v` (shuffled), then R of those pairs
         are asked as `k1 k2 v` in the query region at power-law distributed slots; the loss
         counts the value, predicted at the k2 position. Each asked pair has 2(g-1) stored
         partial matches (same k1 or same k2, another value): the common-mode distractors
         differential attention claims to cancel. Plain MQAR (`compositional=False`) stores
         `k v` pairs of single-token keys: the sanity task plain attention solves. The query
         region between queries is filled with random key-pool ids (`filler="random"`), so
         no query is found by a token that only fills, or with the one BLANK id (`"blank"`).
`needle` multi-needle retrieval: N needles `NEEDLE ka kb v` at random depths in filler tokens,
         optional distractor needles on a key grid: distractor j (round k = j // R) takes ka
         of asked needle j mod R and kb of asked needle (j + 1 + k) mod R, with its own value,
         so each round gives every asked needle one partial match per key token and neither
         key alone answers; then R questions `QUERY ka kb v` at the end; the loss counts each v.

Ids: 0 pad, 1 blank, 2 NEEDLE, 3 QUERY, then pools of distinct ids (`TaskSpec.pools`); shortcut
floors: evaluation/floors.py; the layout as a tokenizer: data/task_tokenizer.py. Train and eval
rows are disjoint: a row is in the eval split iff a hash of its tokens falls in bucket 0 of
`heldout_buckets`. Every row is seq_len + 1 tokens (inputs = row[:-1], targets = row[1:]), so
packing does not apply and, the rows being i.i.d. draws, neither does shuffling.
"""
from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from diff_transformer.data.common import DataError
from diff_transformer.data.task_rows import BLANK, GENERATORS, NEEDLE, PAD, QUERY, needle_band

TASKS = ("mqar", "needle")


def no_text_tokenizer(task: str, workdir) -> str:
  """Why a text-only program (export, lm-eval) refuses a run trained on a synthetic task."""
  return (f"trained on the synthetic task '{task}', which has no text tokenizer; evaluate it "
          f"with `python eval.py --workdir {workdir}`")


NUM_SPECIAL = 4
FILLERS = {"mqar": ("random", "blank"), "needle": ("random",)}
SPLIT_CODES = {"train": 1, "val": 2}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task's shape; built from config.data by `task_spec` (all fields validated there)."""
  name: str
  seq_len: int
  vocab_size: int
  compositional: bool = True
  num_keys: int = 4
  num_queries: int = 8
  query_power: float = 0.1
  needles: int = 4
  asked: int = 2
  distractors: int = 0
  depth_min: float = 0.0
  depth_max: float = 1.0
  filler: str = "random"
  heldout_buckets: int = 16

  @property
  def stored(self) -> int:
    """Stored key-value items per row: g*g triples, plain pairs, or needles + distractors."""
    if self.name == "needle":
      return self.needles + self.distractors
    return self.num_keys ** 2 if self.compositional else self.num_keys

  @property
  def item_len(self) -> int:
    if self.name == "needle":
      return 4
    return 3 if self.compositional else 2

  @property
  def answers_per_row(self) -> int:
    return self.asked if self.name == "needle" else self.num_queries

  def pools(self) -> dict[str, tuple[int, int]]:
    """{pool: (first id, size)} over ids NUM_SPECIAL .. vocab_size - 1."""
    free = self.vocab_size - NUM_SPECIAL
    if self.name == "mqar" and not self.compositional:
      sizes = {"key": free // 2, "value": free - free // 2}
    elif self.name == "mqar":
      sizes = {"key1": free // 4, "key2": free // 4, "value": free - 2 * (free // 4)}
    else:
      sizes = {"key1": free // 8, "key2": free // 8, "value": free // 4}
      sizes["filler"] = free - sum(sizes.values())
    out, start = {}, NUM_SPECIAL
    for name, size in sizes.items():
      out[name] = (start, size)
      start += size
    return out

  def settings(self) -> dict:
    """The fields that apply to this task (for reports)."""
    own = (("compositional", "num_keys", "num_queries", "query_power", "filler")
           if self.name == "mqar" else
           ("needles", "asked", "distractors", "depth_min", "depth_max", "filler"))
    return {k: getattr(self, k) for k in ("seq_len", "vocab_size") + own + ("heldout_buckets",)}

  def describe(self) -> dict:
    return dict(task=self.name, vocab_size=self.vocab_size, pools=self.pools(),
                special=dict(pad=PAD, blank=BLANK, needle=NEEDLE, query=QUERY))


def task_spec(data: ml_collections.ConfigDict, seq_len: int | None = None, **overrides
              ) -> TaskSpec:
  """The TaskSpec config.data describes (overrides: evaluation slices); one-line DataError
  naming the field when a setting is impossible."""
  t = data.task
  fields = {f.name for f in dataclasses.fields(TaskSpec)} - {"name", "seq_len"}
  spec = TaskSpec(name=data.name, seq_len=int(data.seq_len if seq_len is None else seq_len),
                  **{**{k: t[k] for k in fields}, **overrides})
  check(spec)
  return spec


class RowTooShort(DataError):
  """The task's rows do not fit in seq_len (a longer row may fit)."""


def _fail(field: str, constraint: str, error: type[DataError] = DataError):
  raise error(f"data.task.{field}: {constraint}")


def check(s: TaskSpec) -> None:
  if s.name not in TASKS:
    raise DataError(f"data.name: '{s.name}' is not a synthetic task ({', '.join(TASKS)})")
  if s.filler not in FILLERS[s.name]:
    _fail("filler", f"'{s.filler}' is not one of {', '.join(FILLERS[s.name])} for {s.name}")
  if s.heldout_buckets < 2:
    _fail("heldout_buckets", f"must be >= 2 (1/buckets of rows go to eval), got "
          f"{s.heldout_buckets}")
  if s.vocab_size < NUM_SPECIAL + 8:
    _fail("vocab_size", f"must be >= {NUM_SPECIAL + 8}, got {s.vocab_size}")
  pools = s.pools()
  if s.name == "mqar":
    if s.num_keys < 2:
      _fail("num_keys", f"must be >= 2, got {s.num_keys}")
    key_pool = pools["key"][1] if not s.compositional else pools["key1"][1]
    if s.num_keys > key_pool:
      _fail("vocab_size", f"{s.vocab_size} leaves {key_pool} ids per key pool, fewer than "
            f"num_keys = {s.num_keys}")
    if s.stored > pools["value"][1]:
      _fail("vocab_size", f"{s.vocab_size} leaves {pools['value'][1]} value ids, fewer than the "
            f"{s.stored} distinct values a row stores")
    if not 1 <= s.num_queries < s.stored:
      _fail("num_queries", f"must be in [1, {s.stored - 1}] (a strict subset of the "
            f"{s.stored} stored pairs, so no answer follows by elimination), got {s.num_queries}")
    if s.query_power <= 0:
      _fail("query_power", f"must be > 0, got {s.query_power}")
    need = s.item_len * (s.stored + s.num_queries)
  else:
    if s.needles < 1 or not 1 <= s.asked <= s.needles:
      _fail("asked", f"need 1 <= asked <= needles, got asked={s.asked}, needles={s.needles}")
    if not 0 <= s.distractors <= s.asked * (s.asked - 1):
      _fail("distractors", f"must be in [0, asked * (asked - 1) = {s.asked * (s.asked - 1)}] "
            f"(each takes ka and kb of two different asked needles), got {s.distractors}")
    if not 0.0 <= s.depth_min <= s.depth_max <= 1.0:
      _fail("depth_min", f"need 0 <= depth_min <= depth_max <= 1, got {s.depth_min}, "
            f"{s.depth_max}")
    if s.needles > min(pools["key1"][1], pools["key2"][1]) or s.stored > pools["value"][1]:
      _fail("vocab_size", f"{s.vocab_size} leaves too few key/value ids for {s.needles} needles "
            f"+ {s.distractors} distractors (pools {pools})")
    need = s.item_len * (s.stored + s.asked) + 1
    if need <= s.seq_len + 1 and needle_band(s)[1] < s.stored:
      _fail("depth_max", f"the depth band [{s.depth_min}, {s.depth_max}] of a {s.seq_len}-token "
            f"row cannot hold {s.stored} needles without overlap", RowTooShort)
  if need > s.seq_len + 1:
    raise RowTooShort(f"data.seq_len: {s.seq_len} is too short for this task: its rows need "
                      f"{need - 1} tokens (stored items and queries)")


def content_bucket(seq: np.ndarray, buckets: int) -> np.ndarray:
  """A hash of each row's tokens mod `buckets` (wrapping uint64 polynomial hash)."""
  with np.errstate(over="ignore"):
    powers = np.cumprod(np.full(seq.shape[1], 0x9E3779B97F4A7C15 % (1 << 61), np.uint64))
    h = (seq.astype(np.uint64) * powers[None, :]).sum(axis=1, dtype=np.uint64)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
  return (h % np.uint64(buckets)).astype(np.int64)


def generate(s: TaskSpec, split: str, seed: int, index: int, rows: int
             ) -> dict[str, np.ndarray]:
  """`rows` examples of the split: the same (task, split, seed, index) always gives the same rows.

  Returns seq [rows, seq_len + 1] and, per asked item r: answer_pos (input position whose target
  is the answer), query_start, source_start (start of the stored item it asks for), asked (its
  item index) and stored_at [rows, stored] (start of every stored item).
  """
  rng = np.random.default_rng([int(seed), SPLIT_CODES[split], int(index)])
  keep_eval = split == "val"
  parts: list[dict] = []
  have = 0
  while have < rows:
    # Draw enough that the split's share of hash buckets covers the rest in one pass (usually).
    share = 1 / s.heldout_buckets if keep_eval else 1 - 1 / s.heldout_buckets
    draw = int((rows - have) / share * 1.25) + 8
    out = GENERATORS[s.name](s, rng, draw)
    mine = (content_bucket(out["seq"], s.heldout_buckets) == 0) == keep_eval
    parts.append({k: v[mine] for k, v in out.items()})
    have += int(mine.sum())
  return {k: np.concatenate([p[k] for p in parts])[:rows] for k in parts[0]}


def to_batch(example: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The trainer's batch fields; weights are 1 exactly at the answer positions."""
  seq = example["seq"]
  rows, T = seq.shape[0], seq.shape[1] - 1
  weights = np.zeros((rows, T), np.float32)
  np.put_along_axis(weights, example["answer_pos"], 1.0, axis=1)
  return dict(inputs=seq[:, :-1], targets=seq[:, 1:], segment_ids=np.ones((rows, T), np.int32),
              positions=np.broadcast_to(np.arange(T, dtype=np.int32), (rows, T)).copy(),
              weights=weights)
