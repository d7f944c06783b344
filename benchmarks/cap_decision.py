"""What deciding cuDNN's packed cap on the host buys the train step: the 830M preset at full depth,
T = 2048, 8 packed rows, compiled for one H200 on this CPU host (the gpu-aot extra), as the step
runs for rows within the cap (no cond: `Trainer.lower_train_step`) and as it would decide in every
layer's call (a lax.cond per call: `lower_train_step(decided=False)`). Per variant: the compiled
peak and the bytes the step's other kernels move (aot/inventory.py).

    python benchmarks/cap_decision.py [--json benchmarks/results/cap_decision.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.bench_common import compiled_figures, paper_config  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.mesh import batch_sharding, make_mesh  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def measure(variant: str, decided: bool) -> dict:
  config = paper_config(variant, seq_len=2048, batch=8, layers=0, size="830m")
  where = aot.target("h200:1", 0.9)
  trainer = Trainer(config, make_mesh(config.mesh, devices=where.devices))
  sharding = batch_sharding(trainer.mesh)
  batch = {k: jax.ShapeDtypeStruct((8, 2048), d, sharding=sharding) for k, d in (
      ("inputs", jnp.int32), ("targets", jnp.int32), ("segment_ids", jnp.int32),
      ("positions", jnp.int32), ("weights", jnp.float32))}
  with aot.for_target(where):
    compiled = trainer.lower_train_step(batch, decided=decided).compile()
  text = compiled.as_text() or ""
  figures = compiled_figures(compiled, text)
  return dict(variant=variant, decided_on_host=decided, conditionals=text.count(" conditional("),
              peak_gib=figures["peak_gib"], other_gb=figures["other_gb"])


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", default=str(RESULTS / "cap_decision.json"))
  args = p.parse_args()
  rows = []
  for variant in ("transformer", "diff"):
    for decided in (False, True):
      rows.append(measure(variant, decided))
      print(json.dumps(rows[-1]), flush=True)
  out = dict(provenance=f"830M preset, full depth, T=2048, 8 packed rows, compiled for one H200 on "
             f"a CPU host (jax {jax.__version__}, the gpu-aot extra); not run", rows=rows)
  Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
  main()
