"""Runs per hour by population size: P members of one study cell stepped by one compiled program
(training/population.py) against the same config stepped alone, at the LM and retrieval
studies' settings.

    JAX_PLATFORMS=cpu python benchmarks/population.py            # sizes 1, 2, 4, 8
    python benchmarks/population.py --quick                      # tiny shapes, a smoke run

Per setting and size: compile seconds, member-steps/s (median [min-max] over rounds, each round
`--steps` steps of all members), that rate over the standalone step's, timed in the same run,
and runs per hour: members x 3600 s over one program's compile plus the setting's train.steps
at that rate (training steps only: evaluation and start-up are left out, alike for both). Writes benchmarks/results/population.json (or --out). A ratio above 1 means a population
trains more runs per hour than one process per run on this device.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench_common import small_config, spread, synthetic_batch  # noqa: E402
from configs.studies import lm, retrieval  # noqa: E402
from diff_transformer.config import validate  # noqa: E402
from diff_transformer.mesh import make_mesh  # noqa: E402
from diff_transformer.paths import write_atomic  # noqa: E402
from diff_transformer.training.population import Population  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

SETTINGS = {"lm": lm.STUDY.make, "retrieval": retrieval.STUDY.make}


def _timed(step, state, batch, steps: int, rounds: int):
  """(compile-and-first-step seconds, per-round seconds per step); the state threads through."""
  start = time.perf_counter()
  state, metrics = step(state, batch)
  jax.block_until_ready(metrics["loss"])
  first = time.perf_counter() - start
  per_step = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    per_step.append((time.perf_counter() - start) / steps)
  return first, per_step


def runs_per_hour(members: int, compile_s: float, member_steps_per_s: float,
                  train_steps: int) -> float:
  """Runs one program of `members` finishes per hour: its compile plus train_steps steps."""
  return members * 3600.0 / (compile_s + train_steps * members / member_steps_per_s)


def measure(config, sizes: list[int], steps: int, rounds: int) -> list[dict]:
  trainer = Trainer(config, make_mesh(config.mesh))
  batch = synthetic_batch(config.train.global_batch_size, config.data.seq_len,
                          config.model.vocab_size)
  first, alone = _timed(trainer.train_step, trainer.init(0), batch, steps, rounds)
  rate = spread([1 / t for t in alone])
  total = int(config.train.steps)
  rows = [dict(members=1, program="standalone", compile_and_first_step_s=first,
               member_steps_per_s=rate, vs_standalone=1.0,
               runs_per_hour=runs_per_hour(1, first, rate["median"], total))]
  for size in sizes:
    population = Population(trainer, list(range(size)), [1.0] * size)
    stacked = {k: np.stack([v] * size) for k, v in batch.items()}
    first, times = _timed(population.members_step, population.init(), stacked, steps, rounds)
    rate = spread([size / t for t in times])
    rows.append(dict(members=size, program="population", compile_and_first_step_s=first,
                     member_steps_per_s=rate,
                     vs_standalone=rate["median"] / rows[0]["member_steps_per_s"]["median"],
                     runs_per_hour=runs_per_hour(size, first, rate["median"], total)))
    print(f"  {size} members: {rate['median']:.2f} member-steps/s "
          f"({rows[-1]['vs_standalone']:.2f}x standalone), first step {first:.1f} s, "
          f"{rows[-1]['runs_per_hour']:.1f} runs/h (standalone {rows[0]['runs_per_hour']:.1f})",
          flush=True)
  return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--settings", default="lm,retrieval")
  p.add_argument("--sizes", default="1,2,4,8")
  p.add_argument("--variant", default="diff")
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
  p.add_argument("--out", default=str(Path(__file__).parent / "results" / "population.json"))
  args = p.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  device = jax.devices()[0]
  result = dict(device=f"{device.platform}:{device.device_kind}", jax=jax.__version__,
                host=f"{platform.machine()}, {os.cpu_count()} cpus",
                load_average=os.getloadavg() if hasattr(os, "getloadavg") else None,
                variant=args.variant, steps=args.steps, rounds=args.rounds, settings={})
  for name in args.settings.split(","):
    config = (small_config(args.variant, seq_len=32, batch=4) if args.quick else
              validate(SETTINGS[name](args.variant)))
    print(f"{name}: D={config.model.d_model}, B={config.train.global_batch_size}, "
          f"T={config.data.seq_len}", flush=True)
    result["settings"][name] = dict(d_model=config.model.d_model,
                                    batch=config.train.global_batch_size,
                                    seq_len=config.data.seq_len,
                                    train_steps=config.train.steps,
                                    rows=measure(config, sizes, args.steps, args.rounds))
  write_atomic(Path(args.out), json.dumps(result, indent=1) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
