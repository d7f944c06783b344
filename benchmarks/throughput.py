"""Throughput (the papers' Table 7): tokens/s of the forward pass and of the train step, and MFU,
of each variant against the parameter-matched Transformer, at one or more sequence lengths.

  JAX_PLATFORMS=cpu python benchmarks/throughput.py [--seq_lens 256,512] [--steps 5] ...
  python benchmarks/throughput.py --d_model 3072 --layers 28 --head_dim 128 --ffn_dim 8192 \
      --vocab 100288 --seq_lens 2048,4096 --batch 1        # the 3B rows, on an accelerator

Every variant has the same d_model, depth, head width d and vocabulary; the Transformer has 2h
heads of d, DIFF/Shared DIFF h = D / 2d differential heads (same attention parameters), DIFF V2
h heads with 2h query heads. The SwiGLU width of each non-baseline variant is adjusted so its
parameter count matches the Transformer's (within one FFN column per layer). Times a jitted
train step (forward + backward + AdamW) and the jitted forward (eval step: forward + loss) on
synthetic batches after warm-up steps; MFU uses the same FLOP count and peak table as training
(metrics.py). On CPU the paper's 2K/4K lengths are scaled down. Writes
benchmarks/results/throughput.json.
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
import numpy as np  # noqa: E402

from diff_transformer import params as params_lib  # noqa: E402
from diff_transformer.config import base_config, validate  # noqa: E402
from diff_transformer.model.spec import ModelSpec  # noqa: E402
from diff_transformer.training.mesh import global_batch, make_mesh  # noqa: E402
from diff_transformer.training.metrics import (attention_flops_per_token,  # noqa: E402
                                               matmul_params, peak_tflops_per_device,
                                               train_flops_per_token)
from diff_transformer.training.step import Trainer  # noqa: E402

VARIANTS = ("transformer", "diff", "shared_diff", "diff_v2")


def variant_config(variant: str, args, ffn_dim: int):
  c = base_config()
  m = c.model
  D, d = args.d_model, args.head_dim
  m.variant, m.d_model, m.num_layers, m.head_dim, m.ffn_dim = variant, D, args.layers, d, ffn_dim
  m.vocab_size, m.max_seq_len = args.vocab, args.seq_len
  m.num_heads = params_lib.heads_for(variant, D, d)
  m.rank = args.rank
  c.data.seq_len = args.seq_len
  c.train.global_batch_size = args.batch
  return validate(c)


def param_count(config) -> int:
  return params_lib.count(ModelSpec.from_config(config.model))["params"]


def matched_config(variant: str, args, target: int):
  """The variant with the SwiGLU width that brings its parameter count closest to `target`."""
  return validate(params_lib.match_ffn(variant_config(variant, args, args.ffn_dim), target))


def synthetic_batch(args, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  B, T = args.batch, args.seq_len
  tokens = rng.integers(0, args.vocab, (B, T + 1), dtype=np.int32)
  return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=np.ones((B, T), np.int32),
              positions=np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy(),
              weights=np.ones((B, T), np.float32))


def measure(config, args) -> dict:
  mesh = make_mesh(config.mesh)
  trainer = Trainer(config, mesh)
  state = trainer.init()
  batch = global_batch(mesh, synthetic_batch(args))
  start = time.perf_counter()
  for _ in range(2):  # compile + one warm step
    state, metrics = trainer.train_step(state, batch)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - start
  times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    state, metrics = trainer.train_step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  jax.block_until_ready(trainer.eval_step(state, batch))  # compile the forward
  fwd_times = []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    jax.block_until_ready(trainer.eval_step(state, batch))
    fwd_times.append(time.perf_counter() - t0)
  fwd_s = float(np.median(fwd_times))
  tokens = args.batch * args.seq_len
  flops = train_flops_per_token(trainer.spec, args.seq_len) * tokens
  fwd_flops = (2.0 * matmul_params(trainer.spec) + attention_flops_per_token(
      trainer.spec, args.seq_len)) * tokens
  peak = peak_tflops_per_device(args.peak_tflops) * 1e12 * jax.device_count()
  return dict(variant=config.model.variant, seq_len=args.seq_len, params=param_count(config),
              num_heads=config.model.num_heads, ffn_dim=config.model.ffn_dim,
              step_s=step_s, tokens_per_s=tokens / step_s, tflops_per_s=flops / step_s / 1e12,
              mfu=flops / step_s / peak, forward_tokens_per_s=tokens / fwd_s,
              forward_mfu=fwd_flops / fwd_s / peak, compile_s=compile_s,
              loss=float(metrics["loss"]))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--d_model", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--head_dim", type=int, default=32)
  p.add_argument("--ffn_dim", type=int, default=704)
  p.add_argument("--rank", type=int, default=16)
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--seq_lens", default="256,512", help="comma list; the paper uses 2048,4096")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--peak_tflops", type=float, default=0.0)
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "throughput.json"))
  args = p.parse_args()
  rows = []
  for seq_len in map(int, args.seq_lens.split(",")):
    args.seq_len = seq_len
    target = param_count(variant_config("transformer", args, args.ffn_dim))
    for variant in args.variants.split(","):
      config = matched_config(variant, args, target) if variant != "transformer" else (
          variant_config(variant, args, args.ffn_dim))
      rows.append(measure(config, args))
      print(f"  measured {variant} at T={seq_len}", flush=True)
  print(f"\n{'variant':<12}{'T':>6}{'params':>12}{'ffn':>6}{'fwd tok/s':>11}{'vs base':>9}"
        f"{'train tok/s':>12}{'vs base':>9}{'MFU':>8}")
  for r in rows:
    base = next(b for b in rows if b["variant"] == "transformer" and b["seq_len"] == r["seq_len"])
    r["relative_tokens_per_s"] = r["tokens_per_s"] / base["tokens_per_s"]
    r["relative_forward_tokens_per_s"] = r["forward_tokens_per_s"] / base["forward_tokens_per_s"]
    print(f"{r['variant']:<12}{r['seq_len']:>6}{r['params']:>12,}{r['ffn_dim']:>6}"
          f"{r['forward_tokens_per_s']:>11.0f}{100 * (r['relative_forward_tokens_per_s'] - 1):>+8.1f}%"
          f"{r['tokens_per_s']:>12.0f}{100 * (r['relative_tokens_per_s'] - 1):>+8.1f}%"
          f"{100 * r['mfu']:>7.1f}%")
  device = jax.devices()[0]
  out = dict(device=f"{device.platform}:{device.device_kind}", devices=jax.device_count(),
             host=platform.node(), cpu_count=os.cpu_count(), args={k: v for k, v in vars(args).items() if k != 'seq_len'},
             peak_tflops_per_device=peak_tflops_per_device(args.peak_tflops),
             note="median step time after 2 warm-up steps; the host may be shared, so absolute "
                  "numbers vary run to run; compare variants within one run",
             results=rows)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  main()
