"""The correctness stage: every attention path of every variant against the float64 oracle,
forward and every input's gradient, at small heads and at the paper presets' own head widths.

Kernel inputs come from each variant's own `project` (model/attention.kernel_inputs), so a cell
runs exactly the call the model makes: Shared DIFF's call has DIFF V1's form (separate keys,
2d-wide values, scalar lambda) and, at equal shapes, the same compiled program.
"""
from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_common import paper_config, small_config
from benchmarks.gpu_check.common import (Deadline, Record, StageRun, compile_all, cudnn_refused,
                                         error_text, lower_or_error)
from diff_transformer.kernels import cudnn, reference, xla
from diff_transformer.kernels.pallas import attention as pallas_attention
from diff_transformer.model.attention import spec_from_config
from diff_transformer.model.spec import ModelSpec
from diff_transformer.model.attention import kernel_inputs
from diff_transformer.kernels.oracle import (ARG_NAMES, exact_cpu_attention, np_attention,
                                   scalar_lam_terms)

# Worst relative error that passes: float32 matmuls may run as TF32 on the GPU (XLA's and
# Triton's default), bfloat16 rounds inputs and outputs to 8 bits of mantissa.
TOLERANCE = {"float32": 2e-3, "bfloat16": 2e-2}


def paths(stage: StageRun, configs: dict | None = None) -> dict:
  """name -> kernel function of the contract (kernels/common.py). 'cudnn' is what the model
  runs (the exact layout where cudnn.exact_reason() allows it), 'cudnn_padded' the padded layout,
  'cudnn_two_calls' DIFF V1's maps as two calls sharing v, and 'cudnn_packed_as_is' packed rows
  with GQA heads and wider values passed to cuDNN's entry as they are, without
  `cudnn.equal_widths` (whether jax and XLA offset each operand by its own stride: if it passes,
  the exact layout needs no equal-width packed call). On CPU Pallas is interpreted, 'cudnn'
  runs the padded layout through XLA and 'cudnn_exact_layout' the exact layout with an exact CPU
  attention in cuDNN's place. --paths keeps some of them."""
  out: dict[str, Callable[..., Any]] = {"reference": reference.attention, "xla": xla.attention}
  for name, kw in (configs or {"pallas": {}}).items():
    out[name] = functools.partial(pallas_attention, **kw)
  if stage.cpu:
    out["cudnn"] = functools.partial(cudnn.attention, implementation="xla")
    out["cudnn_exact_layout"] = functools.partial(
        cudnn.attention, core=cudnn.equal_widths(exact_cpu_attention), implementation="xla")
  else:
    out["cudnn"] = functools.partial(cudnn.attention, implementation="cudnn")
    if not cudnn.exact_reason():
      out["cudnn_padded"] = functools.partial(cudnn.attention, padded=True)
      out["cudnn_two_calls"] = functools.partial(cudnn.attention, separate_calls=True)
      out["cudnn_packed_as_is"] = functools.partial(cudnn.attention, core=cudnn.cudnn_exact)
  return stage.options.chosen_paths(out)


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


def host_inputs(p, rng, packed: bool):
  """float64 inputs of the kernel call `p`, every value exactly representable in bfloat16 (so
  one oracle serves both dtypes); lambda in float32 as the models pass it."""
  def bf16_exact(x):
    return np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
  args: dict[str, np.ndarray | None] = {}
  for name in ARG_NAMES:
    s = getattr(p, name)
    if s is None:
      args[name] = None
    elif name == "lam":
      lam = (rng.uniform(0.2, 0.8, s.shape) if s.shape == ()
             else 1 / (1 + np.exp(-rng.standard_normal(s.shape))))
      args[name] = np.asarray(lam, np.float32).astype(np.float64)
    else:
      args[name] = bf16_exact(rng.standard_normal(s.shape))
  B, T = p.q1.shape[:2]
  seg = np.cumsum(rng.random((B, T)) < 3.0 / T, axis=1).astype(np.int32) if packed else None
  do = bf16_exact(rng.standard_normal(out_struct(p)))
  return args, seg, do


def oracle(args: dict, do: np.ndarray, seg) -> tuple:
  """(out, grads, the scale of a scalar lambda's gradient error or None), all float64."""
  out, grads = np_attention(args, do, causal=True, seg=seg)
  lam = args.get("lam")
  scalar = lam is not None and np.ndim(lam) == 0
  return out, grads, scalar_lam_terms(args, do, causal=True, seg=seg) if scalar else None


