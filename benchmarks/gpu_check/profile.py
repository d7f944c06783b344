"""The profile stage: where a train step's time goes, a jax.profiler trace of a few steps per
variant with its device kernels summed by name and by class, the "other" class (XLA's own
fusions) listed, and each step's optimised HLO saved beside the record."""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jax

from benchmarks.bench_common import synthetic_batch
from benchmarks.gpu_check.common import (Deadline, Record, StageRun, compile_all, error_text,
                                         model_config, save_hlo)
from diff_transformer.mesh import global_batch, make_mesh
from diff_transformer.model.attention import PAPER_VARIANTS
from diff_transformer.training.metrics import executed_flops_per_token
from diff_transformer.training.step import Trainer

# Device kernels by what they do, matched on the kernel's name (ours are named by
# pallas.kernel_name; cuDNN's fused attention carries "sdpa"/"fmha", cuBLAS/CUTLASS GEMMs their
# library's names). The rest is XLA's own fusions: elementwise work, norms, reductions, copies.
KERNEL_CLASSES = (("attention", re.compile(r"diff_attention|sdpa|fmha|flash|attention", re.I)),
                  ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|wgmma|matmul|dot", re.I)),
                  ("memory", re.compile(r"memcpy|memset|copy|transpose", re.I)))


def stage_profile(stage: StageRun) -> None:
  """Where a train step's time goes: a jax.profiler trace of a few steps per variant (kernel=auto,
  the train stage's first length), its device kernels summed by name and by class."""
  deadline = Deadline(stage.seconds - 10)
  tokens, T = (64, 32) if stage.cpu else (16384, stage.options.lengths_or((2048,))[0])
  batch, steps = max(1, tokens // T), 3
  rec = Record(stage, T=T, batch=batch, layers=stage.options.train_layers, steps=steps,
               classes={name: rx.pattern for name, rx in KERNEL_CLASSES} | {"other": "the rest"})
  runs: dict[str, dict[str, Any]] = {}
  lowered: dict[str, jax.stages.Lowered] = {}
  for variant in PAPER_VARIANTS:
    config = model_config(stage, variant, seq_len=T, batch=batch, kernel="auto")
    trainer = Trainer(config, make_mesh(config.mesh))
    data = global_batch(trainer.mesh, synthetic_batch(batch, T, config.model.vocab_size))
    runs[variant] = dict(trainer=trainer, data=data,
                         runs=executed_flops_per_token(trainer.spec, T)[1])
    lowered[variant] = trainer.lower_train_step(data)
  start = time.time()
  compiled = compile_all(lowered, 16)
  rec.set(compile_s=round(time.time() - start, 1),
          hlo={v: save_hlo(stage, f"profile_hlo_{v}", c) for v, c in compiled.items()
               if not isinstance(c, BaseException)})
  for variant, r in runs.items():
    if deadline.left() < 0:
      rec.add(dict(variant=variant, skipped="stage time cap"))
      continue
    if isinstance(compiled[variant], BaseException):
      rec.add(dict(variant=variant, error=error_text(compiled[variant])))
      continue
    folder = Path(tempfile.mkdtemp(prefix="gpu_check_profile_"))
    try:
      state = r["trainer"].init()
      state, m = compiled[variant](state, r["data"])  # warm-up
      jax.block_until_ready(m)
      with jax.profiler.trace(str(folder)):
        t0 = time.perf_counter()
        for _ in range(steps):
          state, m = compiled[variant](state, r["data"])
        jax.block_until_ready(m)
        step_s = (time.perf_counter() - t0) / steps
      del state
      rec.add(dict(variant=variant, runs=r["runs"], step_ms=1e3 * step_s,
                   **kernel_times(folder, steps)))
    except Exception as e:  # recorded
      rec.add(dict(variant=variant, error=error_text(e)))
    finally:
      shutil.rmtree(folder, ignore_errors=True)
  base = next((c for c in rec.data["cells"] if c["variant"] == "transformer" and "ms" in c), None)
  if base is not None:
    rec.set(extra_ms_vs_transformer={
        c["variant"]: {k: round(c["ms"].get(k, 0.0) - base["ms"].get(k, 0.0), 2)
                       for k in {*c["ms"], *base["ms"]}}
        for c in rec.data["cells"] if "ms" in c and c is not base})


def kernel_times(folder: Path, steps: int, top: int = 25) -> dict:
  """Per-step milliseconds of the trace's device kernels: by class and the `top` kernels by name.
  On a GPU the kernels are the device plane's stream lines (its derived "XLA Ops"/"XLA Modules"
  lines would count them twice); on a CPU, the host's events that carry an hlo_op (there a
  while loop's event holds its body's: the CPU figures exercise this code, they time nothing)."""
  from jax.profiler import ProfileData
  trace = ProfileData.from_file(str(next(folder.rglob("*.xplane.pb"))))
  by_name: dict = {}
  for plane in trace.planes:
    device = plane.name.startswith(("/device:GPU", "/device:TPU"))
    for line in plane.lines:
      if device and not line.name.startswith("Stream"):
        continue
      for event in line.events:
        stats = dict(event.stats)
        if not device and "hlo_op" not in stats:
          continue
        slot = by_name.setdefault(event.name, dict(ns=0.0, calls=0, hlo_op=stats.get("hlo_op")))
        slot["ns"] += event.duration_ns
        slot["calls"] += 1
  ms: dict = {}
  for name, slot in by_name.items():
    slot["kind"] = next((k for k, rx in KERNEL_CLASSES if rx.search(name)), "other")
    ms[slot["kind"]] = ms.get(slot["kind"], 0.0) + slot["ns"] / 1e6 / steps
  ranked = sorted(by_name.items(), key=lambda kv: -kv[1]["ns"])
  row = lambda n, s: dict(name=n[:160], hlo_op=s["hlo_op"], ms=round(s["ns"] / 1e6 / steps, 3),
                          calls=s["calls"] / steps)
  other = [(n, s) for n, s in ranked if s["kind"] == "other"]
  return dict(busy_ms=round(sum(ms.values()), 3), ms={k: round(v, 3) for k, v in ms.items()},
              kernels=[row(n, s) for n, s in ranked[:top]],
              other_kernels=[row(n, s) for n, s in other[:2 * top]])
