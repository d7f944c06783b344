"""gpu_check's correctness and kernels stages: every attention path against the float64 oracle,
then its speed.

Kernel inputs come from each variant's own `project` (training/metrics.kernel_inputs), so a cell
runs exactly the call the model makes: Shared DIFF's call has DIFF V1's form (separate keys,
2d-wide values, scalar lambda) and, at equal shapes, the same compiled program.
"""
from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench_common import paper_config, small_config, spread
from gpu_check import (OPTIONS, Deadline, Record, compile_all, error_text, interleaved_times,
                       lengths_or, lower_or_error, temp_bytes)
from diff_transformer.kernels import cudnn, executed_flops, reference, xla
from diff_transformer.kernels.pallas import attention as pallas_attention
from diff_transformer.model.attention import PAPER_VARIANTS, variant_class
from diff_transformer.model.spec import ModelSpec
from diff_transformer.training.metrics import kernel_inputs
from tests.helpers.kernels import ARG_NAMES, exact_cpu_attention, np_attention

# Worst relative error that passes: float32 matmuls may run as TF32 on the GPU (XLA's and
# Triton's default), bfloat16 rounds inputs and outputs to 8 bits of mantissa.
TOLERANCE = {"float32": 2e-3, "bfloat16": 2e-2}
# The fused kernel at its defaults, and with the other warp count (api.py picks 8 for values
# wider than 128 after padding, else 4).
PALLAS_CONFIGS = {"pallas": {}, "pallas_w4": dict(num_warps=4), "pallas_w8": dict(num_warps=8)}


def paths(cpu: bool, configs: dict | None = None) -> dict:
  """name -> kernel function of the contract (kernels/common.py). 'cudnn' is what the model
  runs (the exact layout where cudnn.exact_reason() allows it), 'cudnn_padded' the padded layout
  and 'cudnn_two_calls' DIFF V1's maps as two calls sharing v. On CPU Pallas is interpreted,
  'cudnn' runs the padded layout through XLA and 'cudnn_exact_layout' the exact layout with an
  exact CPU attention in cuDNN's place."""
  out = {"reference": reference.attention, "xla": xla.attention}
  for name, kw in (configs or {"pallas": {}}).items():
    out[name] = functools.partial(pallas_attention, **kw)
  if cpu:
    out["cudnn"] = functools.partial(cudnn.attention, implementation="xla")
    out["cudnn_exact_layout"] = functools.partial(cudnn.attention, core=exact_cpu_attention)
  else:
    out["cudnn"] = functools.partial(cudnn.attention, implementation="cudnn")
    if not cudnn.exact_reason():
      out["cudnn_padded"] = functools.partial(cudnn.attention, padded=True)
      out["cudnn_two_calls"] = functools.partial(cudnn.attention, separate_calls=True)
  return out


def fwd_bwd(kernel, names):
  """(present inputs, cotangent, segment ids) -> (out, grads of the present inputs)."""
  def run(xs, do, seg):
    def f(*xs):
      kw = dict(zip(names, xs))
      return kernel(*(kw.get(n) for n in ARG_NAMES), segment_ids=seg, causal=True)
    out, vjp = jax.vjp(f, *xs)
    return out, vjp(do.astype(out.dtype))
  return run


def out_struct(p) -> tuple:
  return (*p.q1.shape[:3], p.v.shape[-1])


def signature(names, structs, seg) -> tuple:
  return tuple((n, s.shape, str(s.dtype)) for n, s in zip(names, structs)) + (seg is not None,)


# ------------------------------------------------------------------------------ correctness


def host_inputs(p, rng, packed: bool):
  """float64 inputs of the kernel call `p`, every value exactly representable in bfloat16 (so
  one oracle serves both dtypes); lambda in float32 as the models pass it."""
  def bf16_exact(x):
    return np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
  args = {}
  for name in ARG_NAMES:
    s = getattr(p, name)
    if s is None:
      args[name] = None
    elif name == "lam":
      lam = rng.uniform(0.2, 0.8, s.shape) if s.shape == () else 1 / (1 + np.exp(-rng.standard_normal(s.shape)))
      args[name] = np.asarray(lam, np.float32).astype(np.float64)
    else:
      args[name] = bf16_exact(rng.standard_normal(s.shape))
  B, T = p.q1.shape[:2]
  seg = np.cumsum(rng.random((B, T)) < 3.0 / T, axis=1).astype(np.int32) if packed else None
  do = bf16_exact(rng.standard_normal(out_struct(p)))
  return args, seg, do


