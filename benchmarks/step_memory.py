"""The train step's memory and traffic, compiled for one H200 on this CPU host (the gpu-aot
extra): GPU job 1's 830M cells (full depth, T = 2048, 8 rows, remat none, kernel auto), each
variant causal-only and packed with the document mask. Per cell: the compiled peak and
temporaries, and the bytes the step's GEMMs and its other kernels move (aot/inventory.py).

    python benchmarks/step_memory.py [--json benchmarks/results/step_memory.json] [--label rows]

The rows go under `--label` in the JSON; the file's other labels are kept, so the same cells
compiled by another version of the code can stand beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from benchmarks.bench_common import compiled_figures, paper_config  # noqa: E402
from diff_transformer import aot, cli  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def measure(variant: str, document_mask: bool) -> dict:
  config = paper_config(variant, seq_len=2048, batch=8, layers=0, size="830m")
  config.data.document_mask = document_mask
  start = time.perf_counter()
  compiled, _ = aot.compile_step(config, aot.target("h200:1", 0.9))
  return dict(variant=variant, document_mask=document_mask, **compiled_figures(compiled),
              compile_seconds=round(time.perf_counter() - start, 1))


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", type=cli.out_file, default=str(RESULTS / "step_memory.json"))
  p.add_argument("--label", default="rows", help="the key the rows go under in the JSON")
  args = p.parse_args(argv)
  aot.target("h200:1", 0.9)  # the gpu-aot extra, before any work
  rows = []
  for variant in PAPER_VARIANTS:
    for document_mask in (False, True):
      rows.append(measure(variant, document_mask))
      print(json.dumps(rows[-1]), flush=True)
  path = args.json
  out = json.loads(path.read_text()) if path.exists() else {}
  commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
  out[args.label] = dict(
      provenance=f"830M preset, full depth, T=2048, 8 rows, compiled for one H200 on a CPU host "
                 f"(jax {jax.__version__}, the gpu-aot extra; code at {commit or 'unknown'}); "
                 "not run", rows=rows)
  path.write_text(json.dumps(out, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  cli.run(main, absl_flags=False)
