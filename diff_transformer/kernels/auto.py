"""kernel='auto': which exact attention path runs, per platform and shapes.

- CPU (measured, benchmarks/results/attention_kernels_cpu.json): the einsum path 'xla' at every
  measured length (T = 256 to 1024); the dot_product_attention layout ('cudnn' run through XLA)
  was 2.5-4x slower there and Pallas only runs interpreted on CPU.
- GPU (by rule, not measured in this repository): cuDNN's fused flash attention where it takes
  the shapes (bfloat16/float16, a common q/k/v width after padding of at most 128 that is a
  multiple of 8), else the fused Pallas (Triton) kernel.
- TPU (by rule, not measured here): the fused Pallas (Mosaic) kernel.
An explicit mask (KV-cache decoding) always takes 'xla': the fused kernels take causal and
segment masks only. The platform is the default backend at trace time, or the one set by
`target_platform` (aot.py compiles for a TPU from a CPU host under `target_platform("tpu")`).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_WIDTH = 128
_TARGETS: list[str] = []  # innermost target_platform last


@contextlib.contextmanager
def target_platform(platform: str):
  """Inside: 'auto' chooses for `platform` instead of the default backend (a program traced
  here runs elsewhere, e.g. an ahead-of-time TPU compile on a CPU host)."""
  _TARGETS.append(platform)
  try:
    yield
  finally:
    _TARGETS.pop()


def choose(q1, k1, v, *, explicit_mask: bool = False, platform: str | None = None) -> str:
  """The kernel name 'auto' stands for with these inputs (arrays or ShapeDtypeStructs)."""
  platform = platform or (_TARGETS[-1] if _TARGETS else jax.default_backend())
  if explicit_mask or platform == "cpu":
    return "xla"
  if platform == "tpu":
    return "pallas"
  width = max(k1.shape[-1], v.shape[-1])  # cudnn.py pads q/k to the value width
  if q1.dtype in CUDNN_DTYPES and width <= CUDNN_MAX_WIDTH and width % 8 == 0:
    return "cudnn"
  return "pallas"