def errors(got: dict, want: dict) -> dict:
  """Per output: relative Frobenius error, max elementwise error over max |reference|, finite."""
  out = {}
  for name, w in want.items():
    g = np.asarray(jnp.asarray(got[name], jnp.float32), np.float64)
    w = np.asarray(w, np.float64)
    scale, peak = max(np.linalg.norm(w), 1e-30), max(np.abs(w).max(), 1e-30)
    out[name] = dict(rel=float(np.linalg.norm(g - w) / scale),
                     elem=float(np.abs(g - w).max() / peak), finite=bool(np.isfinite(g).all()))
  return out


def correctness_spec(variant: str, layout: str, dtype: str, cpu: bool) -> ModelSpec:
  """mha / gqa: a small model's heads; 830m / 3b: that preset's own heads (DIFF V1's q/k 96
  and 128 wide, values 192 and 256: the widths the exact cuDNN layout takes as they are)."""
  if layout in ("830m", "3b"):
    c = paper_config(variant, seq_len=8, batch=1, layers=1, dtype=dtype, size=layout)
    return ModelSpec.from_config(c.model)
  d_model, head_dim = (64, 16) if cpu else (512, 64)
  c = small_config(variant, seq_len=8, batch=1, dtype=dtype, d_model=d_model, head_dim=head_dim)
  if layout == "gqa":
    c.model.num_kv_heads = c.model.num_heads // 2
  return ModelSpec.from_config(c.model)


