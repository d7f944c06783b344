"""Tokenizes your own text into train/validation shards for training.

  python prepare_data.py --input my_texts/ --output data/mine [--tokenizer bpe|byte]
      [--tokenizer_file PATH/tokenizer.json | --tiktoken_file PATH/cl100k_base.tiktoken]
      [--bpe_vocab_size 8192] [--val_fraction 0.05] [--text_field text] [--force]
      [--workers N] [--shard_tokens 134217728]
  python train.py ... --config.data.name=prepared --config.data.path=data/mine
  python prepare_data.py --verify data/mine     # scan every shard: ids in range, checksums match

Inputs: .txt files (one document each), .jsonl files (one document per line, in --text_field),
or directories of them (searched recursively). `--shakespeare` instead fetches and prepares the
built-in corpus into the cache (what training does on first use anyway).
"""
from __future__ import annotations

import argparse
import json
import time

from diff_transformer import cli, paths
from diff_transformer.config import base_config
from diff_transformer.data import DataError, ensure_prepared, open_dataset, prepare_files
from diff_transformer.data.dataset import verify_prepared
from diff_transformer.data.shards import SHARD_TOKENS
from diff_transformer.data.tokenizer import TOKENIZERS


def main(argv: list[str] | None = None) -> int:
  defaults = base_config().data
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--input", action="append", default=[], metavar="PATH",
                 help=".txt/.jsonl file or directory; repeatable")
  p.add_argument("--output", help="directory to write (use as --config.data.path)")
  p.add_argument("--tokenizer", default=defaults.tokenizer, choices=TOKENIZERS)
  p.add_argument("--tokenizer_file", metavar="PATH",
                 help="a Hugging Face tokenizers file (tokenizer.json) to use as it is; "
                      "implies --tokenizer file (train with --config.data.tokenizer=file)")
  p.add_argument("--tiktoken_file", metavar="PATH",
                 help="a local .tiktoken encoding file, e.g. cl100k_base.tiktoken; implies "
                      "--tokenizer tiktoken (train with --config.data.tokenizer=tiktoken)")
  p.add_argument("--tiktoken_encoding", default="",
                 help="which tiktoken encoding the file is (its pattern and special tokens); "
                      "default: the file's name without .tiktoken")
  p.add_argument("--bpe_vocab_size", type=int, default=defaults.bpe_vocab_size)
  p.add_argument("--val_fraction", type=float, default=defaults.val_fraction)
  p.add_argument("--text_field", default="text", help="the text field of .jsonl records")
  p.add_argument("--force", action="store_true", help="overwrite a prepared --output")
  p.add_argument("--workers", type=int, default=1,
                 help="tokenizer processes (default 1: HF tokenizers and tiktoken already encode "
                      "each batch on every core; more processes help where Python-side work "
                      "limits, e.g. many cores)")
  p.add_argument("--shard_tokens", type=int, default=SHARD_TOKENS,
                 help="tokens per output shard file (default 2^27: 256 MB of uint16 ids)")
  p.add_argument("--shakespeare", action="store_true",
                 help="fetch + prepare the built-in corpus into the cache instead")
  p.add_argument("--cache_dir", default=defaults.cache_dir)
  p.add_argument("--verify", metavar="DIR",
                 help="scan a prepared directory's shards: ids against its vocabulary, sha256 "
                      "against metadata.json; nothing is written")
  args = p.parse_args(argv)
  start = time.time()
  if args.verify:
    result = verify_prepared(args.verify)
    print(json.dumps(dict(result, seconds=round(time.time() - start, 1))))
    print(f"{args.verify}: {result['shards']} shards, {result['tokens']} tokens: every id inside "
          f"the vocabulary; {result['checksums_compared']} checksums match")
    return 0
  if args.shakespeare:
    cfg = defaults
    cfg.update(dict(tokenizer=args.tokenizer, bpe_vocab_size=args.bpe_vocab_size,
                    val_fraction=args.val_fraction, cache_dir=args.cache_dir))
    out = ensure_prepared(cfg)
    meta = open_dataset(cfg).metadata
  else:
    if not args.output:
      raise DataError("--output: required (the directory to write)")
    paths.creatable(args.output, "--output")
    if args.tokenizer_file and args.tiktoken_file:
      raise DataError("--tokenizer_file, --tiktoken_file: give one of them")
    if args.tokenizer_file or args.tiktoken_file:
      args.tokenizer = "file" if args.tokenizer_file else "tiktoken"
    meta = prepare_files(args.input, args.output, tokenizer=args.tokenizer,
                         tokenizer_file=args.tokenizer_file or args.tiktoken_file or None,
                         tiktoken_encoding=args.tiktoken_encoding, workers=args.workers,
                         shard_tokens=args.shard_tokens,
                         bpe_vocab_size=args.bpe_vocab_size, val_fraction=args.val_fraction,
                         text_field=args.text_field, force=args.force)
    out = args.output
  summary = {s: {k: (len(v) if k == "shards" else v) for k, v in meta["splits"][s].items()
                 if k != "document_names"} for s in meta["splits"]}
  print(json.dumps(dict(output=str(out), tokenizer=meta["tokenizer"], dtype=meta["dtype"],
                        split_mode=meta["split_mode"], splits=summary,
                        unigram_entropy_nats=round(meta["unigram_entropy_nats"], 4),
                        seconds=round(time.time() - start, 1)), indent=2))
  flag = f"--config.data.tokenizer={meta['tokenizer']['name']}"
  if meta["requested_bpe_vocab_size"] is not None:  # open_dataset checks it against the config
    flag += f" --config.data.bpe_vocab_size={meta['requested_bpe_vocab_size']}"
  print(f"Train on it with: --config.data.name=prepared --config.data.path={out} {flag}")
  return 0


if __name__ == "__main__":
  cli.run(main, absl_flags=False)
