"""The train step's cuDNN attention calls, read from the step lowered for a CUDA GPU on a CPU host.

jax lowers its cuDNN entry for a CUDA target without a GPU once the entry's cuDNN-version and
compute-capability queries are answered (`cudnn.deviceless`: cuDNN 9.12, compute capability
9.0; `cudnn.exact_reason()` then allows the exact layout). Nothing compiles (aot_compile.py
compiles it: docs/performance.md):

    jax.jit(step).trace(*ShapeDtypeStructs).lower(lowering_platforms=("cuda",)).as_text()

holds every `__cudnn$fmha...` custom call with its operand shapes and backend config (mask type,
max_seg_per_batch), forward and backward. From them this reads, per variant, preset, length and
packing: which calls there are, their widths, whether a dense bias is an operand, and the bytes of
every operand and result, against a bound that grows linearly in T (`check`). Per layer it
states the softmax statistics the backward keeps and the dQ accumulator cudnn-frontend sizes
from cuDNN's batch (b * h * s * d float32, b = rows x sequences per row; read from
cudnn-frontend's source, not seen on a GPU).

    JAX_PLATFORMS=cpu python benchmarks/lower_cudnn.py [--json benchmarks/results/lower_cudnn.json]
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_common import paper_config  # noqa: E402
from diff_transformer.kernels import cudnn  # noqa: E402
from diff_transformer.mesh import make_mesh  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS  # noqa: E402
from diff_transformer.training.step import Trainer  # noqa: E402

# (preset size, T, rows per step): the GPU jobs' train steps (830M: 16K tokens a step; 3B: 8K).
STEPS = (("830m", 2048, 8), ("3b", 2048, 4), ("3b", 4096, 2))
# A dQ accumulator (one backward call's workspace, transient) above this is refused.
ACCUMULATOR_LIMIT = 4 * 2 ** 30
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "ui8": 1, "i1": 1, "pred": 1}
_CALL = re.compile(r"custom_call @__cudnn\$fmha(\w+)\(")
_TENSOR = re.compile(r"tensor<((?:\d+x)*)(\w+)>")
_CONFIG = re.compile(r'\\22(mask_type|max_seg_per_batch)\\22: (?:\\22)?(\w+)')


CUDNN_ANSWERED = 91200  # the cuDNN version jax's entry is told (cudnn.deviceless)


def lowered_step(variant: str, size: str, seq_len: int, batch: int, *, packed: bool,
                 layers: int = 1, **model) -> str:
  """The train step of the `size` preset (depth cut to `layers`, bfloat16, kernel=cudnn), lowered
  for CUDA: StableHLO text. packed: text rows (segment ids in the step); else causal-only rows."""
  config = paper_config(variant, seq_len=seq_len, batch=batch, layers=layers, kernel="cudnn",
                        size=size)
  config.data.document_mask = packed
  for key, value in model.items():
    config.model[key] = value
  trainer = Trainer(config, make_mesh(config.mesh))
  rows = {k: jax.ShapeDtypeStruct((batch, seq_len), jnp.float32 if k == "weights" else jnp.int32)
          for k in ("inputs", "targets", "segment_ids", "positions", "weights")}
  with cudnn.deviceless(CUDNN_ANSWERED, 9.0):
    return trainer.lower_train_step(rows, platforms=("cuda",)).as_text()


def _tensors(text: str) -> list[dict]:
  out = []
  for dims, dtype in _TENSOR.findall(text):
    shape = [int(d) for d in dims.split("x") if d]
    out.append(dict(shape=shape, dtype=dtype,
                    bytes=math.prod(shape) * DTYPE_BYTES.get(dtype, 4)))
  return out


def fmha_calls(text: str) -> list[dict]:
  """Every cuDNN attention call in lowered StableHLO: its kind (Softmax, SoftmaxBackward,
  ScaleBiasSoftmax, ...), operands and results (shape, dtype, bytes), mask type and
  max_seg_per_batch."""
  calls = []
  for line in text.splitlines():
    m = _CALL.search(line)
    if not m:
      continue
    signature = line[line.rindex(" : (") + 3:]
    operands, results = signature.split(") -> (")
    config = dict(_CONFIG.findall(line))
    calls.append(dict(kind=m.group(1), backward=m.group(1).endswith("Backward"),
                      bias="Bias" in m.group(1), operands=_tensors(operands),
                      results=_tensors(results), mask_type=config.get("mask_type"),
                      max_seg_per_batch=int(config.get("max_seg_per_batch", 0))))
  return calls


def layer_memory(call: dict) -> dict:
  """A forward call's per-layer residual and its backward's modelled workspace: the softmax
  statistics [b, heads, T] float32 (b = rows, or rows x sequences per row when packed), and the
  dQ accumulator cudnn-frontend sizes as b * heads * T * d float32."""
  q = call["operands"][0]["shape"]  # [B, T, heads, d]
  stats = call["results"][1]
  b = stats["shape"][0]
  return dict(stats_bytes=stats["bytes"], dq_accumulator_bytes=b * q[2] * q[1] * q[3] * 4,
              cudnn_batch=b)


def check(calls: list[dict]) -> list[str]:
  """Why these calls would not fit, one line each ([] when they do): each operand and result of a
  call in the exact layout at most a float32 copy of its widest q/k/v/output operand (linear in
  T; the softmax statistics over rows x sequences per row must stay under it), no dense bias
  there, and the modelled dQ accumulator under ACCUMULATOR_LIMIT. Calls with a bias operand are
  the padded layout's (the fallback of rows over the cap): their [B, 1, T, T] bias is allowed."""
  problems = []
  for call in calls:
    if call["bias"]:
      continue
    tensors = call["operands"] + call["results"]
    widest = max(t["bytes"] // DTYPE_BYTES.get(t["dtype"], 4) * 4
                 for t in tensors if len(t["shape"]) == 4)
    for t in tensors:
      if t["bytes"] > widest:
        problems.append(f"{call['kind']}: a {t['dtype']}{t['shape']} of {t['bytes'] / 2**30:.2f} "
                        f"GiB exceeds the linear bound {widest / 2**30:.2f} GiB")
    if not call["backward"]:
      acc = layer_memory(call)["dq_accumulator_bytes"]
      if acc > ACCUMULATOR_LIMIT:
        problems.append(f"{call['kind']}: the modelled dQ accumulator of {acc / 2**30:.1f} GiB "
                        f"exceeds {ACCUMULATOR_LIMIT / 2**30:.0f} GiB")
  return problems


