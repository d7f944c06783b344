"""Generation speed of the built-in synthetic tasks (tokens/s, one process; numpy is
single-threaded here), median over repeats. Writes benchmarks/results/synthetic_throughput.json.

  python benchmarks/synthetic_throughput.py [--rows 256] [--repeats 20]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import synthetic as presets  # noqa: E402
from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer.data import synthetic  # noqa: E402


def measure(preset: str, rows: int, repeats: int) -> dict:
  spec = synthetic.task_spec(presets.get_config(f"transformer-{preset}").data)
  for split in ("train", "val"):
    synthetic.generate(spec, split, 0, 0, rows)  # warm-up
  out = dict(task=preset, seq_len=spec.seq_len, rows=rows)
  for split in ("train", "val"):
    seconds = []
    for i in range(repeats):
      start = time.perf_counter()
      synthetic.to_batch(synthetic.generate(spec, split, 0, i + 1, rows))
      seconds.append(time.perf_counter() - start)
    tokens = rows * (spec.seq_len + 1)
    rates = tokens / np.asarray(seconds)
    out[f"{split}_tokens_per_s"] = float(np.median(rates))
    out[f"{split}_tokens_per_s_range"] = [float(rates.min()), float(rates.max())]
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rows", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--out", type=out_file, default=str(ROOT / "benchmarks" / "results" /
                                           "synthetic_throughput.json"))
  args = parser.parse_args()
  results = [measure(p, args.rows, args.repeats) for p in presets.TASKS]
  for r in results:
    print(f"{r['task']:>11} T={r['seq_len']:<4} train {r['train_tokens_per_s'] / 1e6:6.1f}M "
          f"tokens/s  eval split {r['val_tokens_per_s'] / 1e6:6.1f}M tokens/s")
  path = Path(args.out)
  path.write_text(json.dumps(dict(machine=platform.processor() or platform.machine(),
                                  results=results), indent=1) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
