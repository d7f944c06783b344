"""Tokens/s of prepare_data.py with 1 and 2 tokenizer processes, on a corpus generated here.

The corpus is made up (no download, no third-party text): Zipf-distributed words of random
syllables in sentences and paragraphs, as .jsonl documents of 0.5-8 KB. A user's BPE file (8192
ids, trained with `tokenizers` on the first MB) is used through --tokenizer_file, and every
setting is prepared `--repeats` times, settings interleaved so a change in machine load hits
all of them alike. Reports the tokenize phase's tokens/s (as metadata.json records it) and the
end-to-end rate (scan + split + tokenize + shards), mean and spread, with the machine's load.

  python benchmarks/prepare_throughput.py [--mb 20] [--repeats 3] [--workers 1 2]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diff_transformer.data import prepare_files  # noqa: E402

SYLLABLES = [c + v for c in "bcdfghklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
  """Writes `megabytes` of generated text as one .jsonl; returns the number of documents."""
  rng = random.Random(seed)
  words = ["".join(rng.choices(SYLLABLES, k=rng.choice((1, 1, 2, 2, 3, 4)))) for _ in range(20000)]
  cum_weights = list(itertools.accumulate(1.0 / (r + 1) for r in range(len(words))))  # Zipf
  target, written, docs = int(megabytes * 2**20), 0, 0
  with open(path, "w") as f:
    while written < target:
      size, text, length = rng.randint(512, 8192), [], 0
      while length < size:
        sentence = " ".join(rng.choices(words, cum_weights=cum_weights, k=rng.randint(4, 24)))
        text.append(sentence[0].upper() + sentence[1:] + rng.choice((". ", ". ", "? ", ".\n\n")))
        length += len(text[-1])
      line = json.dumps({"text": "".join(text)}) + "\n"
      f.write(line)
      written, docs = written + len(line), docs + 1
  return docs


def train_tokenizer(corpus: Path, out: Path, vocab: int = 8192) -> Path:
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  with open(corpus) as f:
    sample = [json.loads(line)["text"] for line, _ in zip(f, range(300))]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(sample, trainers.BpeTrainer(
      vocab_size=vocab, special_tokens=["</s>"], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(out))
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--mb", type=float, default=20.0)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
  p.add_argument("--json", default=str(Path(__file__).parent / "results" /
                                      "prepare_throughput.json"))
  args = p.parse_args()
  work = Path(tempfile.mkdtemp(prefix="prepare_bench_"))
  try:
    docs = write_corpus(work / "corpus.jsonl", args.mb)
    tokfile = train_tokenizer(work / "corpus.jsonl", work / "tokenizer.json")
    load_before = os.getloadavg()
    runs: dict[int, list[dict]] = {w: [] for w in args.workers}
    for r in range(args.repeats):
      for w in args.workers:
        start = time.perf_counter()
        meta = prepare_files([work / "corpus.jsonl"], work / "out", tokenizer="file",
                             tokenizer_file=tokfile, workers=w, progress=False, force=True)
        total = time.perf_counter() - start
        tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
        runs[w].append(dict(tokenize_tokens_per_s=meta["tokenize"]["tokens_per_s"],
                            end_to_end_tokens_per_s=round(tokens / total), tokens=tokens,
                            seconds=round(total, 2)))
        print(f"repeat {r} workers {w}: {runs[w][-1]}", flush=True)
    load_after = os.getloadavg()
  finally:
    shutil.rmtree(work, ignore_errors=True)

  def spread(values: list[float]) -> dict:
    return dict(mean=round(statistics.mean(values)),
                std=round(statistics.stdev(values)) if len(values) > 1 else 0,
                min=min(values), max=max(values))
  summary = {w: {k: spread([x[k] for x in rs]) for k in ("tokenize_tokens_per_s",
                                                          "end_to_end_tokens_per_s")}
             for w, rs in runs.items()}
  result = dict(corpus_mb=args.mb, documents=docs, tokenizer="user BPE file, 8192 ids",
                machine=dict(cpus=os.cpu_count(), processor=platform.processor() or
                             platform.machine(), python=platform.python_version()),
                loadavg_1_5_15_before=[round(x, 2) for x in load_before],
                loadavg_1_5_15_after=[round(x, 2) for x in load_after],
                repeats=args.repeats, summary=summary, runs=runs)
  Path(args.json).parent.mkdir(parents=True, exist_ok=True)
  Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
  print(json.dumps(dict(summary=summary, load_before=result["loadavg_1_5_15_before"],
                        load_after=result["loadavg_1_5_15_after"]), indent=2))


if __name__ == "__main__":
  main()
