"""A prepared data directory opened for reading: tokenizer + metadata + memory-mapped splits."""
from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import ml_collections
import numpy as np

from diff_transformer.data import corpus, synthetic
from diff_transformer.data.common import DataError, cache_root
from diff_transformer.data.prepare import SPLITS, prepare_documents, read_metadata
from diff_transformer.data.shards import scan_shard, split_shards
from diff_transformer.data.task_tokenizer import TaskTokenizer
from diff_transformer.data.tokenizer import Tokenizer, check_name, load_tokenizer

DATASETS = ("shakespeare", "prepared") + synthetic.TASKS


class _TokenizerFields:
  """vocab_size and eot_id of the data's tokenizer (what the model and trainer check)."""
  tokenizer: Tokenizer

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.vocab_size

  @property
  def eot_id(self) -> int:
    return self.tokenizer.eot_id


@dataclasses.dataclass(frozen=True)
class Dataset(_TokenizerFields):
  """What training and evaluation need from the data: open it with `open_dataset`."""
  path: Path  # the prepared directory
  tokenizer: Tokenizer
  metadata: dict
  seq_len: int

  def shards(self, split: str) -> list[dict]:
    """The split's shards: [{file, index, documents, stream_tokens}] (shards.py)."""
    return split_shards(self.metadata["splits"][split])

  def shard_tokens(self, split: str, shard: int) -> np.ndarray:
    """One shard's whole token stream, memory-mapped (eot d0 eot d1 ... eot)."""
    return _memmap(self.path / self.shards(split)[shard]["file"], self.metadata["dtype"])

  def shard_offsets(self, split: str, shard: int) -> np.ndarray:
    """int64 positions of the eot ids framing one shard's documents (its documents + 1)."""
    return np.load(self.path / self.shards(split)[shard]["index"])

  def document_tokens(self, split: str) -> list[np.ndarray]:
    """Each document's tokens without the eot framing, shard after shard."""
    docs = []
    for k in range(len(self.shards(split))):
      toks, off = self.shard_tokens(split, k), self.shard_offsets(split, k)
      docs += [np.asarray(toks[a + 1:b], np.int32) for a, b in zip(off[:-1], off[1:])]
    return docs


@dataclasses.dataclass(frozen=True)
class TaskDataset(_TokenizerFields):
  """A synthetic task (data/synthetic.py) in place of a prepared directory: rows come from
  synthetic.generate, the 'tokenizer' is the task's id layout."""
  spec: synthetic.TaskSpec
  tokenizer: TaskTokenizer
  seq_len: int

  @property
  def path(self) -> Path:
    return Path(f"synthetic:{self.spec.name}")

  @property
  def metadata(self) -> dict:
    # A model that ignores the context can at best spread the answer over the value pool.
    values = self.spec.pools()["value"][1]
    return dict(task=self.spec.describe(), unigram_entropy_nats=float(np.log(values)))


@functools.lru_cache(maxsize=16)
def _memmap(path: Path, dtype: str) -> np.ndarray:
  return np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")


def _named_dir(data_config: ml_collections.ConfigDict) -> Path:
  """Where the data config.data names is (or will be) prepared; nothing is read or written."""
  check_name(data_config.tokenizer)
  if data_config.name == "prepared":
    if not data_config.path:
      raise DataError("data.path: required with data.name=prepared (a directory written by "
                      "prepare_data.py)")
    return Path(data_config.path).expanduser().resolve()
  if data_config.name != "shakespeare":
    raise DataError(f"data.name: unknown dataset '{data_config.name}'; choose one of "
                    f"{', '.join(DATASETS)}")
  if data_config.tokenizer in ("file", "tiktoken"):
    raise DataError(f"data.tokenizer: '{data_config.tokenizer}' needs data.name=prepared (a "
                    "directory written by prepare_data.py --tokenizer_file/--tiktoken_file)")
  # One prepared copy per (tokenizer, vocab, held-out fraction); the split itself is by content.
  vocab = f"-{data_config.bpe_vocab_size}" if data_config.tokenizer == "bpe" else ""
  return (cache_root(data_config.cache_dir) / "shakespeare" /
          f"{data_config.tokenizer}{vocab}-val{data_config.val_fraction:g}")


def ensure_prepared(data_config: ml_collections.ConfigDict) -> Path | None:
  """The prepared directory config.data names: the built-in corpus is fetched and prepared into
  the cache on first use (what train.py and prepare_data.py --shakespeare do before anything
  opens it). A synthetic task needs nothing prepared: None."""
  if data_config.name in synthetic.TASKS:
    return None
  out = _named_dir(data_config)
  if data_config.name == "shakespeare" and not out.is_dir():
    docs = corpus.shakespeare_documents(data_config.cache_dir)
    print(f"Preparing the Shakespeare corpus into {out}", flush=True)
    prepare_documents(lambda: iter(docs), out, tokenizer=data_config.tokenizer,
                      bpe_vocab_size=int(data_config.bpe_vocab_size),
                      val_fraction=float(data_config.val_fraction),
                      sources=[f"{corpus.PACKAGE}:{n}" for n, _ in docs], force=False)
  return out


