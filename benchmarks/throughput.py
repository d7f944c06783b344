"""Throughput (the papers' Table 7): tokens/s of each variant's train step and forward (eval)
step as a ratio to the parameter-matched Transformer, and MFU, at several sequence lengths.

  JAX_PLATFORMS=cpu python benchmarks/throughput.py            # T = 256, 512, 1024, 5 rounds
  JAX_PLATFORMS=cpu python benchmarks/throughput.py --quick    # T = 256, 512, 3 rounds
  python benchmarks/throughput.py --d_model 3072 --layers 28 --head_dim 128 --ffn_dim 8192 \
      --vocab 100288 --seq_lens 2048,4096 --batch 1        # the 3B rows, on an accelerator

Variants share D, depth, head width d and vocabulary; heads follow params.heads_for and the
SwiGLU width is matched to the Transformer's parameter count (params.matched_variant). All
variants are compiled first, then timed in turn (A B C D A B C D ...) over `--rounds` rounds, so
a change in the machine's load hits every variant alike; each round's ratio is the variant's
tokens/s over the Transformer's in the same round, reported as median and range over rounds.
MFU = model FLOPs (training/metrics.py) / the per-device peak (training/peak.py: measured and
cached on a host without a table entry); HFU counts the FLOPs the chosen kernel executes. The
load average is recorded per round. Writes benchmarks/results/throughput.json and
docs/results/throughput/ratio.png and regenerates the README block (tools/readme_tables.py);
with --out elsewhere, the JSON and the plot beside it only.
Full run 42 minutes on a shared 2-core CPU (load 2-9), --quick roughly a quarter.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diff_transformer import cli  # noqa: E402

cli.default_platform()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from diff_transformer import params as params_lib  # noqa: E402
from diff_transformer.config import base_config, validate  # noqa: E402
from diff_transformer.model.attention import VARIANTS  # noqa: E402
from diff_transformer.mesh import global_batch, make_mesh  # noqa: E402
from diff_transformer.training.metrics import (attention_flops_per_token,  # noqa: E402
                                               executed_flops_per_token, matmul_params,
                                               train_flops_per_token)
from diff_transformer.training.peak import peak_tflops_per_device  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

from benchmarks.bench_common import (Stepper, interleaved_times, spread,  # noqa: E402
                                     synthetic_batch)

OUT_JSON = ROOT / "benchmarks" / "results" / "throughput.json"
OUT_PLOT = ROOT / "docs" / "results" / "throughput" / "ratio.png"


def config_for(variant: str, args, seq_len: int):
  c = base_config()
  m = c.model
  m.d_model, m.num_layers, m.head_dim, m.ffn_dim = (args.d_model, args.layers, args.head_dim,
                                                    args.ffn_dim)  # variant, heads: matched below
  m.vocab_size, m.max_seq_len, m.kernel = args.vocab, seq_len, args.kernel
  c.data.seq_len, c.train.global_batch_size = seq_len, args.batch
  return validate(params_lib.matched_variant(c, variant, rank=args.rank))


class Bench:
  """One variant's compiled train and eval steps at one length, and its FLOP counts."""

  def __init__(self, config, args, seq_len: int):
    self.config, self.trainer = config, Trainer(config, make_mesh(config.mesh))
    self.state = self.trainer.init()
    self.batch = global_batch(self.trainer.mesh, synthetic_batch(args.batch, seq_len, args.vocab))
    start = time.perf_counter()
    self.state, metrics = self.trainer.train_step(self.state, self.batch)
    jax.block_until_ready((metrics, self.trainer.eval_step(self.state, self.batch)))
    self.compile_s = time.perf_counter() - start
    spec = self.trainer.spec
    self.tokens = args.batch * seq_len
    self.model_flops = train_flops_per_token(spec, seq_len) * self.tokens
    self.forward_flops = (2.0 * matmul_params(spec)
                          + attention_flops_per_token(spec, seq_len)) * self.tokens
    executed, self.kernel = executed_flops_per_token(spec, seq_len)
    self.executed_flops = executed * self.tokens
    self.params = params_lib.count(spec)["params"]


