"""The kernels stage: forward+backward time of each attention path at the preset's head shapes,
interleaved per length, with the compiled temp memory and the FLOPs each path executes."""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_common import (interleaved_times, paper_config, small_config, spread,
                                     temp_bytes)
from benchmarks.gpu_check.common import (Deadline, Record, StageRun, compile_all, cudnn_refused,
                                         error_text, lower_or_error)
from benchmarks.gpu_check.correctness import fwd_bwd, out_struct, paths, signature
from diff_transformer.kernels import executed_flops
from diff_transformer.model.attention import PAPER_VARIANTS, spec_from_config, variant_class
from diff_transformer.model.attention import kernel_inputs
from diff_transformer.kernels.oracle import ARG_NAMES

# The fused kernel at its defaults, and with the other warp count (api.py picks 8 for values
# wider than 128 after padding, else 4).
PALLAS_CONFIGS = {"pallas": {}, "pallas_w4": dict(num_warps=4), "pallas_w8": dict(num_warps=8)}


def stage_kernels(stage: StageRun) -> None:
  """fwd+bwd time of each path at the 830M head shapes, interleaved per length, with the
  compiled temp memory (linear in T for the fused paths, quadratic for 'xla'). --masks: a
  'document' call gets segment ids as the train step does on text (rows of packed documents,
  about 3 per row), a 'causal' call none (causal rows end to end, the exact unpacked call)."""
  cpu, seconds, opts = stage.cpu, stage.seconds, stage.options
  deadline = Deadline(seconds - 10)
  tokens, lengths = (128, (64,)) if cpu else (16384, opts.lengths_or((2048, 4096, 8192)))
  rounds, inner = (2, 1) if cpu else (7, 3)
  kernels = paths(stage, None if cpu else PALLAS_CONFIGS)
  kernels.pop("reference", None)
  kernels.pop("cudnn_packed_as_is", None)  # timed only once the correctness stage passes it
  masks = opts.masks_or(("document",))
  rec = Record(stage, tokens_per_call=tokens, lengths=lengths, masks=masks, rounds=rounds,
               inner=inner, paths=list(kernels), dtype="bfloat16",
               shapes_from=f"configs/scaling.py <variant>-{opts.size}" if not cpu
               else "small_config")
  cells, lowered = _cells(stage, kernels, tokens, lengths, masks)
  compiled, compile_s = {}, {}
  for T in lengths:  # compiled length by length, so a stage cut short keeps the short lengths
    at_T = [c for c in cells if c["T"] == T]
    start = time.time()
    if deadline.left() > 0:
      compiled.update(compile_all({c["key"]: lowered[c["key"]] for c in at_T
                                   if "skipped" not in c}, 16))
    compile_s[T] = round(time.time() - start, 1)
    rec.set(compile_s=compile_s)
    if any(c["key"] not in compiled for c in at_T if "skipped" not in c):
      for c in at_T:
        rec.add(dict(_public(c), skipped="stage time cap"))
      continue
    calls = {}
    for i, c in enumerate(at_T):
      if "skipped" in c:
        continue
      program = compiled[c["key"]]
      if isinstance(program, BaseException):
        c["error"] = error_text(program)
        continue
      c["temp_bytes"] = temp_bytes(program)
      structs, do = c["structs"]
      keys = jax.random.split(jax.random.key(i), len(structs) + 1)
      xs = [jax.random.normal(k, s.shape, s.dtype) if s.shape else jnp.float32(0.5)
            for k, s in zip(keys, structs)]
      xs = [jax.nn.sigmoid(x) if n == "lam" and x.ndim else x for n, x in zip(c["shapes"], xs)]
      dy = jax.random.normal(keys[-1], do.shape, do.dtype)
      starts = np.random.default_rng(i).random((c["batch"], T)) < 3.0 / T
      seg = jnp.asarray(np.cumsum(starts, axis=1), jnp.int32) if c["mask"] == "document" else None
      calls[i] = functools.partial(program, xs, dy, seg)
    if deadline.left() < 0:
      for c in at_T:
        rec.add(dict(_public(c), skipped="stage time cap"))
      continue
    for i in list(calls):  # each call alone first: a failing path costs only its own cell
      try:
        jax.block_until_ready(calls[i]())
      except Exception as e:  # e.g. a refusal or out of memory, recorded per cell
        at_T[i]["error"] = error_text(e)
        del calls[i]
    try:
      times = interleaved_times(calls, rounds, inner, deadline, warm=False)
    except Exception as e:  # a failure only in company (memory): every cell of this length says so
      times = {}
      for c in at_T:
        c.setdefault("error", error_text(e))
    for i, c in enumerate(at_T):
      if i in times:
        c["seconds"] = spread(times[i])
        c["model_tflops"] = c["model_flops"] / c["seconds"]["median"] / 1e12
      rec.add(_public(c))
    calls.clear()
    rec.set(summary=kernel_summary(rec.data["cells"]))