def timed_oracle(args: dict, do: np.ndarray, seg) -> tuple[tuple, float]:
  start = time.perf_counter()
  return oracle(args, do, seg), time.perf_counter() - start


def _oracle_by(future, deadline: Deadline) -> tuple[dict, float | None, float] | None:
  """(the group's float64 reference {out, grads...}, lambda's gradient scale, the oracle's
  seconds at this size on this host's CPU), or None when it is not done by the deadline."""
  try:
    (out, grads, lam_scale), seconds = future.result(timeout=max(1.0, deadline.left()))
  except FuturesTimeout:
    return None
  return {"out": out, **grads}, lam_scale, round(seconds, 1)


def errors(got: dict, want: dict, lam_scale: float | None = None) -> dict:
  """Per output: relative Frobenius error, max elementwise error over max |reference|, finite.
  A scalar lambda's gradient cancels to a small fraction of its terms, so its error is taken
  over `lam_scale`, their absolute sum."""
  out = {}
  for name, w in want.items():
    g = np.asarray(jnp.asarray(got[name], jnp.float32), np.float64)
    w = np.asarray(w, np.float64)
    scale, peak = max(float(np.linalg.norm(w)), 1e-30), max(float(np.abs(w).max()), 1e-30)
    if name == "lam" and lam_scale is not None:
      scale = peak = max(lam_scale, 1e-30)
    out[name] = dict(rel=float(np.linalg.norm(g - w) / scale),
                     elem=float(np.abs(g - w).max() / peak), finite=bool(np.isfinite(g).all()))
  return out


def correctness_spec(variant: str, layout: str, dtype: str, cpu: bool) -> ModelSpec:
  """mha / gqa: a small model's heads; 830m / 3b: that preset's own heads (DIFF V1's q/k 96
  and 128 wide, values 192 and 256: the widths the exact cuDNN layout takes as they are)."""
  if layout in ("830m", "3b"):
    c = paper_config(variant, seq_len=8, batch=1, layers=1, dtype=dtype, size=layout)
    return spec_from_config(c.model)
  d_model, head_dim = (64, 16) if cpu else (512, 64)
  c = small_config(variant, seq_len=8, batch=1, dtype=dtype, d_model=d_model, head_dim=head_dim)
  if layout == "gqa":
    c.model.num_kv_heads = c.model.num_heads // 2
  return spec_from_config(c.model)


def _cases(stage: StageRun, lengths: tuple[int, ...]) -> list[tuple[str, int, bool]]:
  """(layout, T, packed) groups: small heads at every length, the paper presets' own head
  widths at the longest, unpacked and packed; or --cases, e.g.
  "gqa:256,packed:256,mha:2048,3b:2048:packed" (on CPU, a rehearsal, at the CPU length)."""
  cpu = stage.cpu
  if stage.options.cases:
    return [("gqa" if c[0] == "packed" else c[0], lengths[0] if cpu else int(c[1]),
             c[0] == "packed" or c[2:] == ["packed"])
            for c in (case.split(":") for case in stage.options.cases)]
  cases = [(layout, T, False) for T in lengths for layout in ("mha", "gqa")]
  cases.insert(2, ("gqa", lengths[0], True))
  if not cpu:
    cases += [(size, lengths[-1], packed) for size in ("830m", "3b") for packed in (False, True)]
  return cases


