"""model.layer_loop on CPU: seconds per train step with the blocks scanned (one compiled block
looped over the stacked layers) and unrolled (each layer its own code), in the language-modelling
study's setting (configs/studies/lm.py: bytes, D=128, head width 32, 256 x 16 tokens), at 2 and
4 layers. The two loops of one model are timed interleaved with every other setting (A B C ...,
round after round), each round's ratio is scan / unroll in that round, reported as median and
range; the loss after `--check_steps` steps from one state shows how far the two loops' float32
results drift apart. Writes benchmarks/results/layer_loop_cpu.json.

  JAX_PLATFORMS=cpu taskset -c 1 python benchmarks/layer_loop.py       # on one core
  JAX_PLATFORMS=cpu python benchmarks/layer_loop.py --variants=transformer --layers=2 --rounds=2
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

from configs.studies import lm  # noqa: E402
from diff_transformer.config import validate  # noqa: E402
from diff_transformer.mesh import global_batch, make_mesh  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

from benchmarks.bench_common import (Stepper, interleaved_times, spread,  # noqa: E402
                                     synthetic_batch)

LOOPS = ("scan", "unroll")


def trainer_for(variant: str, layers: int, loop: str) -> Trainer:
  c = lm.make(variant)
  c.model.num_layers, c.model.layer_loop = layers, loop
  c = validate(c)
  return Trainer(c, make_mesh(c.mesh))


def drift(trainers: dict, batch, steps: int) -> float:
  """|loss(scan) - loss(unroll)| after `steps` steps from the same initial state and batch."""
  losses = []
  for trainer in trainers.values():
    state = trainer.init(0)
    for _ in range(steps):
      state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["loss"]))
  return abs(losses[0] - losses[1])


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--variants", default="transformer,diff")
  p.add_argument("--layers", default="2,4", help="comma-separated depths")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=3, help="timed steps per call")
  p.add_argument("--check_steps", type=int, default=10)
  p.add_argument("--out", type=cli.out_file,
                 default=str(ROOT / "benchmarks" / "results" / "layer_loop_cpu.json"))
  args = p.parse_args(argv)
  settings = [(v, int(n)) for v in args.variants.split(",") for n in args.layers.split(",")]
  calls, states, drifts, compile_s = {}, {}, {}, {}
  for variant, layers in settings:
    pair = {loop: trainer_for(variant, layers, loop) for loop in LOOPS}
    config = pair["scan"].config
    batch = global_batch(pair["scan"].mesh, synthetic_batch(
        config.train.global_batch_size, config.data.seq_len, config.model.vocab_size))
    for loop, trainer in pair.items():
      key = (variant, layers, loop)
      states[key] = trainer.init(0)
      start = time.perf_counter()
      states[key], metrics = trainer.train_step(states[key], batch)
      jax.block_until_ready(metrics)
      compile_s[key] = time.perf_counter() - start
      calls[key] = Stepper(trainer.train_step, batch, states, key)
    drifts[(variant, layers)] = drift(pair, batch, args.check_steps)
    scan_s, unroll_s = (compile_s[(variant, layers, how)] for how in ("scan", "unroll"))
    print(f"  compiled {variant} at {layers} layers: scan {scan_s:.0f} s, unroll {unroll_s:.0f} s",
          flush=True)
  loads: list[float] = []

  def after_round(r: int) -> None:
    loads.append(os.getloadavg()[0])
    print(f"  round {r + 1}/{args.rounds} (load {loads[-1]:.1f})", flush=True)

  times = interleaved_times(calls, args.rounds, inner=args.steps, after_round=after_round,
                            warm=False)
  rows = []
  print(f"\n{'variant':<12} {'layers':>6} {'scan s/step':>12} {'unroll s/step':>14} "
        f"{'scan/unroll (range)':>22} {'loss drift':>11}")
  for variant, layers in settings:
    scan, unroll = times[(variant, layers, "scan")], times[(variant, layers, "unroll")]
    ratio = spread([a / b for a, b in zip(scan, unroll)])
    rows.append(dict(variant=variant, layers=layers, scan_step_s=spread(scan),
                     unroll_step_s=spread(unroll), scan_over_unroll=ratio,
                     compile_s={loop: compile_s[(variant, layers, loop)] for loop in LOOPS},
                     loss_drift_after_check_steps=drifts[(variant, layers)]))
    print(f"{variant:<12} {layers:>6} {spread(scan)['median']:>12.3f} "
          f"{spread(unroll)['median']:>14.3f} {ratio['median']:>9.3f} "
          f"[{ratio['min']:.3f}, {ratio['max']:.3f}] {drifts[(variant, layers)]:>11.1e}")
  record = dict(machine=platform.processor() or platform.machine(), cores=os.cpu_count(),
                affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                jax=jax.__version__, rounds=args.rounds, steps_per_call=args.steps,
                check_steps=args.check_steps, load_per_round=loads, rows=rows,
                setting="configs/studies/lm.py make(variant), num_layers and layer_loop set")
  if args.out:
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  cli.run(main, absl_flags=False)
