"""Runs per hour by population size: P members of one study cell stepped by one compiled program
(training/population.py) against the same config stepped alone, at the LM and retrieval
studies' settings.

    JAX_PLATFORMS=cpu python benchmarks/population.py            # sizes 1, 2, 4, 8
    python benchmarks/population.py --quick                      # tiny shapes, a smoke run

Per setting and size: compile seconds, member-steps/s (median [min-max] over rounds, each round
`--steps` steps of all members), that rate over the standalone step's (the standalone step and
every size interleaved round by round), and runs per hour: members x 3600 s over one
program's compile plus the setting's train.steps at that rate (training steps only: evaluation
and start-up are left out, alike for both). Writes benchmarks/results/population.json (or
--out). A ratio above 1 means a population trains more runs per hour than one process per run
on this device.
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

from benchmarks.bench_common import (Stepper, interleaved_times, small_config, spread,  # noqa: E402
                          synthetic_batch)
from configs.studies import lm, retrieval  # noqa: E402
from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer.config import validate  # noqa: E402
from diff_transformer.mesh import make_mesh  # noqa: E402
from diff_transformer.paths import write_atomic  # noqa: E402
from diff_transformer.training.population import Population  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

SETTINGS = {"lm": lm.STUDY.make, "retrieval": retrieval.STUDY.make}


def runs_per_hour(members: int, compile_s: float, member_steps_per_s: float,
                  train_steps: int) -> float:
  """Runs one program of `members` finishes per hour: its compile plus train_steps steps."""
  return members * 3600.0 / (compile_s + train_steps * members / member_steps_per_s)


def measure(config, sizes: list[int], steps: int, rounds: int) -> list[dict]:
  """The standalone step and each population size, timed interleaved (standalone, 2, 4, ...;
  again; ...) so that a change in the machine's load hits every size alike."""
  trainer = Trainer(config, make_mesh(config.mesh))
  batch = synthetic_batch(config.train.global_batch_size, config.data.seq_len,
                          config.model.vocab_size)
  members = {"standalone": 1, **{f"population {size}": size for size in sizes}}
  states = {"standalone": trainer.init(0)}
  calls = {"standalone": Stepper(trainer.train_step, batch, states, "standalone")}
  for key, size in list(members.items())[1:]:
    population = Population(trainer, list(range(size)), [1.0] * size)
    states[key] = population.init()
    stacked = {k: np.stack([v] * size) for k, v in batch.items()}
    calls[key] = Stepper(population.members_step, stacked, states, key)
  first = {}
  for key, call in calls.items():  # compile and first step, each program alone
    start = time.perf_counter()
    jax.block_until_ready(call())
    first[key] = time.perf_counter() - start
  times = interleaved_times(calls, rounds, inner=steps)
  total = int(config.train.steps)
  rates = {key: spread([members[key] / t for t in times[key]]) for key in calls}
  rows = []
  for key, size in members.items():
    rows.append(dict(members=size, program=key.split()[0], compile_and_first_step_s=first[key],
                     member_steps_per_s=rates[key],
                     vs_standalone=rates[key]["median"] / rates["standalone"]["median"],
                     runs_per_hour=runs_per_hour(size, first[key], rates[key]["median"], total)))
    if key != "standalone":
      print(f"  {size} members: {rates[key]['median']:.2f} member-steps/s "
            f"({rows[-1]['vs_standalone']:.2f}x standalone), first step {first[key]:.1f} s, "
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
  p.add_argument("--out", type=out_file,
                 default=str(Path(__file__).parent / "results" / "population.json"))
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