def measure_length(args, seq_len: int, peak_flops: float) -> list[dict]:
  benches = {}
  for variant in args.variants:
    benches[variant] = Bench(config_for(variant, args, seq_len), args, seq_len)
    print(f"  compiled {variant} at T={seq_len} ({benches[variant].compile_s:.0f} s)", flush=True)
  states = {v: b.state for v, b in benches.items()}
  calls: dict[tuple[str, str], Callable[..., Any]] = {
      ("train", v): Stepper(b.trainer.train_step, b.batch, states, v) for v, b in benches.items()}
  for v, b in benches.items():
    calls[("forward", v)] = lambda v=v, b=b: b.trainer.eval_step(states[v], b.batch)
  loads = []

  def after_round(r: int) -> None:
    loads.append(os.getloadavg()[0])
    print(f"  T={seq_len} round {r + 1}/{args.rounds} (load {loads[-1]:.1f})", flush=True)

  # interleaved: every variant's train steps, then their forward steps, round after round
  times = interleaved_times(calls, args.rounds, inner=args.steps, after_round=after_round)
  train_s = {v: times[("train", v)] for v in benches}
  forward_s = {v: times[("forward", v)] for v in benches}
  base = "transformer"
  rows = []
  for variant, b in benches.items():
    train_ratio = [t_base / t for t, t_base in zip(train_s[variant], train_s[base])]
    fwd_ratio = [t_base / t for t, t_base in zip(forward_s[variant], forward_s[base])]
    step_s, fwd_s = float(np.median(train_s[variant])), float(np.median(forward_s[variant]))
    rows.append(dict(
        variant=variant, seq_len=seq_len, params=b.params, kernel=b.kernel,
        num_heads=b.config.model.num_heads, ffn_dim=b.config.model.ffn_dim,
        train_step_s=spread(train_s[variant]), forward_step_s=spread(forward_s[variant]),
        tokens_per_s=b.tokens / step_s, forward_tokens_per_s=b.tokens / fwd_s,
        train_ratio=spread(train_ratio), forward_ratio=spread(fwd_ratio),
        mfu=b.model_flops / step_s / peak_flops, hfu=b.executed_flops / step_s / peak_flops,
        forward_mfu=b.forward_flops / fwd_s / peak_flops,
        model_flops_per_step=b.model_flops, executed_flops_per_step=b.executed_flops,
        compile_s=b.compile_s, load_average_per_round=loads))
  return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for ax, key, name in ((axes[0], "train_ratio", "train step"), (axes[1], "forward_ratio",
                                                                 "forward (eval step)")):
    for variant in dict.fromkeys(r["variant"] for r in rows):
      rs = [r for r in rows if r["variant"] == variant]
      T = [r["seq_len"] for r in rs]
      med = np.array([r[key]["median"] for r in rs])
      err = np.array([[m - r[key]["min"] for m, r in zip(med, rs)],
                      [r[key]["max"] - m for m, r in zip(med, rs)]])
      ax.errorbar(T, med, yerr=err, marker="o", capsize=3, label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length T")
    ax.set_title(name)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("tokens/s / Transformer's (median, range over rounds)")
  axes[1].legend()
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--d_model", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--head_dim", type=int, default=32)
  p.add_argument("--ffn_dim", type=int, default=704, help="the Transformer's; others matched")
  p.add_argument("--rank", type=int, default=16, help="Shared DIFF's low rank")
  p.add_argument("--vocab", type=int, default=8192)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq_lens", default="256,512,1024")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--steps", type=int, default=3, help="timed steps per variant and round")
  p.add_argument("--kernel", default="auto")
  p.add_argument("--peak_tflops", type=float, default=0.0, help="per device; 0 = measured")
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--quick", action="store_true", help="T = 256,512, 3 rounds, 2 steps")
  p.add_argument("--out", type=cli.out_file, default=str(OUT_JSON))
  p.add_argument("--plot", default="", help="default: the committed figure with the default "
                 "--out, else beside --out (a run told where to write writes nowhere else)")
  p.add_argument("--no_readme", action="store_true")
  args = p.parse_args()
  if args.quick:
    args.seq_lens, args.rounds, args.steps = "256,512", 3, 2
  args.plot = args.plot or str(OUT_PLOT if Path(args.out) == OUT_JSON
                               else Path(args.out).with_suffix(".png"))
  args.variants = args.variants.split(",")
  if args.variants[0] != "transformer" or set(args.variants) - set(VARIANTS):
    p.error(f"--variants: the first must be transformer (the baseline), then any of {VARIANTS}")
  started, load_start = time.time(), os.getloadavg()
  # Measured afresh in this run (same machine, same load) unless --peak_tflops is given.
  peak_tflops, peak_source = peak_tflops_per_device(args.peak_tflops, "float32", recalibrate=True)
  peak_flops = peak_tflops * 1e12 * jax.device_count()
  print(f"peak {peak_tflops:.3f} TFLOP/s per device ({peak_source})", flush=True)
  rows = []
  for seq_len in map(int, args.seq_lens.split(",")):
    rows += measure_length(args, seq_len, peak_flops)
    out = write_json(args, rows, peak_tflops, peak_source, load_start, started)  # kept if cut short
  plot(rows, Path(args.plot), f"{out['device']} x{out['devices']}, D={args.d_model}, "
       f"{args.layers} layers, batch {args.batch}, {args.rounds} rounds; load "
       f"{load_start[0]:.1f}-{out['load_average_end'][0]:.1f} on {os.cpu_count()} cores")
  print(f"\n{'variant':<12}{'T':>6}{'train ratio':>22}{'forward ratio':>22}{'MFU':>7}{'HFU':>7}")
  fmt = lambda s: f"{s['median']:.3f} [{s['min']:.2f}-{s['max']:.2f}]"
  for r in rows:
    print(f"{r['variant']:<12}{r['seq_len']:>6}{fmt(r['train_ratio']):>22}"
          f"{fmt(r['forward_ratio']):>22}{100 * r['mfu']:>6.1f}%{100 * r['hfu']:>6.1f}%")
  print(f"\nwrote {args.out} and {args.plot} in {out['seconds']} s")
  if not args.no_readme and Path(args.out) == OUT_JSON:
    sys.path.insert(0, str(ROOT / "tools"))
    import readme_tables
    readme = Path(readme_tables.README)
    readme.write_text(readme_tables.render(readme.read_text()))
    print("README.md throughput block regenerated")


def _shown(path: str) -> str:
  """A path as a committed result may name it: within the checkout, or only its file name."""
  full = Path(path).resolve()
  return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else f"<elsewhere>/{full.name}"


def write_json(args, rows, peak_tflops, peak_source, load_start, started) -> dict:
  device = jax.devices()[0]
  out = dict(device=f"{device.platform}:{device.device_kind}", devices=jax.device_count(),
             host=platform.node(), cpu_count=os.cpu_count(), processor=platform.processor(),
             args=dict(vars(args), out=_shown(args.out), plot=_shown(args.plot)),
             peak_tflops_per_device=peak_tflops, peak_source=peak_source,
             load_average_start=load_start, load_average_end=os.getloadavg(),
             seconds=round(time.time() - started), results=rows)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
  return out


if __name__ == "__main__":
  main()