def _checked_dir(data_config: ml_collections.ConfigDict) -> Path:
  """The prepared directory config.data names, its tokenizer checked against the config."""
  path = _named_dir(data_config)
  if data_config.name == "shakespeare" and not path.is_dir():
    flags = f"--tokenizer {data_config.tokenizer}"
    if data_config.tokenizer == "bpe":
      flags += f" --bpe_vocab_size {data_config.bpe_vocab_size}"
    flags += f" --val_fraction {data_config.val_fraction:g}"
    if data_config.cache_dir:
      flags += f" --cache_dir {data_config.cache_dir}"
    raise DataError(f"data.name: the built-in corpus is not prepared in {path} yet; run `python "
                    f"prepare_data.py --shakespeare {flags}` (train.py prepares it on first use)")
  meta = read_metadata(path)
  recorded = meta["tokenizer"]
  if recorded["name"] != data_config.tokenizer or (
      recorded["name"] == "bpe" and meta.get("requested_bpe_vocab_size") not in (
          None, data_config.bpe_vocab_size)):
    want = data_config.tokenizer + (f" (bpe_vocab_size={data_config.bpe_vocab_size})"
                                    if data_config.tokenizer == "bpe" else "")
    have = recorded["name"] + (f" (bpe_vocab_size={meta.get('requested_bpe_vocab_size')})"
                               if recorded["name"] == "bpe" else "")
    raise DataError(f"data.tokenizer: config asks for {want} but {path} was prepared with "
                    f"{have}; set --config.data.tokenizer/bpe_vocab_size to match or prepare "
                    "again")
  return path


def open_prepared(path: str | Path, seq_len: int) -> Dataset:
  """The dataset of a prepared directory (its tokenizer, metadata and shards checked) for rows
  of `seq_len` tokens; nothing is written."""
  path = Path(path)
  meta = read_metadata(path)
  tok = load_tokenizer(meta["tokenizer"], path)
  if seq_len <= 0:
    raise DataError(f"data.seq_len: must be positive, got {seq_len}")
  unchecked = 0
  for shard, file in _sized_shards(path, meta):
    if "max_id" not in shard:
      unchecked += 1
    elif shard["max_id"] >= tok.vocab_size:
      raise out_of_range(file, shard["max_id"], tok.vocab_size, path, meta)
  if unchecked:  # prepared before shards recorded their id range and checksum
    print(f"note: {path} records no id range or checksum for {unchecked} shard(s); "
          f"`python prepare_data.py --verify {path}` scans them", file=sys.stderr)
  return Dataset(path=path, tokenizer=tok, metadata=meta, seq_len=seq_len)


def open_dataset(data_config: ml_collections.ConfigDict, *, seq_len: int | None = None
                 ) -> Dataset | TaskDataset:
  """The data config.data names, opened read-only: what training and evaluation read. The
  prepared directory must exist (`ensure_prepared` writes it); its tokenizer is checked against
  the config. seq_len defaults to config.data.seq_len (the iterators use the dataset's).
  Synthetic tasks (data.name = mqar | needle) are generated, not prepared: a TaskDataset."""
  if data_config.name in synthetic.TASKS:
    spec = synthetic.task_spec(data_config, seq_len)
    return TaskDataset(spec=spec, tokenizer=TaskTokenizer(spec), seq_len=spec.seq_len)
  return open_prepared(_checked_dir(data_config),
                       int(data_config.seq_len if seq_len is None else seq_len))


def _sized_shards(path: Path, meta: dict):
  """(shard record, file) of every split's shards, each file checked against its recorded size."""
  for split in SPLITS:
    for shard in split_shards(meta["splits"][split]):
      file = path / shard["file"]
      n = shard["stream_tokens"] * np.dtype(meta["dtype"]).itemsize
      if not file.is_file() or file.stat().st_size != n:
        raise DataError(f"{file}: missing or not {n} bytes as metadata.json says; rebuild it: "
                        f"{rebuild_command(path, meta)}")
      yield shard, file


def rebuild_command(path: Path, meta: dict) -> str:
  sources = meta.get("sources") or []
  if not sources:
    return f"delete {path} (the built-in corpus is prepared again on its next use)"
  return (f"python prepare_data.py {' '.join(f'--input {s}' for s in sources)} --output {path} "
          f"--tokenizer {meta['tokenizer']['name']} --force")


def out_of_range(file: Path, token_id: int, vocab_size: int, path: Path, meta: dict) -> DataError:
  """The one line for a shard holding an id the tokenizer cannot have produced."""
  return DataError(f"{file}: token id {token_id} is outside the tokenizer's vocabulary of "
                   f"{vocab_size} (a wrong --tokenizer at prepare time, a stale or damaged shard); "
                   f"rebuild it: {rebuild_command(path, meta)}")


def verify_prepared(directory: str | Path) -> dict:
  """Scans every shard of a prepared directory (`prepare_data.py --verify`): its ids against the
  tokenizer's vocabulary and its sha256 against metadata.json where recorded. The first problem
  is one DataError; returns {shards, tokens, checksums_compared}."""
  path = Path(directory).expanduser().resolve()
  meta = read_metadata(path)
  vocab = load_tokenizer(meta["tokenizer"], path).vocab_size
  out = dict(shards=0, tokens=0, checksums_compared=0)
  for shard, file in _sized_shards(path, meta):
    largest, digest = scan_shard(file, meta["dtype"])
    if largest >= vocab:
      raise out_of_range(file, largest, vocab, path, meta)
    if "sha256" in shard:
      if digest != shard["sha256"]:
        raise DataError(f"{file}: its sha256 differs from the one metadata.json recorded (the "
                        f"shard changed since it was prepared); rebuild it: "
                        f"{rebuild_command(path, meta)}")
      out["checksums_compared"] += 1
    out["shards"] += 1
    out["tokens"] += shard["stream_tokens"]
  return out


def heldout_documents(dataset: Dataset) -> list[str]:
  """The validation split's documents as text (decoded; the tokenizers are lossless)."""
  return [dataset.tokenizer.decode(d.tolist()) for d in dataset.document_tokens("val")]


def unigram_entropy(dataset: Dataset) -> float:
  """Entropy (nats/token) of the train targets' unigram distribution: the loss of a model that
  ignores context. A trained LM should end clearly below it."""
  return float(dataset.metadata["unigram_entropy_nats"])  # counted by prepare over train targets
