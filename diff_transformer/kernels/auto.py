"""kernel='auto': which exact attention path runs, per platform and shapes.

- CPU (measured, benchmarks/results/attention_kernels_cpu.json): the einsum path 'xla' at every
  measured length (T = 256 to 1024); the dot_product_attention layout ('cudnn' run through XLA)
  was 2.5-4x slower there and Pallas only runs interpreted on CPU.
- GPU (measured on an NVIDIA H200 with jax 0.11.2, benchmarks/results/gpu_check_kernels.json,
  gpu_check_kernels_long.json and gpu_check_train.json): cuDNN's fused flash attention wherever it
  takes the shapes: bfloat16 / float16 and a common q/k/v width (after cudnn.py pads q and k to the
  value width) that is a multiple of 8 and at most 256 on Hopper and later (compute capability
  9.0+), 128 before, the limits jax's cuDNN path checks. At the 830M heads, T = 2048,
  forward+backward: cuDNN took 1.34 ms for the Transformer against 2.39 for the fused Pallas
  (Triton) kernel, 2.81 against 6.52 for DIFF V1 (values 192 wide, q/k padded to 192), 2.62 against
  5.60 for DIFF V2; the DIFF V1 train step ran 7.6% faster through cuDNN. At T = 4096 and 8192 cuDNN
  stayed fastest for every variant (DIFF V1: 4.50 against 9.70 ms, 7.79 against 17.81). Elsewhere
  (float32, wider heads) the Pallas kernel.
- TPU (by rule, not measured here): the fused Pallas (Mosaic) kernel.
- A population's step (members vmapped, `population_members`): the Pallas kernel on a GPU too.
An explicit mask (KV-cache decoding) always takes 'xla': the fused kernels take causal and
segment masks only. The platform is the default backend at trace time, or the one set by
`target_platform` (diff_transformer/aot/ compiles for a TPU or a CUDA GPU from a CPU host under
`target_platform("tpu")` or `target_platform("gpu", compute_capability=9.0)`).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_WIDTH = {"hopper": 256, "older": 128}  # by compute capability 9.0+ or below
# (platform, compute capability or None), innermost target_platform last
_TARGETS: list[tuple[str, float | None]] = []
_MEMBERS: list[bool] = []  # population_members(), innermost last


@contextlib.contextmanager
def population_members():
  """Inside: the step traced is vmapped over a population's members (training/population.py),
  and 'auto' takes the fused Pallas kernel on a GPU, not cuDNN: jax's cuDNN attention has no
  batching rule for packed rows (their offsets), values wider than q/k (DIFF V1) or a dense mask
  (compiled for an H100 with jax 0.12, each raises a TypeError where the rule reshapes them;
  tests/test_gpu_aot.py)."""
  _MEMBERS.append(True)
  try:
    yield
  finally:
    _MEMBERS.pop()


@contextlib.contextmanager
def target_platform(platform: str, compute_capability: float | None = None):
  """Inside: every 'auto' (model.kernel, model.layer_loop) chooses for `platform` instead of the
  default backend (a program traced here runs elsewhere, e.g. an ahead-of-time TPU compile on a
  CPU host), and a GPU's width limits are those of `compute_capability` (the target GPU's, not
  this host's). Trace a fresh jitted function here: jax's trace cache does not see the target."""
  _TARGETS.append((platform, compute_capability))
  try:
    yield
  finally:
    _TARGETS.pop()


def target() -> str:
  """The platform a program traced now is for: the innermost target_platform, else the default
  backend ('cpu', 'gpu', 'tpu')."""
  return _TARGETS[-1][0] if _TARGETS else jax.default_backend()


def target_compute_capability() -> float:
  """The compute capability a program traced now is for: the innermost one a target_platform
  names, else this host's first GPU's (0.0 without a GPU)."""
  named = [capability for _, capability in _TARGETS if capability is not None]
  return float(named[-1]) if named else local_compute_capability()


def choose(q1, k1, v, *, explicit_mask: bool = False, platform: str | None = None,
           compute_capability: float | None = None, exact_layout: bool = False) -> str:
  """The kernel name 'auto' stands for with these inputs (arrays or ShapeDtypeStructs).
  `compute_capability`: the GPU's; by default the target's (target_platform), else this host's
  first GPU's (none: the pre-Hopper limit). `exact_layout`: cuDNN would run in its exact layout
  (cudnn.exact_reason() is ''), which checks q/k's own width too, not only the padded one."""
  platform = platform or target()
  if explicit_mask or platform == "cpu":
    return "xla"
  if platform == "tpu":
    return "pallas"
  if _MEMBERS:
    return "pallas"
  refused = cudnn_refusal(q1, k1, v, compute_capability=compute_capability, exact=exact_layout)
  return "pallas" if refused else "cudnn"


def cudnn_refusal(q1, k1, v, *, compute_capability: float | None = None,
                  exact: bool = False) -> str:
  """'' where cuDNN takes these inputs (arrays or ShapeDtypeStructs), else why not, in one line.
  Padded layout (default): q/k padded to the value width, one width; `exact`: q/k and values
  at their own widths, each checked."""
  if q1.dtype not in CUDNN_DTYPES:
    return f"dtype {jnp.dtype(q1.dtype).name} (cuDNN takes bfloat16 or float16)"
  if compute_capability is None:
    compute_capability = target_compute_capability()
  limit = CUDNN_MAX_WIDTH["hopper" if compute_capability >= 9.0 else "older"]
  widths = (k1.shape[-1], v.shape[-1]) if exact else (max(k1.shape[-1], v.shape[-1]),)
  for width in widths:
    if width % 8 or width > limit:
      return f"head width {width} (cuDNN takes multiples of 8 up to {limit} on this GPU)"
  return ""


def local_compute_capability() -> float:
  """The first GPU's compute capability (e.g. 9.0 for an H100 or H200); 0.0 without a GPU."""
  device = jax.devices()[0]
  if device.platform != "gpu":
    return 0.0
  try:
    return float(getattr(device, "compute_capability", 0.0))
  except (TypeError, ValueError):
    return 0.0
