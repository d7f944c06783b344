"""grain pipelines: packed, document-masked batches for training (resumable) and validation.

Each document is framed as  eot t_0 ... t_{n-1} eot  and turned into n + 1 (input, target) pairs
*before* packing (inputs = frame[:-1], targets = frame[1:]), so a target is always the real next
token of the same document (the closing eot included) and packing can cut anywhere without
losing or corrupting a target. Documents longer than seq_len are split into seq_len-pair chunks;
a chunk is the unit of shuffling and sharding and counts as its own segment (positions restart).

Batch format (dict of numpy arrays, each [local_batch, seq_len]):
  inputs       int32  token ids (0 at padding)
  targets      int32  next token ids (0 at padding)
  segment_ids  int32  1, 2, ... for the documents (chunks) of a row in order; 0 = padding
  positions    int32  position within the segment, restarting at 0 at each segment start
  weights      float32 1 where the target is a real next token of the same document, else 0
Attention must be causal *and* restricted to equal, nonzero segment_ids.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import grain
import ml_collections
import numpy as np

from diff_transformer.data import synthetic
from diff_transformer.data.common import DataError
from diff_transformer.data.dataset import Dataset, TaskDataset

PACKINGS = ("concat", "first_fit")
FIELDS = ("inputs", "targets", "segment_ids", "positions", "weights")
# Reading a chunk is a memmap slice (microseconds): a couple of threads keep ahead of any
# training step without competing with JAX for the few cores of a CPU host.
_READ = grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)
# A synthetic task's validation set when the caller names no size (its stream has no end).
TASK_VAL_BATCHES = 16


def _task_batches(dataset: TaskDataset, split: str, seed: int, local: int, process_index: int,
                  process_count: int) -> grain.IterDataset:
  """Batch i is synthetic.generate(split, seed, i) of the global batch; each process keeps its
  rows, so the global batch is the same for any process count."""
  def make(index: int) -> dict[str, np.ndarray]:
    rows = synthetic.to_batch(synthetic.generate(dataset.spec, split, seed, index,
                                                 local * process_count))
    return {k: v[process_index * local:(process_index + 1) * local] for k, v in rows.items()}

  return grain.MapDataset.range(0, 1 << 40).map(make).to_iter_dataset(
      grain.ReadOptions(num_threads=1, prefetch_buffer_size=4))


def chunk_table(offsets: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(start, num_pairs) of each chunk: every document's pairs cut into runs of <= seq_len."""
  offsets = np.asarray(offsets, np.int64)
  pairs = np.diff(offsets)  # document length + 1
  per_doc = -(-pairs // seq_len)
  doc = np.repeat(np.arange(len(pairs)), per_doc)
  first = np.cumsum(per_doc) - per_doc
  k = np.arange(int(per_doc.sum())) - np.repeat(first, per_doc)
  starts = offsets[doc] + k * seq_len
  return starts, np.minimum(seq_len, offsets[doc + 1] - starts)


class ChunkSource(Sequence):
  """Random access to one split's chunks (over all its shards) as {"inputs", "targets"} (a grain
  data source)."""

  def __init__(self, dataset: Dataset, split: str) -> None:
    shards = dataset.shards(split)
    self._files = [Path(dataset.path) / sh["file"] for sh in shards]
    self._dtype = np.dtype(dataset.metadata["dtype"])
    tables = [chunk_table(dataset.shard_offsets(split, k), dataset.seq_len)
              for k in range(len(shards))]
    self.shard = np.concatenate([np.full(len(t[0]), k, np.int32) for k, t in enumerate(tables)])
    self.starts = np.concatenate([t[0] for t in tables])
    self.lengths = np.concatenate([t[1] for t in tables])
    self._tokens: list[np.memmap] | None = None

  def __len__(self) -> int:
    return len(self.starts)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:  # type: ignore[override]  # no slices
    if self._tokens is None:  # opened lazily so the source pickles into worker processes
      self._tokens = [np.memmap(f, dtype=self._dtype, mode="r") for f in self._files]
    s, n = int(self.starts[i]), int(self.lengths[i])
    window = np.asarray(self._tokens[self.shard[i]][s:s + n + 1], np.int32)
    return {"inputs": window[:-1], "targets": window[1:]}

  def __getstate__(self) -> dict:
    return {**self.__dict__, "_tokens": None}


def _finish_row(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  int32 = lambda a: a.astype(np.int32, copy=False)  # grain's packers already give int32
  seg = int32(x["inputs_segment_ids"])
  return {"inputs": int32(x["inputs"]), "targets": int32(x["targets"]),
          "segment_ids": seg, "positions": int32(x["inputs_positions"]),
          "weights": (seg > 0).astype(np.float32)}


def _stack(rows: Sequence[dict[str, np.ndarray]], size: int) -> dict[str, np.ndarray]:
  """Stacks rows; a short final batch is filled with padding rows (weights 0) to keep shapes."""
  out = {k: np.stack([r[k] for r in rows]) for k in FIELDS}
  if len(rows) < size:
    out = {k: np.concatenate([v, np.zeros((size - len(rows),) + v.shape[1:], v.dtype)])
           for k, v in out.items()}
  return out


def _rows(dataset: Dataset, split: str, packing: str, *, seed: int, shuffle: bool,
          num_epochs: int | None, process_index: int, process_count: int,
          num_bins: int) -> grain.IterDataset:
  """Packed rows of seq_len from this process's slice of the split's chunks."""
  if packing not in PACKINGS:
    raise DataError(f"data.packing: unknown packing '{packing}'; choose one of "
                    f"{', '.join(PACKINGS)}")
  source = ChunkSource(dataset, split)
  if len(source) < process_count:
    raise DataError(f"{dataset.path}: the {split} split has {len(source)} chunks of "
                    f"seq_len={dataset.seq_len}, fewer than {process_count} processes")
  ds = grain.MapDataset.source(source)[process_index::process_count]
  if shuffle:
    ds = ds.shuffle(seed=seed)  # followed by repeat, each epoch gets a new order
  ds = ds.repeat(num_epochs).to_iter_dataset(_READ)
  lengths = {"inputs": dataset.seq_len, "targets": dataset.seq_len}
  if packing == "concat":
    ds = grain.experimental.ConcatThenSplitIterDataset(ds, length_struct=lengths)
  else:
    ds = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct=lengths, num_packing_bins=num_bins, seed=seed, shuffle_bins=shuffle)
  return ds.map(_finish_row)


def train_iterator(dataset: Dataset, data_config: ml_collections.ConfigDict,
                   global_batch_size: int, process_index: int = 0, process_count: int = 1,
                   seed: int | None = None, num_epochs: int | None = None):
  """This process's training batches ([global_batch_size // process_count, seq_len] each).

  Shuffled by `seed` (default config.data.seed), repeated forever unless num_epochs is given
  (the last batch is then filled with padding rows). Returns a grain DatasetIterator: its
  get_state()/set_state() and grain.checkpoint.CheckpointSave/Restore resume at the exact next
  batch.
  """
  if not 0 <= process_index < process_count:
    raise DataError(f"process_index {process_index} is not in [0, {process_count})")
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise DataError(f"train.global_batch_size: {global_batch_size} must be a positive multiple "
                    f"of the process count {process_count}")
  local = global_batch_size // process_count
  seed = int(data_config.seed if seed is None else seed)
  if isinstance(dataset, TaskDataset):
    if num_epochs is not None:
      raise DataError("num_epochs: synthetic tasks are an endless stream; leave it unset")
    return JsonStateIterator(iter(_task_batches(dataset, "train", seed, local, process_index,
                                                process_count)))
  rows = _rows(dataset, "train", data_config.packing, seed=seed, shuffle=True,
               num_epochs=num_epochs, process_index=process_index,
               process_count=process_count, num_bins=max(local, 8))
  batches = rows.batch(local, drop_remainder=num_epochs is None,
                       batch_fn=functools.partial(_stack, size=local))
  return JsonStateIterator(iter(batches))


def _lists_to_tuples(x):
  if isinstance(x, dict):
    return {k: _lists_to_tuples(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return tuple(_lists_to_tuples(v) for v in x)
  return x


class JsonStateIterator(grain.DatasetIterator):
  """Resumes exactly from a state that went through JSON (as grain.checkpoint writes it).

  grain 0.2.18's ConcatThenSplit keeps (-1, -1) "no remainder" tuples in its state; JSON turns
  them into lists, which its set_state misreads as a remainder (a shifted data order).
  """

  def __next__(self):
    return next(self._parent)

  def get_state(self) -> dict:
    return self._parent.get_state()

  def set_state(self, state: dict) -> None:
    self._parent.set_state(_lists_to_tuples(state))


def validation_batches(dataset: Dataset, data_config: ml_collections.ConfigDict,
                       batch_size: int, num_batches: int | None = None, *,
                       process_index: int = 0, process_count: int = 1
                       ) -> Iterator[dict[str, np.ndarray]]:
  """Held-out batches in a fixed order (the same on every call), at most `num_batches`.

  `batch_size` is global: every process walks the same global rows and yields its
  [batch_size // process_count] slice, so all processes yield the same number of batches.
  The last batch is filled with padding rows (weights 0). Synthetic tasks: `num_batches`
  batches (default TASK_VAL_BATCHES) of the task's eval split.
  """
  if batch_size <= 0 or batch_size % process_count:
    raise DataError(f"validation batch size {batch_size} must be a positive multiple of the "
                    f"process count {process_count}")
  local = batch_size // process_count
  if isinstance(dataset, TaskDataset):
    batches = _task_batches(dataset, "val", int(data_config.seed), local, process_index,
                            process_count)
    yield from itertools.islice(batches, num_batches or TASK_VAL_BATCHES)
    return
  rows = _rows(dataset, "val", data_config.packing, seed=0, shuffle=False, num_epochs=1,
               process_index=0, process_count=1, num_bins=max(batch_size, 8))
  batches = rows.batch(batch_size, batch_fn=functools.partial(_stack, size=batch_size))
  for b, batch in enumerate(batches):
    if num_batches is not None and b >= num_batches:
      return
    yield {k: v[process_index * local:(process_index + 1) * local] for k, v in batch.items()}
