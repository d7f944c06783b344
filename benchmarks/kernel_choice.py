"""The CPU measurements behind kernel='auto' (kernels/auto.py) and the einsum block size.

DIFF V1 attention (B 8, h 4 heads, keys d 32, values 2d, causal, float32), jitted forward +
backward of the kernel call alone; paths timed in turn (ABAB...) over `--rounds` rounds, median
and range per path. Paths: the einsum path 'xla' with causal query blocks of 32/64/128 rows and
without blocks (dense), and the dot_product_attention layout of the 'cudnn' kernel run through
XLA (what 'xla' was before; cuDNN itself needs a GPU).

  JAX_PLATFORMS=cpu python benchmarks/kernel_choice.py [--lengths 256,512,1024] [--rounds 5]
Writes benchmarks/results/attention_kernels_cpu.json (about 3 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diff_transformer import cli  # noqa: E402

cli.default_platform()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from diff_transformer.kernels import cudnn, xla  # noqa: E402

B, H, D = 8, 4, 32


def paths() -> dict:
  out = {f"xla_block{b}": (lambda b: lambda *a: xla.attention(*a, block_q=b))(b)
         for b in (32, 64, 128)}
  out["xla_dense"] = lambda *a: xla.attention(*a, block_q=1 << 30)
  out["cudnn_layout_on_xla"] = lambda *a: cudnn.attention(*a, implementation="xla")
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lengths", default="256,512,1024")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--out", type=cli.out_file,
                 default=str(ROOT / "benchmarks" / "results" / "attention_kernels_cpu.json"))
  args = p.parse_args()
  rows = []
  for T in map(int, args.lengths.split(",")):
    rng = np.random.default_rng(0)
    x = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    q1, k1, v = x(B, T, H, D), x(B, T, H, D), x(B, T, H, 2 * D)  # drawn in this order
    q2, k2 = x(B, T, H, D), x(B, T, H, D)
    steps = {}
    for name, fn in paths().items():
      step = jax.jit(jax.grad(lambda q1, k1, v, q2, k2, fn=fn: jnp.sum(fn(q1, k1, v, q2, k2, 0.3)),
                              argnums=(0, 1, 2, 3, 4)))
      jax.block_until_ready(step(q1, k1, v, q2, k2))  # compile + warm
      steps[name] = step
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
      for name, step in steps.items():
        t0 = time.perf_counter()
        jax.block_until_ready(step(q1, k1, v, q2, k2))
        times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
      rows.append(dict(T=T, path=name, median_s=float(np.median(ts)), min_s=min(ts), max_s=max(ts)))
      print(json.dumps(rows[-1]), flush=True)
  out = dict(shape=f"DIFF V1 B{B} h{H} d{D} (values 2d) causal float32, forward + backward",
             host=platform.node(), cpu_count=os.cpu_count(), load_average=os.getloadavg(),
             jax=jax.__version__, rounds=args.rounds, rows=rows)
  Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
