"""Per-token decoding step time with the KV cache, per variant, on this host.

    JAX_PLATFORMS=cpu python benchmarks/decode_step.py             # B=8, cache 2048, 4 layers
    python benchmarks/decode_step.py --quick                         # tiny shapes, a smoke run

Each variant at the same small config (D, head width, layers as flagged; float32), a cache of
--cache positions with each row's first half filled, one jitted step per token with the cache
donated (as generation's token loop and the GPU check's decode stage run model.decode). Steps are
timed in interleaved rounds over the variants; per variant: ms per step (median [min-max] over
rounds) and its ratio to the Transformer's in the same round. Writes
benchmarks/results/decode_step.json (or --out), with the git commit of the code timed.
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
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.bench_common import interleaved_times, small_config, spread  # noqa: E402
from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer.model import build_model  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS, spec_from_config  # noqa: E402
from diff_transformer.paths import write_atomic  # noqa: E402
from diff_transformer.provenance import code_version  # noqa: E402


class Decoder:
  """One variant's donated per-token step as an interleaved_times call."""

  def __init__(self, variant: str, args):
    config = small_config(variant, seq_len=args.cache, batch=args.batch, d_model=args.d_model,
                          head_dim=args.head_dim, layers=args.layers)
    model = build_model(spec_from_config(config.model), nnx.Rngs(0))
    graphdef, self.state = nnx.split(model)
    self.cache = model.init_cache(args.batch, args.cache)
    self.cache.lengths = jnp.full((args.batch,), args.cache // 2, jnp.int32)
    self.token = jnp.zeros((args.batch,), jnp.int32)

    def step(state, token_B, cache):
      logits, cache = nnx.merge(graphdef, state).decode(token_B[:, None], cache)
      return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    self.step = jax.jit(step, donate_argnums=2)

  def __call__(self):
    self.token, self.cache = self.step(self.state, self.token, self.cache)
    return self.token


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--cache", type=int, default=2048, help="cache positions (half filled)")
  p.add_argument("--d_model", type=int, default=256)
  p.add_argument("--head_dim", type=int, default=32)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=10, help="steps per variant per round")
  p.add_argument("--quick", action="store_true")
  p.add_argument("--out", type=out_file,
                 default=str(Path(__file__).parent / "results" / "decode_step.json"))
  args = p.parse_args()
  if args.quick:
    args.batch, args.cache, args.d_model, args.layers, args.rounds, args.steps = 2, 64, 64, 2, 2, 2
  start = time.time()
  calls = {v: Decoder(v, args) for v in PAPER_VARIANTS}
  times = interleaved_times(calls, args.rounds, inner=args.steps)
  base = times["transformer"]
  results = [dict(variant=v, ms_per_step=spread([1e3 * t for t in ts]),
                  vs_transformer=spread([b / t for t, b in zip(ts, base)]))
             for v, ts in times.items()]
  for r in results:
    print(f"{r['variant']:12s} {r['ms_per_step']['median']:8.2f} ms/step, speed "
          f"{r['vs_transformer']['median']:.3f} of the Transformer's", flush=True)
  device = jax.devices()[0]
  record = dict(device=f"{device.platform}:{device.device_kind}", host=platform.node(),
                cpu_count=os.cpu_count(), code=code_version(),
                args={k: v for k, v in vars(args).items() if k != "out"},
                seconds=round(time.time() - start, 1), results=results,
                note="ratio vs_transformer: the Transformer's step time over this variant's "
                     "(above 1: faster), per round")
  write_atomic(Path(args.out), json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
  main()
