"""Text -> tokenized train/validation shards + metadata.json (used by prepare_data.py and the
built-in corpus alike).

On-disk format (one directory; shards.py has the shard layout):
  train-NNNNN.bin, val-NNNNN.bin   token shards: flat little-endian streams, uint16 (vocab <=
                          65536) else uint32, each  eot d0 eot d1 eot ... eot  (whole documents
                          framed by end-of-text ids)
  train-NNNNN.idx.npy, ...  int64 offsets of each shard's eot ids (its documents + 1 entries);
                          document i's training pairs are inputs stream[o_i:o_{i+1}], targets
                          shifted by 1
  tokenizer.json          the BPE (absent for the byte tokenizer)
  metadata.json           vocab size, dtype, tokenizer name + checksum, eot id, shards and counts
                          per split
Why flat token files and not ArrayRecord: the pipeline needs O(1) random access to arbitrary
seq_len-sized slices of documents for any seq_len chosen at train time; a memory-mapped flat
array gives that with zero copies and no per-record decoding, and the offsets index keeps the
document boundaries that ArrayRecord's records would otherwise encode. Shards keep files to a
size that copies, checksums and object stores handle well.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import ml_collections
import numpy as np
from tqdm import tqdm

from diff_transformer.data.common import DataError, atomic_dir
from diff_transformer.data.documents import (Documents, list_input_files, plan_split,
                                              read_documents, split_documents)
from diff_transformer.data.shards import SHARD_TOKENS, ShardWriter
from diff_transformer.data.tiktoken_file import TIKTOKEN_FILE, TiktokenTokenizer  # tiktoken: lazily
from diff_transformer.data.tokenizer import (TOKENIZER_FILE, FileTokenizer, Tokenizer,
                                             build_tokenizer, check_name, describe)
from diff_transformer.files import read_json

FORMAT_VERSION = 2  # 2: sharded splits; 1 (one file per split) is still read
FORMATS = (1, 2)
METADATA = "metadata.json"
SPLITS = ("train", "val")
_ENCODE_BATCH = 64


# ------------------------------------------------------------------------------ the writing
def _token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _batched(items: Iterable, n: int) -> Iterator[list]:
  batch = []
  for item in items:
    batch.append(item)
    if len(batch) == n:
      yield batch
      batch = []
  if batch:
    yield batch


def prepare_documents(documents: Documents, output: str | Path, *, tokenizer: str = "bpe",
                      bpe_vocab_size: int = 8192, val_fraction: float = 0.05,
                      sources: Sequence[str] = (), force: bool = False,
                      progress: bool = True, tokenizer_file: str | Path | None = None,
                      tiktoken_encoding: str = "", workers: int = 1,
                      shard_tokens: int = SHARD_TOKENS) -> dict:
  """Tokenizes `documents` into `output` (published atomically); returns the metadata.

  tokenizer="file" uses the `tokenizers` file `tokenizer_file`; tokenizer="tiktoken" the local
  .tiktoken file `tokenizer_file` as encoding `tiktoken_encoding` (default: the file's stem).
  Either is copied into `output`. `workers` > 1 encodes in that many processes (same output);
  a shard closes once it holds `shard_tokens` tokens."""
  check_name(tokenizer)
  if workers < 1:
    raise DataError(f"--workers: must be >= 1, got {workers}")
  if shard_tokens < 2:
    raise DataError(f"--shard_tokens: must be >= 2, got {shard_tokens}")
  if (tokenizer in ("file", "tiktoken")) != (tokenizer_file is not None):
    raise DataError("--tokenizer_file/--tiktoken_file: give a file exactly when the tokenizer is "
                    "'file' or 'tiktoken'")
  if tokenizer_file is not None:  # a bad file is one line before any slow work
    if tokenizer == "file":
      FileTokenizer.from_file(tokenizer_file)
    else:
      tiktoken_encoding = tiktoken_encoding or Path(tokenizer_file).stem
      TiktokenTokenizer(tokenizer_file, tiktoken_encoding)
  output = Path(output).expanduser().resolve()
  if output.exists():
    if not (output / METADATA).is_file() and any(output.iterdir()):
      raise DataError(f"{output}: exists and is not a prepared data directory; choose another "
                      "--output")
    if not force:
      raise DataError(f"{output}: already holds prepared data; pass --force to overwrite")
  # Pass 1: sizes and content hashes only (validates every input before any slow work).
  sizes, hashes = [], []
  # delay: no bar (and no noise before a one-line input error) unless the scan is slow.
  for _, text in tqdm(documents(), desc="scan", unit="doc", disable=not progress, delay=2):
    sizes.append(len(text))
    hashes.append(hashlib.sha256(text.encode("utf-8")).hexdigest())
  if not sizes:
    raise DataError("no documents in the input")
  plan = plan_split(sizes, hashes, val_fraction)

  with atomic_dir(output, replace=force) as tmp:
    # Pass 2 (BPE only): trained on the training split, so validation text stays unseen.
    train_texts = (t for _, s, _, t in split_documents(documents, plan, val_fraction)
                   if s == "train")
    if tokenizer_file is not None:
      copy_name = TOKENIZER_FILE if tokenizer == "file" else TIKTOKEN_FILE
      shutil.copyfile(tokenizer_file, tmp / copy_name)
    if tokenizer == "tiktoken":
      (tmp / "tiktoken.json").write_text(json.dumps(dict(encoding=tiktoken_encoding)) + "\n")
    tok = build_tokenizer(ml_collections.ConfigDict(
        dict(tokenizer=tokenizer, bpe_vocab_size=bpe_vocab_size)), tmp, train_texts)
    meta = _write_splits(documents, plan, val_fraction, tok, tmp, len(sizes), progress, workers,
                         shard_tokens)
    meta.update(format=FORMAT_VERSION, split_mode=plan["mode"], val_fraction=val_fraction,
                requested_bpe_vocab_size=bpe_vocab_size if tokenizer == "bpe" else None,
                sources=list(sources))
    (tmp / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
  return meta


# ---- parallel encoding: each worker process loads the tokenizer from the output directory
_worker: tuple[Tokenizer, np.dtype] | None = None


def _init_worker(name: str, directory: str, dtype: str) -> None:
  global _worker
  os.environ["RAYON_NUM_THREADS"] = "1"  # one core per process (tokenizers' own thread pool)
  _worker = (build_tokenizer(ml_collections.ConfigDict(dict(tokenizer=name, bpe_vocab_size=0)),
                             directory), np.dtype(dtype))


def _encode(tok: Tokenizer, dtype: np.dtype, batch: list) -> tuple[list, np.ndarray, np.ndarray]:
  """(keys, concatenated ids, lengths [N]) of a batch of (index, split, name, text): workers
  send one array per batch back, not a Python int per token."""
  ids = tok.encode_batch([b[3] for b in batch])
  lengths_N = np.fromiter(map(len, ids), np.int64, len(ids))
  flat = np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lengths_N.sum()))
  return [b[:3] for b in batch], flat, lengths_N


def _encode_in_worker(batch: list) -> tuple[list, np.ndarray, np.ndarray]:
  assert _worker is not None, "a pool worker runs _init_worker first"
  return _encode(*_worker, batch)


def _encoded(stream: Iterable, tok: Tokenizer, dtype: np.dtype, directory: Path, workers: int
             ) -> Iterator[tuple[list, np.ndarray, np.ndarray]]:
  """_encode of each batch of documents, in input order, over `workers` processes."""
  if workers <= 1:
    for batch in _batched(stream, _ENCODE_BATCH):
      yield _encode(tok, dtype, batch)
    return
  # spawn: the parent may hold JAX/XLA threads, which fork must not copy.
  ctx = multiprocessing.get_context("spawn")
  with ctx.Pool(workers, _init_worker, (tok.name, str(directory), dtype.str)) as pool:
    yield from pool.imap(_encode_in_worker, _batched(stream, _ENCODE_BATCH), chunksize=4)


def _write_splits(documents: Documents, plan: dict, val_fraction: float, tok: Tokenizer,
                  out: Path, num_docs: int, progress: bool, workers: int = 1,
                  shard_tokens: int = SHARD_TOKENS) -> dict:
  """Pass 3: encode every document into its split's shards; counts and unigram statistics."""
  dtype = _token_dtype(tok.vocab_size)
  writers = {s: ShardWriter(out, s, dtype, tok.eot_id, shard_tokens) for s in SPLITS}
  names: dict[str, list[str]] = {s: [] for s in SPLITS}
  try:
    stream = split_documents(documents, plan, val_fraction)
    bar = tqdm(total=num_docs, desc=f"tokenize ({tok.name}, {max(workers, 1)} processes)",
               unit="doc", disable=not progress)
    done, total_tokens, start = -1, 0, time.perf_counter()
    for keys, flat, lengths_N in _encoded(stream, tok, dtype, out, workers):
      ends = np.cumsum(lengths_N)
      for (i, split, name), a, b in zip(keys, ends - lengths_N, ends):
        writers[split].add(flat[a:b])
        names[split].append(name)
        bar.update(i - done)
        done = i
      total_tokens += int(ends[-1]) if len(ends) else 0
      bar.set_postfix(tokens_per_s=f"{total_tokens / max(time.perf_counter() - start, 1e-9):.3g}",
                      refresh=False)
    bar.close()
    seconds = time.perf_counter() - start
    shards = {s: writers[s].finish() for s in SPLITS}
  finally:
    for w in writers.values():
      w.abort()
  for s in SPLITS:
    if not names[s]:
      raise DataError(f"too little text to hold out a {s} split (val_fraction={val_fraction})")
  # Unigram statistics of the training targets: every token and each document's final eot
  # (each shard's opening eot is no target).
  counts = np.add.reduce([np.bincount(np.memmap(out / sh["file"], dtype, mode="r")[1:],
                                      minlength=tok.vocab_size) for sh in shards["train"]])
  p = counts[counts > 0] / counts.sum()
  splits = {}
  for s in SPLITS:
    stream = sum(sh["stream_tokens"] for sh in shards[s])
    splits[s] = dict(shards=shards[s], documents=len(names[s]),
                     tokens=int(stream - len(names[s]) - len(shards[s])),  # without eot framing
                     stream_tokens=int(stream))
  splits["val"]["document_names"] = names["val"]  # small; which text is held out
  return dict(tokenizer=describe(tok), vocab_size=int(tok.vocab_size), eot_id=int(tok.eot_id),
              dtype=dtype.name, splits=splits,
              unigram_entropy_nats=float(-(p * np.log(p)).sum()),
              tokenize=dict(processes=max(workers, 1), seconds=round(seconds, 3),
                            tokens_per_s=round(total_tokens / max(seconds, 1e-9))))


def prepare_files(inputs: Sequence[str | Path], output: str | Path, *, text_field: str = "text",
                  **kwargs) -> dict:
  """prepare_data.py's work: user .txt/.jsonl files or directories -> a prepared directory."""
  files = list_input_files(inputs)
  return prepare_documents(lambda: read_documents(files, text_field), output,
                           sources=[str(f) for f in files], **kwargs)


def read_metadata(directory: str | Path) -> dict:
  path = Path(directory).expanduser() / METADATA
  if not path.is_file():
    raise DataError(f"{path}: not found; write it with `python prepare_data.py --input "
                    f"FILE_OR_DIR --output {Path(directory)}`")
  meta = read_json(path, DataError, "prepared metadata")
  if meta["format"] not in FORMATS:
    raise DataError(f"{path}: format {meta['format']} is not one of {FORMATS}; prepare again")
  return meta

