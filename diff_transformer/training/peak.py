"""The per-device peak FLOP/s that MFU divides by, and where it came from.

In order: `train.peak_tflops` when set ('config'); the vendor's dense bf16 figure for a known
accelerator ('table'); otherwise a short calibration ('measured'): the best rate of a square
matmul in the compute dtype on this host's first device, cached per host, device kind and dtype
under <cache root>/peak/ (data.cache_dir's root: $DIFF_TRANSFORMER_CACHE or
~/.cache/diff_transformer), so later runs read the same figure ('measured, cached'). A CPU host's
rate is shared by its CPU devices.
"""
from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from diff_transformer.data.common import cache_root
from diff_transformer.errors import UserError
from diff_transformer.files import read_json

# Dense bf16 peak TFLOP/s per device by jax device_kind (first matching substring wins).
PEAK_TFLOPS = (
    ("TPU v6", 918.0),  # Trillium ("TPU v6 lite")
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5", 459.0),  # v5p
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),  # SXM dense
    ("A100", 312.0),
)
# Matmul sides tried per platform: the best rate over them is the peak.
CALIBRATION_SIZES = {"cpu": (512, 1024)}
ACCELERATOR_SIZES = (4096, 8192)
CALIBRATION_SECONDS = 1.0


def calibrate_tflops(dtype: str = "float32", sizes: tuple[int, ...] | None = None,
                     seconds: float | None = None) -> float:
  """Best TFLOP/s of jitted n^3 matmuls in `dtype` on the first device, ~`seconds` per size."""
  platform_name = jax.local_devices()[0].platform
  sizes = sizes or CALIBRATION_SIZES.get(platform_name, ACCELERATOR_SIZES)
  return max(_matmul_tflops(n, dtype, seconds or CALIBRATION_SECONDS) for n in sizes)


def _matmul_tflops(n: int, dtype: str, seconds: float) -> float:
  device = jax.local_devices()[0]
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.device_put(jax.random.normal(key_a, (n, n), dtype), device)
  b = jax.device_put(jax.random.normal(key_b, (n, n), dtype), device)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(a, b))  # compile + warm
  best, start = float("inf"), time.perf_counter()
  while time.perf_counter() - start < seconds or best == float("inf"):
    t0 = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n ** 3 / best / 1e12


def _cache_file(device, dtype: str) -> Path:
  name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{platform.node()}-{device.device_kind}-{dtype}")
  return cache_root() / "peak" / f"{name}.json"


def _cached_tflops(path) -> float | None:
  """The cached peak, or None where there is none or it is damaged (then measured again)."""
  try:
    value = read_json(path, UserError, "peak cache")["tflops"]
  except UserError:
    return None
  return float(value) if value > 0 else None


def peak_tflops_per_device(configured: float = 0.0, dtype: str = "float32",
                           recalibrate: bool = False) -> tuple[float, str]:
  """(per-device peak TFLOP/s, source): 'config', 'table', 'measured' or 'measured, cached'.
  `recalibrate` measures again and replaces the cached figure (e.g. one taken under load)."""
  if configured > 0:
    return float(configured), "config"
  device = jax.local_devices()[0]
  for key, value in PEAK_TFLOPS:
    if device.platform != "cpu" and key in device.device_kind:
      return value, "table"
  share = jax.local_device_count() if device.platform == "cpu" else 1
  path = _cache_file(device, dtype)
  cached = _cached_tflops(path) if not recalibrate else None
  if cached is not None:  # a damaged cache is measured again and rewritten
    return cached / share, "measured, cached"
  tflops = calibrate_tflops(dtype)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(f".tmp-{jax.process_index()}")
  tmp.write_text(json.dumps(dict(tflops=tflops, dtype=dtype, device_kind=device.device_kind,
                                 host=platform.node(), time=time.time())))
  tmp.replace(path)
  return tflops / share, "measured"
