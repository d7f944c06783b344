"""The env and tests stages: the stack (versions, device, driver, cuDNN, measured ceilings, every
module of the package imported), and the CPU suite's fast subset run on it."""
from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import diff_transformer
from benchmarks.gpu_check import ROOT
from benchmarks.gpu_check.common import Record, StageRun, error_text, nvidia_smi
from diff_transformer.kernels import cudnn
from diff_transformer.training.peak import calibrate_tflops

HF_EXTRA = ("transformers", "torch", "safetensors", "lm_eval", "accelerate", "tiktoken")


# The CPU suite's fast subset for the `tests` stage: kernels, model, training units, decoding.
TEST_SUBSET = ("tests/test_attention_numerics.py", "tests/test_pallas_kernel.py",
               "tests/test_model.py", "tests/test_training_units.py",
               "tests/test_eval_kvcache.py", "tests/test_config.py", "tests/test_params.py",
               "tests/test_variant_registry.py", "tests/test_attention_cost.py")


def cudnn_info() -> dict:
  """The cuDNN version jax loaded, and whether the exact layout (kernels/cudnn.py) runs here."""
  try:  # jax's private cuDNN entry: its version check is what the exact layout reads too
    from jax._src.cudnn import fused_attention_stablehlo as entry
    version = entry.check_cudnn_version()
  except Exception as e:  # no GPU plugin, or no cuDNN: recorded
    version = error_text(e)
  return dict(version=version, exact_layout=cudnn.exact_reason() or "runs")


def copy_bandwidth(gib: float = 2.0) -> float:
  """GB/s of a device-to-device copy, bytes read plus written (best of 10)."""
  x = jax.random.normal(jax.random.key(0), (int(gib * 2**30 / 4),), jnp.float32)
  copy = jax.jit(lambda a: a * 1.0000001)  # a fresh output buffer every call
  jax.block_until_ready(copy(x))
  best = float("inf")
  for _ in range(10):
    start = time.perf_counter()
    jax.block_until_ready(copy(x))
    best = min(best, time.perf_counter() - start)
  return 2 * x.nbytes / best / 1e9


def stage_env(stage: StageRun) -> None:
  cpu = stage.cpu
  rec = Record(stage, cpu_mode=cpu, devices=[str(d) for d in jax.devices()],
               nvidia_smi={} if cpu else nvidia_smi(), cudnn=cudnn_info())
  try:
    info = jax.print_environment_info(return_string=True) or ""
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    rec.set(environment_info=info.replace(cache, "<compile cache>") if cache else info)
  except Exception as e:  # informational only
    rec.set(environment_info=error_text(e))
  sizes = (256,) if cpu else (8192,)
  rec.set(ceilings=dict(bf16_matmul_tflops=calibrate_tflops("bfloat16", sizes, 0.5),
                        copy_gb_per_s=copy_bandwidth(0.01 if cpu else 2.0)))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rec.set(imports=import_all())
  rec.set(warnings=sorted({f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught}))


def import_all() -> dict:
  """Every module of the package imported on this stack: {module: error} for those that fail;
  modules of the `hf` extra whose packages are not installed here are listed apart."""
  failed: dict[str, str] = {}
  no_extra: dict[str, str] = {}
  count = 0
  for module in pkgutil.walk_packages(diff_transformer.__path__, "diff_transformer."):
    count += 1
    try:
      importlib.import_module(module.name)
    except ModuleNotFoundError as e:
      hf_only = e.name and e.name.split(".")[0] in HF_EXTRA
      (no_extra if hf_only else failed)[module.name] = error_text(e)
    except Exception as e:  # recorded
      failed[module.name] = error_text(e)
  return dict(modules=count, failed=failed, hf_extra_missing=no_extra)


def stage_tests(stage: StageRun) -> None:
  """The subset under pytest -n 8 on this stack (CPU). Output goes to a file as it comes, so a
  run stopped by the cap still records which tests failed so far (-rfE lists them at the end)."""
  rec = Record(stage, subset=list(TEST_SUBSET))
  if stage.cpu:
    rec.set(skipped="CPU mode: the suite itself is what runs on CPU")
    return
  workers = str(min(8, os.cpu_count() or 1))
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "--tb=line", "-n", workers, "--dist",
         "loadscope", "-o", "addopts=", "-p", "no:cacheprovider", *TEST_SUBSET]
  log = Path(tempfile.mkdtemp()) / "pytest.log"
  start = time.time()
  with open(log, "w") as f:
    try:
      proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                            timeout=max(10.0, stage.seconds - 5))
      status: dict[str, Any] = dict(returncode=proc.returncode)
    except subprocess.TimeoutExpired:
      status = dict(returncode=None, timed_out=True)
  text = log.read_text()
  rec.set(**status, wall_s=round(time.time() - start, 1), tail=text[-6000:],
          failed=[line for line in text.splitlines()
                  if line.startswith(("FAILED", "ERROR")) or re.search(r"tests/\S+:\d+: ", line)],
          summary=text.strip().split("\n")[-1] if text.strip() else "")
