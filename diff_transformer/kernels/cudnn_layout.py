"""Which cuDNN layout this process can run (kernels/cudnn.py): the exact one needs jax's own
cuDNN entry on a CUDA GPU with cuDNN >= 9.10.2 and compute capability 9.0+, unless
DIFF_TRANSFORMER_CUDNN_LAYOUT=padded forces the padded one; `deviceless` answers the device's
questions for a program traced for a GPU on a host without one (aot/, benchmarks/lower_cudnn.py).
"""
from __future__ import annotations

import contextlib
import functools
import os

import jax

from diff_transformer.errors import ConfigError
from diff_transformer.kernels import auto

# cuDNN 9.10.2: values wider than q/k (jax's "mla" check asks for 9.10; cudnn-frontend refuses
# the bf16 forward of that case on 9.10.0 and 9.10.1).
MLA_MIN_CUDNN = 91002
LAYOUT_ENV = "DIFF_TRANSFORMER_CUDNN_LAYOUT"  # "padded" forces the padded layout; "" or "exact"
_DEVICELESS: list[tuple[int, float]] = []  # (cuDNN version, compute capability), innermost last


def forced_layout() -> str:
  """The layout DIFF_TRANSFORMER_CUDNN_LAYOUT forces ('padded'), or '' (the exact one where it
  runs); any other value is a ConfigError naming the variable."""
  value = os.environ.get(LAYOUT_ENV, "").strip()
  if value not in ("", "exact", "padded"):
    raise ConfigError(f"{LAYOUT_ENV}: '{value}' is not one of exact, padded (or unset)")
  return "padded" if value == "padded" else ""


def exact_reason() -> str:
  """'' when this process can call cuDNN at the model's own widths with packed rows, else why
  not (one line). Inside `deviceless`, the answers given there stand for the device's."""
  if forced_layout():
    return f"{LAYOUT_ENV}=padded forces it"
  if _DEVICELESS:
    version, capability = _DEVICELESS[-1]
    return _version_reason(version, capability >= 9.0)
  return _device_reason()


@functools.cache
def _device_reason() -> str:
  try:
    from jax._src.cudnn import fused_attention_stablehlo as entry
  except ImportError as e:
    return f"this jax has no cuDNN entry of its own ({e})"
  if jax.default_backend() != "gpu":
    return f"the backend is {jax.default_backend()}, not a CUDA GPU"
  try:
    version = entry.check_cudnn_version()
  except Exception as e:  # noqa: BLE001  (jax raises RuntimeError; a plugin may raise others)
    return f"cuDNN not found ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
  return _version_reason(version, entry.check_compute_capability("9.0"))


def _version_reason(version: int, hopper: bool) -> str:
  if version < MLA_MIN_CUDNN:
    return f"cuDNN {version} is older than 9.10.2"
  return "" if hopper else "the GPU's compute capability is below 9.0"


@contextlib.contextmanager
def deviceless(cudnn_version: int, compute_capability: float):
  """Inside: a program traced for a CUDA GPU on a host without one (no driver, no cuDNN library)
  gets the cuDNN calls it would get on a GPU with this cuDNN version (e.g. 91200 for 9.12) and
  compute capability. jax's cuDNN entry asks libcudnn for its version and the device for its
  capability while tracing; both queries are answered here instead, so the 700 MB cuDNN wheel
  is not needed, and `exact_reason` answers from them. 'auto' chooses for that GPU. Restored on
  exit. Only what is traced is affected: compiling the calls needs no cuDNN either (the cuDNN
  graph, and its workspace, are built on the device at run time)."""
  from jax._src.cudnn import fused_attention_stablehlo as entry
  major, minor = divmod(round(compute_capability * 10), 10)
  answers = {"check_cudnn_version": lambda *a, **k: cudnn_version,
             "check_compute_capability": lambda capability, *a, **k:
                 (major, minor) >= tuple(int(x) for x in str(capability).split(".")[:2]),
             "is_cuda_compute_capability_equal": lambda capability, *a, **k:
                 (major, minor) == tuple(int(x) for x in str(capability).split(".")[:2])}
  saved = {name: getattr(entry, name) for name in answers if hasattr(entry, name)}
  _DEVICELESS.append((cudnn_version, compute_capability))
  try:
    for name in saved:
      setattr(entry, name, answers[name])
    with auto.target_platform("gpu", compute_capability):
      yield
  finally:
    _DEVICELESS.pop()
    for name, fn in saved.items():
      setattr(entry, name, fn)