def stage_correctness(out: Path, cpu: bool, seconds: float) -> None:
  """One group (variant, layout, length, packing) at a time: its programs (every path, both
  dtypes) compiled together, run, compared with the group's oracle and written; shorter
  lengths first, so a stage cut short has every variant at the short length."""
  deadline = Deadline(seconds - 10)
  lengths, dtypes, batch = ((32,), ("float32",), 2) if cpu else (lengths_or((256, 2048)),
                                                                   ("bfloat16", "float32"), 2)
  cases = [(layout, T, False) for T in lengths for layout in ("mha", "gqa")]
  cases.insert(2, ("gqa", lengths[0], True))
  if not cpu:  # the paper presets' own head widths, at the longest length, unpacked and packed
    cases += [(size, lengths[-1], packed) for size in ("830m", "3b") for packed in (False, True)]
  if OPTIONS["cases"]:  # a rerun of chosen groups: "gqa:256,packed:256,mha:2048,3b:2048:packed"
    cases = [("gqa" if c[0] == "packed" else c[0], int(c[1]),
              c[0] == "packed" or c[2:] == ["packed"])
             for c in (case.split(":") for case in OPTIONS["cases"])]
  kernels = paths(cpu)
  rec = Record(out, "correctness", tolerance=TOLERANCE, batch=batch, lengths=lengths,
               dtypes=dtypes, paths=list(kernels),
               inputs="fresh N(0,1) draws rounded to bfloat16-exact values; lambda U(0.2,0.8) "
                      "(scalar) or sigmoid(N(0,1)) per token; packed rows: random segments")
  rng = np.random.default_rng(int(time.time()))
  compiled: dict = {}
  with ThreadPoolExecutor(4) as oracle_pool:
    groups = []
    for layout, T, packed in cases:
      for variant in PAPER_VARIANTS:
        p = kernel_inputs(correctness_spec(variant, layout, dtypes[0], cpu), T, batch)
        host = host_inputs(p, rng, packed)
        args, seg, do = host
        groups.append(dict(variant=variant, layout=layout, T=T, packed=packed, host=host,
                           oracle=oracle_pool.submit(np_attention, args, do, causal=True, seg=seg)))
    for g in groups:
      cell0 = dict(variant=g["variant"], layout=g["layout"], T=g["T"], packed=g["packed"])
      if deadline.left() < 0:
        rec.add(dict(cell0, skipped="stage time cap"))
        continue
      programs, lowered = [], {}
      for dtype in dtypes:
        p = kernel_inputs(correctness_spec(g["variant"], g["layout"], dtype, cpu), g["T"], batch)
        names = [n for n in ARG_NAMES if getattr(p, n) is not None]
        structs = [getattr(p, n) for n in names]
        seg = jax.ShapeDtypeStruct((batch, g["T"]), jnp.int32) if g["packed"] else None
        do = jax.ShapeDtypeStruct(out_struct(p), p.q1.dtype)
        for path, kernel in kernels.items():
          key = (path, signature(names, structs, seg))
          if key not in compiled:
            lowered[key] = lower_or_error(fwd_bwd(kernel, names), structs, do, seg)
          programs.append((dtype, path, key, names))
      compiled.update(compile_all(lowered, 16))
      args, seg, do = g["host"]
      want_out, want_grads = g["oracle"].result()
      want = {"out": want_out, **want_grads}
      for dtype, path, key, names in programs:
        cell = dict(cell0, dtype=dtype, path=path,
                    shapes={n: list(np.shape(args[n])) for n in names})
        program = compiled[key]
        if isinstance(program, BaseException):
          rec.add(dict(cell, ok=False, error=error_text(program)))
          continue
        cast = lambda n: jnp.asarray(args[n], jnp.float32 if n == "lam" else dtype)
        try:
          got_out, got_grads = program([cast(n) for n in names], jnp.asarray(do, dtype),
                                       None if seg is None else jnp.asarray(seg))
          errs = errors({"out": got_out, **dict(zip(names, got_grads))},
                        {k: want[k] for k in ["out", *names]})
        except Exception as e:  # recorded per cell
          rec.add(dict(cell, ok=False, error=error_text(e)))
          continue
        worst = max(max(e["rel"], e["elem"]) for e in errs.values())
        ok = worst < TOLERANCE[dtype] and all(e["finite"] for e in errs.values())
        rec.add(dict(cell, ok=ok, worst=worst, errors=errs))
      rec.set(worst_by_path_and_dtype=worst_table(rec.data["cells"]), programs=len(compiled))


def worst_table(cells: list[dict]) -> dict:
  """{path: {dtype: worst error over every variant, layout and length, or why none}}."""
  table: dict = {}
  for c in cells:
    if "path" not in c:  # a group the stage's cap skipped
      continue
    slot = table.setdefault(c["path"], {}).setdefault(c["dtype"], dict(worst=0.0, cells=0, failed=0))
    if "worst" in c:
      slot["worst"] = max(slot["worst"], c["worst"])
      slot["cells"] += 1
      slot["failed"] += not c["ok"]
    else:
      slot["failed"] += 1
      slot.setdefault("errors", sorted({c.get("error", c.get("skipped", ""))[:160]} |
                                       set(slot.get("errors", []))))
  return table


# ---------------------------------------------------------------------------------- kernels


