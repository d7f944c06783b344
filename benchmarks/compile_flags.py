"""What the test suite's XLA flags (diff_transformer/xla_flags.py: FAST_COMPILE_FLAGS) save: each
flag set added in turn, one fresh process per setting and round (XLA reads its flags once),
pinned to one core as under `pytest -n 2` on two cores. Each process builds every registered
variant's tiny trainer (GQA), compiles their init, train and eval steps and runs 20 train steps
each. Rounds are interleaved; the median and range over rounds are printed and written to
benchmarks/results/compile_flags.json.

  python benchmarks/compile_flags.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402  (XLA reads its flags when the backend starts, not at import)
import numpy as np  # noqa: E402
from jax import monitoring  # noqa: E402

from diff_transformer.xla_flags import FAST_COMPILE_FLAGS  # noqa: E402
from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer import params  # noqa: E402
from diff_transformer.config import base_config, validate  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS, set_model  # noqa: E402
from diff_transformer.mesh import make_mesh  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

STEPS = 20
D, HEAD_DIM = 32, 8


def measure_here() -> dict:
  """Runs in the child: compile and run seconds of the tiny steps under this XLA_FLAGS."""
  seconds: dict[str, float] = {}

  def add(event: str, duration_secs: float, **_) -> None:
    seconds[event] = seconds.get(event, 0.0) + duration_secs

  monitoring.register_event_duration_secs_listener(add)
  rng = np.random.default_rng(0)
  B, T = 4, 40
  batch = jax.device_put(dict(inputs=rng.integers(0, 96, (B, T)).astype(np.int32),
                              targets=rng.integers(0, 96, (B, T)).astype(np.int32),
                              segment_ids=np.ones((B, T), np.int32),
                              positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                              weights=np.ones((B, T), np.float32)))
  run = 0.0
  start = time.perf_counter()
  for variant in PAPER_VARIANTS:
    heads = params.heads_for(variant, D, HEAD_DIM)
    c = base_config()
    set_model(c.model, variant=variant, vocab_size=96, d_model=D, num_layers=2,
              head_dim=HEAD_DIM, ffn_dim=64, max_seq_len=T, num_heads=heads,
              num_kv_heads=max(1, heads // 2), kernel="xla")
    params.set_rank(c.model, 4)
    c.data.seq_len, c.train.global_batch_size = T, B
    trainer = Trainer(validate(c), make_mesh(c.mesh, devices=jax.devices()[:1]))
    state = trainer.init(0)
    state, metrics = trainer.train_step(state, batch)
    float(trainer.eval_step(state, batch)[0])
    t0 = time.perf_counter()
    for _ in range(STEPS):
      state, metrics = trainer.train_step(state, batch)
    float(metrics["loss"])
    run += time.perf_counter() - t0
  compile_events = {e.rsplit("/", 1)[-1].replace("_duration", ""): v
                    for e, v in seconds.items() if e.startswith("/jax/core/compile")}
  return dict(wall_s=time.perf_counter() - start, run_s=run,
              **{f"{name}_s": v for name, v in compile_events.items()})


def settings() -> list[tuple[str, str]]:
  """(name, XLA_FLAGS): XLA's defaults, then each fast-compile flag added in turn."""
  out, flags = [("xla defaults", "")], []
  for name, value in FAST_COMPILE_FLAGS.items():
    flags.append(f"{name}={value}")
    out.append((f"+ {name}={value}", " ".join(flags)))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--out", type=out_file,
                      default=str(ROOT / "benchmarks" / "results" / "compile_flags.json"))
  args = parser.parse_args()
  if args.child:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(json.dumps(measure_here()))
    return
  rows: dict[str, list[dict]] = {name: [] for name, _ in settings()}
  for round_ in range(args.rounds):
    for name, flags in settings():
      env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags)
      env.pop("JAX_COMPILATION_CACHE_DIR", None)
      proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True,
                            text=True, check=True)
      rows[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
      print(f"round {round_ + 1}: {name}: compile {rows[name][-1]['backend_compile_s']:.1f} s",
            flush=True)
  results = []
  for name, flags in settings():
    summary: dict[str, Any] = dict(setting=name, xla_flags=flags)
    for key in rows[name][0]:
      values = [r[key] for r in rows[name]]
      summary[key] = statistics.median(values)
      summary[f"{key}_range"] = [min(values), max(values)]
    results.append(summary)
  print(f"\n{'setting':<48} {'compile s':>10} {'trace+lower s':>14} {f'{STEPS}x4 steps s':>13}")
  for r in results:
    print(f"{r['setting']:<48} {r['backend_compile_s']:>10.1f} "
          f"{r['jaxpr_trace_s'] + r['jaxpr_to_mlir_module_s']:>14.1f} {r['run_s']:>13.2f}")
  path = Path(args.out)
  path.write_text(json.dumps(dict(machine=platform.processor() or platform.machine(),
                                  cores=os.cpu_count(), rounds=args.rounds, results=results),
                             indent=1) + "\n")
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
