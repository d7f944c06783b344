"""Token shards of a prepared split: writing them (prepare.py) and reading them (dataset.py).

A split is a list of shards. Each shard is a self-contained framed stream of whole documents,
  <split>-NNNNN.bin       eot d_a eot d_a+1 ... eot   (little-endian uint16 or uint32)
  <split>-NNNNN.idx.npy   int64 offsets of its eot ids (its documents + 1 entries)
so no document crosses a shard boundary and a reader maps one file per shard. Each shard's
metadata entry records its largest id (`max_id`, checked against the vocabulary whenever the data
is opened) and the sha256 of its .bin (`sha256`, compared by `prepare_data.py --verify`). A shard
closes once its stream reaches `shard_tokens` (a single longer document makes one larger shard).
Directories prepared before sharding (one `<split>.bin` per split, metadata format 1) read as a
split of one shard.
"""
from __future__ import annotations

import hashlib
from typing import BinaryIO
from pathlib import Path

import numpy as np

SHARD_TOKENS = 1 << 27  # 128M tokens: 256 MB (uint16) or 512 MB (uint32) per shard file


def split_shards(split_meta: dict) -> list[dict]:
  """[{file, index, documents, stream_tokens}] of a split's metadata entry (format 1: one shard)."""
  if "shards" in split_meta:
    return split_meta["shards"]
  return [dict(file=split_meta["file"], index=split_meta["index"],
               documents=split_meta["documents"], stream_tokens=split_meta["stream_tokens"])]


class ShardWriter:
  """Appends documents to one split's shards under `out`, opening a new shard when one is full."""

  def __init__(self, out: Path, split: str, dtype: np.dtype, eot_id: int,
               shard_tokens: int = SHARD_TOKENS) -> None:
    self.out, self.split, self.dtype, self.shard_tokens = out, split, dtype, shard_tokens
    self._eot = np.array([eot_id], dtype).tobytes()
    self.shards: list[dict] = []
    self._file: BinaryIO | None = None
    self._offsets: list[int] = []
    self._max, self._hash = 0, hashlib.sha256()

  def _open(self) -> None:
    name = f"{self.split}-{len(self.shards):05d}"
    self._file = open(self.out / f"{name}.bin", "wb")
    self._write(self._eot)
    self._max = int(np.frombuffer(self._eot, self.dtype)[0])
    self._offsets = [0]
    self.shards.append(dict(file=f"{name}.bin", index=f"{name}.idx.npy"))

  def _close(self) -> None:
    assert self._file is not None, "_close without _open"
    self._file.close()
    self._file = None
    shard = self.shards[-1]
    np.save(self.out / shard["index"], np.asarray(self._offsets, np.int64))
    shard.update(documents=len(self._offsets) - 1, stream_tokens=self._offsets[-1] + 1,
                 max_id=self._max, sha256=self._hash.hexdigest())
    self._hash = hashlib.sha256()

  def _write(self, data: bytes) -> None:
    assert self._file is not None, "_write without _open"
    self._file.write(data)
    self._hash.update(data)

  def add(self, ids_N: np.ndarray) -> None:
    """One document's token ids (without eot), framed by the shard's end-of-text ids."""
    if self._file is None:
      self._open()
    self._write(ids_N.astype(self.dtype, copy=False).tobytes())
    self._write(self._eot)
    if len(ids_N):
      self._max = max(self._max, int(ids_N.max()))
    self._offsets.append(self._offsets[-1] + len(ids_N) + 1)
    if self._offsets[-1] + 1 >= self.shard_tokens:
      self._close()

  def finish(self) -> list[dict]:
    if self._file is not None:
      self._close()
    return self.shards

  def abort(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def scan_shard(path: Path, dtype: str, chunk: int = 1 << 24) -> tuple[int, str]:
  """(largest id, sha256) of a shard file, read in chunks (prepare_data.py --verify)."""
  ids = np.memmap(path, dtype=np.dtype(dtype), mode="r")
  largest, digest = 0, hashlib.sha256()
  for start in range(0, len(ids), chunk):
    part = np.asarray(ids[start:start + chunk])
    largest = max(largest, int(part.max()))
    digest.update(part.tobytes())
  return largest, digest.hexdigest()