def summary(variant: str, size: str, seq_len: int, batch: int, packed: bool, **model) -> dict:
  """One lowered step's calls, widths, memory per layer and problems (or the error)."""
  row = dict(variant=variant, size=size, T=seq_len, batch=batch, packed=packed, **model)
  try:
    calls = fmha_calls(lowered_step(variant, size, seq_len, batch, packed=packed, **model))
  except Exception as e:  # a refused width is recorded as the row's result
    return dict(row, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
  exact = [c for c in calls if not c["bias"]]
  forward = next((c for c in exact if not c["backward"]), None)
  return dict(row, calls=[c["kind"] for c in calls],
              mask_types=sorted({c["mask_type"] for c in calls}),
              widths=None if forward is None else dict(
                  heads=forward["operands"][0]["shape"][2],
                  q=forward["operands"][0]["shape"][3], k=forward["operands"][1]["shape"][3],
                  v=forward["operands"][2]["shape"][3]),
              max_seg_per_batch=None if forward is None else forward["max_seg_per_batch"],
              per_layer=None if forward is None else layer_memory(forward),
              problems=check(calls))


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", default=str(Path(__file__).parent / "results" / "lower_cudnn.json"))
  args = p.parse_args()
  rows = []
  for size, seq_len, batch in STEPS:
    for variant in PAPER_VARIANTS:
      for packed in (False, True):
        rows.append(summary(variant, size, seq_len, batch, packed))
        print(json.dumps({k: rows[-1].get(k) for k in ("variant", "size", "T", "packed",
                                                       "widths", "per_layer", "problems",
                                                       "error")}), flush=True)
    # The layout before the cap: one cuDNN sequence per token (max_seg_per_batch = T).
    rows.append(summary("diff", size, seq_len, batch, True, max_segments=seq_len))
  out = dict(jax=jax.__version__, cudnn_version_answered=CUDNN_ANSWERED, steps=STEPS,
             accumulator_limit_bytes=ACCUMULATOR_LIMIT, max_segments=cudnn.MAX_SEGMENTS,
             rows=rows)
  Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
  print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
