"""Time and memory of the attention kernels: reference / xla / pallas, per variant and length.

Each variant's kernel inputs come from its own projection (bench_common.random_kernel_inputs).
CPU part (this machine): forward wall time (median of `--repeats` interleaved rounds after a
warm-up: the paths of one cell alternate) and the
compiled temp-buffer size (XLA memory_analysis) of forward and forward+backward. Pallas on CPU
runs in INTERPRET mode (a loop over grid steps): its times say nothing about TPU/GPU speed.
Lengths are capped per path (`--max-dense`, `--max-pallas-cpu`); skipped cells are recorded.

TPU part (needs libtpu): AOT compile for one v5e chip (bf16) of xla vs pallas forward and
forward+backward up to long sequences; per-chip temp memory shows xla's T^2 logits vs pallas'
O(T) residuals. Programs that do not fit 16 GiB HBM are recorded with the compiler's error.

  JAX_PLATFORMS=cpu python benchmarks/attention_kernels.py   # writes results/attention_kernels.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

# AOT only: libtpu's lockfile would refuse a second process (e.g. a parallel AOT run).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer.aot import topology_devices  # noqa: E402
from diff_transformer.errors import first_line  # noqa: E402
from diff_transformer.kernels import reference, xla  # noqa: E402
from diff_transformer.kernels.pallas import attention as pallas_attention  # noqa: E402

from benchmarks.bench_common import (fwd_and_bwd, interleaved_times, kernel_spec,  # noqa: E402
                          random_kernel_inputs, temp_bytes)

# Shared DIFF's kernel inputs are DIFF V1's, so its rows would repeat them.
VARIANTS = ("transformer", "diff", "diff_v2")
MIB = 2**20


def temp_mib(fn, xs, platforms=None) -> float | None:
  """The compiled program's temporaries in MiB, rounded to 0.1; None where the backend does not
  report them."""
  lowered = jax.jit(fn).trace(*xs).lower(**({"lowering_platforms": platforms} if platforms else {}))
  size = temp_bytes(lowered.compile())
  return None if size is None else round(size / MIB, 1)


def cpu_rows(lengths, caps: dict, repeats: int) -> list[dict]:
  """Per (variant, T): every path that fits its cap, timed interleaved (median of `repeats`)."""
  paths: dict[str, Callable[..., Any]] = {
      "reference": reference.attention, "xla": xla.attention,
      "pallas": lambda *a, **k: pallas_attention(*a, **k)}  # CPU default: interpret mode
  rows = []
  for variant in VARIANTS:
    for T in lengths:
      args = random_kernel_inputs(kernel_spec(variant), T)
      cells, calls = {}, {}
      for path, fn in paths.items():
        row = cells[path] = dict(variant=variant, T=T, path=path,
                                 mode="interpret" if path == "pallas" else "xla")
        if T > caps[path]:
          row["skipped"] = f"T > cap {caps[path]} for this path on CPU"
          continue
        fwd, bwd, xs = fwd_and_bwd(fn, args, causal=True)
        jitted = jax.jit(fwd)
        calls[path] = lambda jitted=jitted, xs=xs: jitted(*xs)
        row.update(fwd_temp_mib=temp_mib(fwd, xs), fwd_bwd_temp_mib=temp_mib(bwd, xs))
      for path, times in interleaved_times(calls, rounds=repeats).items():
        cells[path]["fwd_ms"] = 1e3 * float(np.median(times))
      for row in cells.values():
        rows.append(row)
        print(json.dumps(row), flush=True)
  return rows


def tpu_rows(lengths) -> list[dict]:
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  mesh = Mesh(np.array(topology_devices("v5e:2x2")[:1]), ("x",))
  paths = {"xla": xla.attention,
           "pallas": lambda *a, **k: pallas_attention(*a, backend="tpu", interpret=False, **k)}
  rows = []
  for variant in VARIANTS:
    for T in lengths:
      shaped = lambda a: None if a is None else jax.ShapeDtypeStruct(
          a.shape, a.dtype, sharding=NamedSharding(mesh, P()))
      spec = kernel_spec(variant, heads=8, kv_heads=2, d=128, dtype="bfloat16")
      args = [shaped(a) for a in jax.eval_shape(lambda: random_kernel_inputs(spec, T))]
      for path, fn in paths.items():
        row = dict(variant=variant, T=T, path=path, device="TPU v5e (1 chip, AOT)",
                   shape="B1 N8 K2 d128 bf16")
        fwd, bwd, xs = fwd_and_bwd(fn, args, causal=True)
        for name, f in (("fwd", fwd), ("fwd_bwd", bwd)):
          try:
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
              row[f"{name}_temp_mib"] = temp_mib(f, xs)
          except Exception as e:  # e.g. the program does not fit HBM
            row[f"{name}_error"] = f"{type(e).__name__}: {first_line(e)}"
        rows.append(row)
        print(json.dumps(row), flush=True)
  return rows


def _oom(error: str) -> str:
  """'... HLO temporaries (65.60G) exceeds ...' -> 'OOM (needs 65.60G)'."""
  found = re.search(r"temporaries \(([^)]+)\)", error)
  return f"OOM (needs {found.group(1)})" if found else "does not compile"


def markdown(cpu: list[dict], tpu: list[dict]) -> str:
  fmt = lambda x: "-" if x is None else f"{x:.1f}"
  lines = ["| variant | T | path | fwd ms (CPU) | fwd temp MiB | fwd+bwd temp MiB |",
           "|---|---|---|---|---|---|"]
  for r in cpu:
    path = r["path"] + (" (interpret)" if r["path"] == "pallas" else "")
    if "skipped" in r:
      lines.append(f"| {r['variant']} | {r['T']} | {path} | skipped | | |")
    else:
      lines.append(f"| {r['variant']} | {r['T']} | {path} | {fmt(r['fwd_ms'])} | "
                   f"{fmt(r['fwd_temp_mib'])} | {fmt(r['fwd_bwd_temp_mib'])} |")
  if tpu:
    lines += ["", "| variant | T | path | TPU v5e fwd temp MiB | fwd+bwd temp MiB |",
              "|---|---|---|---|---|"]
    for r in tpu:
      cell = lambda n: (fmt(r.get(f"{n}_temp_mib")) if f"{n}_error" not in r
                        else _oom(r[f"{n}_error"]))
      lines.append(f"| {r['variant']} | {r['T']} | {r['path']} | {cell('fwd')} | "
                   f"{cell('fwd_bwd')} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
  parser.add_argument("--tpu-lengths", default="2048,8192,32768")
  parser.add_argument("--max-dense", type=int, default=4096, help="CPU cap for reference/xla")
  parser.add_argument("--max-pallas-cpu", type=int, default=2048, help="CPU cap (interpret)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", type=out_file,
                      default=str(Path(__file__).parent / "results" / "attention_kernels.json"))
  opts = parser.parse_args()
  caps = {"reference": opts.max_dense, "xla": opts.max_dense, "pallas": opts.max_pallas_cpu}
  start = time.time()
  cpu = cpu_rows([int(t) for t in opts.lengths.split(",")], caps, opts.repeats)
  tpu = []
  if importlib.util.find_spec("libtpu") is not None:
    tpu = tpu_rows([int(t) for t in opts.tpu_lengths.split(",")])
  else:
    print("TPU AOT part skipped: libtpu not installed")
  result = {"jax": jax.__version__,
            "cpu_shape": "B1, 4 heads over 2 kv heads of d64, float32, causal (DIFF V1: 4 "
                         "differential heads, values 2d; DIFF V2: 8 query heads in pairs)",
            "cpu_devices": str(jax.devices()), "caps": caps, "cpu": cpu, "tpu_aot": tpu,
            "seconds": round(time.time() - start, 1),
            "notes": "pallas on CPU = Pallas interpret mode; temp = compiled temp buffers "
                     "(memory_analysis), not RSS."}
  Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
  Path(opts.out).write_text(json.dumps(result, indent=1))
  print(markdown(cpu, tpu))


if __name__ == "__main__":
  main()