def stage_correctness(stage: StageRun) -> None:
  """One group (variant, layout, length, packing) at a time: its programs (every path, both
  dtypes) compiled together, run, compared with the group's oracle and written; shorter
  lengths first, so a stage cut short has every variant at the short length."""
  cpu, opts, deadline = stage.cpu, stage.options, Deadline(stage.seconds - 10)
  lengths, dtypes, batch = ((32,), ("float32",), 2) if cpu else (opts.lengths_or((256, 2048)),
                                                                   opts.dtypes, 2)
  cases, kernels = _cases(stage, lengths), paths(stage)
  rec = Record(stage, tolerance=TOLERANCE, batch=batch, lengths=lengths,
               dtypes=dtypes, paths=list(kernels),
               inputs="fresh N(0,1) draws rounded to bfloat16-exact values; lambda U(0.2,0.8) "
                      "(scalar) or sigmoid(N(0,1)) per token; packed rows: random segments")
  rng = np.random.default_rng(int(time.time()))
  compiled: dict = {}
  oracle_pool = ThreadPoolExecutor(4)
  try:
    groups = []
    for layout, T, packed in cases:
      for variant in opts.variants:
        p = kernel_inputs(correctness_spec(variant, layout, dtypes[0], cpu), T, batch)
        host = host_inputs(p, rng, packed)
        args, seg, do = host
        groups.append(dict(variant=variant, layout=layout, T=T, packed=packed, host=host,
                           oracle=oracle_pool.submit(timed_oracle, args, do, seg)))
    for g in groups:
      cell0 = dict(variant=g["variant"], layout=g["layout"], T=g["T"], packed=g["packed"])
      if deadline.left() < 0:
        rec.add(dict(cell0, skipped="stage time cap"))
        continue
      programs: list[tuple[str, str, Any, list[str]]] = []  # key: a program, or why refused
      lowered: dict = {}
      for dtype in dtypes:
        p = kernel_inputs(correctness_spec(g["variant"], g["layout"], dtype, cpu), g["T"], batch)
        names = [n for n in ARG_NAMES if getattr(p, n) is not None]
        structs = [getattr(p, n) for n in names]
        seg = jax.ShapeDtypeStruct((batch, g["T"]), jnp.int32) if g["packed"] else None
        do = jax.ShapeDtypeStruct(out_struct(p), p.q1.dtype)
        for path, kernel in kernels.items():
          if path == "cudnn_packed_as_is" and seg is None:  # unpacked, it is 'cudnn' itself
            continue
          refused = cudnn_refused(path, p)
          if refused:
            programs.append((dtype, path, refused, names))
            continue
          key = (path, signature(names, structs, seg))
          if key not in compiled:
            lowered[key] = lower_or_error(fwd_bwd(kernel, names), structs, do, seg)
          programs.append((dtype, path, key, names))
      compiled.update(compile_all(lowered, 16))
      args, seg, do = g["host"]
      done = _oracle_by(g["oracle"], deadline)
      if done is None:
        rec.add(dict(cell0, skipped="its float64 oracle was not done by the stage's deadline"))
        continue
      want, lam_scale, cell0["oracle_s"] = done
      for dtype, path, key, names in programs:
        cell = dict(cell0, dtype=dtype, path=path,
                    shapes={n: list(np.shape(args[n])) for n in names})
        if isinstance(key, str):  # cuDNN refuses these inputs: named, not run
          rec.add(dict(cell, skipped=f"cuDNN refuses {key}"))
          continue
        program = compiled[key]
        if isinstance(program, BaseException):
          rec.add(dict(cell, ok=False, error=error_text(program)))
          continue
        cast = lambda n: jnp.asarray(args[n], jnp.float32 if n == "lam" else dtype)
        try:
          got_out, got_grads = program([cast(n) for n in names], jnp.asarray(do, dtype),
                                       None if seg is None else jnp.asarray(seg))
          errs = errors({"out": got_out, **dict(zip(names, got_grads))},
                        {k: want[k] for k in ["out", *names]}, lam_scale)
        except Exception as e:  # recorded per cell
          rec.add(dict(cell, ok=False, error=error_text(e)))
          continue
        worst = max(max(e["rel"], e["elem"]) for e in errs.values())
        ok = worst < TOLERANCE[dtype] and all(e["finite"] for e in errs.values())
        rec.add(dict(cell, ok=ok, worst=worst, errors=errs))
      rec.set(worst_by_path_and_dtype=worst_table(rec.data["cells"]), programs=len(compiled))
  finally:  # the oracles not started are dropped; the stage's cap ends a running one
    oracle_pool.shutdown(wait=False, cancel_futures=True)


def worst_table(cells: list[dict]) -> dict:
  """{path: {dtype: worst error over every variant, layout and length, or why none}}."""
  table: dict = {}
  for c in cells:
    if "path" not in c or "skipped" in c:  # a group the cap skipped, or cuDNN refused
      continue
    slot = table.setdefault(c["path"], {}).setdefault(c["dtype"],
                                                     dict(worst=0.0, cells=0, failed=0))
    if "worst" in c:
      slot["worst"] = max(slot["worst"], c["worst"])
      slot["cells"] += 1
      slot["failed"] += not c["ok"]
    else:
      slot["failed"] += 1
      slot.setdefault("errors", sorted({c.get("error", c.get("skipped", ""))[:160]} |
                                       set(slot.get("errors", []))))
  return table