def stage_kernels(out: Path, cpu: bool, seconds: float) -> None:
  """fwd+bwd time of each path at the 830M head shapes, interleaved per length, with the
  compiled temp memory (linear in T for the fused paths, quadratic for 'xla'). Each call gets
  segment ids as the train step does on text (rows of packed documents, about 3 per row)."""
  deadline = Deadline(seconds - 10)
  tokens, lengths = (128, (64,)) if cpu else (16384, lengths_or((2048, 4096, 8192)))
  rounds, inner = (2, 1) if cpu else (7, 3)
  kernels = paths(cpu, None if cpu else PALLAS_CONFIGS)
  kernels.pop("reference")
  rec = Record(out, "kernels", tokens_per_call=tokens, lengths=lengths, rounds=rounds,
               inner=inner, paths=list(kernels), dtype="bfloat16",
               shapes_from=f"configs/scaling.py <variant>-{OPTIONS['size']}" if not cpu
               else "small_config")
  cells, lowered = [], {}
  for T in lengths:
    batch = max(1, tokens // T)
    for variant in PAPER_VARIANTS:
      if cpu:
        spec = ModelSpec.from_config(small_config(variant, seq_len=T, batch=batch,
                                                  dtype="bfloat16").model)
      else:
        spec = ModelSpec.from_config(paper_config(variant, seq_len=T, batch=batch, layers=1,
                                                  size=OPTIONS["size"]).model)
      p = kernel_inputs(spec, T, batch)
      names = [n for n in ARG_NAMES if getattr(p, n) is not None]
      structs = [getattr(p, n) for n in names]
      do = jax.ShapeDtypeStruct(out_struct(p), p.q1.dtype)
      model_flops = 3 * 0.5 * variant_class(variant).attention_flops(spec, T) * batch * T
      seg = jax.ShapeDtypeStruct((batch, T), jnp.int32)
      for path, kernel in kernels.items():
        key = (path, signature(names, structs, seg))
        if key not in lowered:
          lowered[key] = lower_or_error(fwd_bwd(kernel, names), structs, do, seg)
        base_path = path.split("_")[0]  # pallas_w4 counts as pallas, cudnn_padded as cudnn
        exact = {"cudnn_padded": False, "cudnn_two_calls": True,
                 "cudnn_exact_layout": True}.get(path)
        cells.append(dict(variant=variant, T=T, batch=batch, path=path, key=key,
                          shapes={n: list(s.shape) for n, s in zip(names, structs)},
                          model_flops=model_flops,
                          executed_flops=executed_flops(base_path, p.q1, p.k1, p.v, p.q2,
                                                        backward=True, cudnn_exact=exact),
                          structs=(structs, do)))
  compiled, compile_s = {}, {}
  for T in lengths:  # compiled length by length, so a stage cut short keeps the short lengths
    at_T = [c for c in cells if c["T"] == T]
    start = time.time()
    if deadline.left() > 0:
      compiled.update(compile_all({c["key"]: lowered[c["key"]] for c in at_T}, 16))
    compile_s[T] = round(time.time() - start, 1)
    rec.set(compile_s=compile_s)
    if any(c["key"] not in compiled for c in at_T):
      for c in at_T:
        rec.add(dict(_public(c), skipped="stage time cap"))
      continue
    calls = {}
    for i, c in enumerate(at_T):
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
      seg = np.cumsum(np.random.default_rng(i).random((c["batch"], T)) < 3.0 / T, axis=1)
      calls[i] = functools.partial(program, xs, dy, jnp.asarray(seg, jnp.int32))
    if deadline.left() < 0:
      for c in at_T:
        rec.add(dict(_public(c), skipped="stage time cap"))
      continue
    try:
      times = interleaved_times(calls, rounds, inner, deadline)
    except Exception as e:  # e.g. out of memory at the longest length
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


def _public(cell: dict) -> dict:
  return {k: v for k, v in cell.items() if k not in ("key", "structs")}


def kernel_summary(cells: list[dict]) -> list[dict]:
  """Per length and variant: the fastest path, and its model FLOP rate over the Transformer's
  cuDNN rate (the goal: at least 0.9)."""
  rows = []
  for T in sorted({c["T"] for c in cells}):
    timed = [c for c in cells if c["T"] == T and "seconds" in c]
    base = next((c for c in timed if c["variant"] == "transformer" and c["path"] == "cudnn"), None)
    for variant in PAPER_VARIANTS:
      mine = [c for c in timed if c["variant"] == variant]
      if not mine:
        continue
      best = min(mine, key=lambda c: c["seconds"]["median"])
      row = dict(T=T, variant=variant, fastest=best["path"],
                 fastest_ms=1e3 * best["seconds"]["median"],
                 ms={c["path"]: 1e3 * c["seconds"]["median"] for c in mine})
      if base is not None:
        row["flop_rate_vs_transformer_cudnn"] = best["model_tflops"] / base["model_tflops"]
      rows.append(row)
  return rows
