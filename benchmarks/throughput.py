"""The papers' Table 7: tokens/s of forward and forward+backward for each variant against the
parameter-matched Transformer, at two sequence lengths, plus MFU. Prints a table, writes JSON.

    python benchmarks/throughput.py                                  # CPU: default-size models, T=512/1024
    python benchmarks/throughput.py --size=3b --seq_lens=2048,4096 --batch=1 --dtype=bfloat16  # accelerator

On CPU the sequence lengths are scaled down from the paper's 2K/4K; MFU is against the nominal
CPU peak in training/metrics.py (a measured f32 matmul rate, not a vendor figure).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from diff_transformer.model import build_model  # noqa: E402
from diff_transformer.model.spec import ModelSpec  # noqa: E402
from diff_transformer.params import count  # noqa: E402
from diff_transformer.training.metrics import (attention_flops_per_token, matmul_params,  # noqa: E402
                                               peak_tflops_per_device, train_flops_per_token)

VARIANTS = ("transformer", "diff", "shared_diff", "diff_v2")


def spec_for(variant: str, size: str, dtype: str, kernel: str, seq: int) -> ModelSpec:
  if size == "default":
    from configs import default
    m = default.get_config().model
  else:
    from configs import scaling
    m = scaling.get_config(f"{variant}-{size}").model
  spec = ModelSpec.from_config(m)
  if size == "default":
    heads = {"transformer": 8, "diff_v2": 8, "shared_diff": 4, "diff": 4}[variant]
    spec = ModelSpec(**{**spec.__dict__, "variant": variant, "num_heads": heads,
                        "rank": 16 if variant == "shared_diff" else 0})
  return ModelSpec(**{**spec.__dict__, "dtype": dtype, "kernel": kernel, "max_seq_len": seq})


def time_fn(fn, *args, iters: int) -> float:
  jax.block_until_ready(fn(*args))  # compile + warm up
  start = time.perf_counter()
  for _ in range(iters):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / iters


def measure(spec: ModelSpec, batch: int, seq: int, iters: int) -> dict:
  model = build_model(spec, nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  tokens = jax.random.randint(jax.random.key(0), (batch, seq + 1), 0, spec.vocab_size)

  def loss(state, tokens):
    logits = nnx.merge(graphdef, state)(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t[:, :-1]))
  both = jax.jit(jax.value_and_grad(loss))
  fwd_s, both_s = time_fn(forward, state, tokens, iters=iters), time_fn(both, state, tokens, iters=iters)
  n_tok = batch * seq
  peak = peak_tflops_per_device() * jax.device_count() * 1e12
  fwd_flops = 2.0 * matmul_params(spec) + attention_flops_per_token(spec, seq)
  return dict(params=count(spec)["params"], forward_tokens_per_s=n_tok / fwd_s,
              train_tokens_per_s=n_tok / both_s,
              forward_mfu=fwd_flops * n_tok / fwd_s / peak,
              train_mfu=train_flops_per_token(spec, seq) * n_tok / both_s / peak)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", default="default", help="'default' (CPU) or a scaling size: 830m, 3b, ...")
  p.add_argument("--seq_lens", default="512,1024")
  p.add_argument("--batch", type=int, default=4)
  p.add_argument("--iters", type=int, default=5)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--kernel", default="xla")
  p.add_argument("--out", default="benchmarks/results/throughput.json")
  args = p.parse_args()
  rows = []
  for seq in map(int, args.seq_lens.split(",")):
    base = None
    for variant in VARIANTS:
      r = measure(spec_for(variant, args.size, args.dtype, args.kernel, seq), args.batch, seq, args.iters)
      base = base or r
      r.update(variant=variant, seq_len=seq,
               forward_vs_transformer=r["forward_tokens_per_s"] / base["forward_tokens_per_s"] - 1,
               train_vs_transformer=r["train_tokens_per_s"] / base["train_tokens_per_s"] - 1)
      rows.append(r)
      print(f"| {variant:<12} | T={seq:<5} | {r['params'] / 1e6:8.2f}M | "
            f"fwd {r['forward_tokens_per_s']:9.0f} tok/s ({100 * r['forward_vs_transformer']:+5.1f}%) | "
            f"fwd+bwd {r['train_tokens_per_s']:9.0f} tok/s ({100 * r['train_vs_transformer']:+5.1f}%) | "
            f"MFU {100 * r['train_mfu']:.1f}% |", flush=True)
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  meta = dict(device=jax.devices()[0].device_kind, devices=jax.device_count(), size=args.size,
              batch=args.batch, dtype=args.dtype, kernel=args.kernel)
  with open(args.out, "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
  main()