def _cells(stage: StageRun, kernels: dict, tokens: int, lengths: tuple[int, ...],
           masks: tuple[str, ...]) -> tuple[list, dict]:
  """(one cell per length, mask, variant and path, {key: lowered program}): every call lowered
  with the train step's arguments (a segment-id struct where the mask is 'document')."""
  cells, lowered = [], {}
  for T, mask in ((T, mask) for T in lengths for mask in masks):
    batch = max(1, tokens // T)
    for variant in stage.options.variants:
      if stage.cpu:
        spec = spec_from_config(small_config(variant, seq_len=T, batch=batch,
                                                  dtype="bfloat16").model)
      else:
        spec = spec_from_config(paper_config(variant, seq_len=T, batch=batch, layers=1,
                                                  size=stage.options.size).model)
      p = kernel_inputs(spec, T, batch)
      names = [n for n in ARG_NAMES if getattr(p, n) is not None]
      structs = [getattr(p, n) for n in names]
      do = jax.ShapeDtypeStruct(out_struct(p), p.q1.dtype)
      model_flops = 3 * 0.5 * variant_class(variant).attention_flops(spec, T) * batch * T
      seg = jax.ShapeDtypeStruct((batch, T), jnp.int32) if mask == "document" else None
      for path, kernel in kernels.items():
        key = (path, signature(names, structs, seg))
        refused = cudnn_refused(path, p)
        if refused:
          cells.append(dict(variant=variant, T=T, mask=mask, batch=batch, path=path, key=key,
                            skipped=f"cuDNN refuses {refused}"))
          continue
        if key not in lowered:
          lowered[key] = lower_or_error(fwd_bwd(kernel, names), structs, do, seg)
        base_path = path.split("_")[0]  # pallas_w4 counts as pallas, cudnn_padded as cudnn
        exact = {"cudnn_padded": False, "cudnn_two_calls": True,
                 "cudnn_exact_layout": True}.get(path)
        cells.append(dict(variant=variant, T=T, mask=mask, batch=batch, path=path, key=key,
                          shapes={n: list(s.shape) for n, s in zip(names, structs)},
                          model_flops=model_flops,
                          executed_flops=executed_flops(base_path, p.q1, p.k1, p.v, p.q2,
                                                        backward=True, cudnn_exact=exact,
                                                        packed=mask == "document"),
                          structs=(structs, do)))
  return cells, lowered


def _public(cell: dict) -> dict:
  return {k: v for k, v in cell.items() if k not in ("key", "structs")}


def kernel_summary(cells: list[dict]) -> list[dict]:
  """Per length, mask and variant: the fastest path, and its model FLOP rate over the
  Transformer's cuDNN rate at that length and mask (the goal: at least 0.9)."""
  rows = []
  for T, mask in sorted({(c["T"], c.get("mask", "document")) for c in cells}):
    timed = [c for c in cells
             if (c["T"], c.get("mask", "document")) == (T, mask) and "seconds" in c]
    base = next((c for c in timed if c["variant"] == "transformer" and c["path"] == "cudnn"), None)
    for variant in PAPER_VARIANTS:
      mine = [c for c in timed if c["variant"] == variant]
      if not mine:
        continue
      best = min(mine, key=lambda c: c["seconds"]["median"])
      row = dict(T=T, mask=mask, variant=variant, fastest=best["path"],
                 fastest_ms=1e3 * best["seconds"]["median"],
                 ms={c["path"]: 1e3 * c["seconds"]["median"] for c in mine})
      if base is not None:
        row["flop_rate_vs_transformer_cudnn"] = best["model_tflops"] / base["model_tflops"]
      rows.append(row)
  return rows
