"""One prepared GPU run: the kernels, the training step and decoding on the GPU's own JAX.

  bash tools/gpu_check.sh [OUT]            # on the GPU machine: every stage, each its own process
  bash tools/gpu_check.sh --cpu [OUT]      # tiny shapes, Pallas interpreted (what CI runs)
  python benchmarks/gpu_check.py --stage kernels --out OUT [--cpu] [--seconds 80]

Stages, in order (gpu_check_kernels.py and gpu_check_model.py hold 1-4):
  env          versions, device, driver, the measured bf16 matmul and copy ceilings, every module
               of the package imported
  correctness  every kernel path of every variant against the float64 oracle, forward and grads
  kernels      forward+backward time and compiled temp memory per path, 830M head shapes
  train        train tokens/s and MFU per variant (830M preset, layers cut), kernel=auto and the
               other explicit path; one orbax save/restore that must reproduce the next losses
  profile      where a train step's time goes: device kernels per variant by name and class
  decode       KV-cache generation: prefill 2K then 256 tokens, batch 1 and 32
  tests        the CPU test suite's fast subset on this stack
Each stage writes OUT/gpu_check_<stage>.json after every cell, so a stage stopped by its time
cap keeps what it finished; a failing cell records its error and the stage goes on.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pkgutil
import platform
import re
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
# Run as a script this module is __main__; the stage modules' `import gpu_check` must get this
# same module (its OPTIONS, set by main), not a second copy.
sys.modules.setdefault("gpu_check", sys.modules[__name__])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import diff_transformer  # noqa: E402
from diff_transformer.errors import first_line  # noqa: E402
from diff_transformer.paths import write_atomic  # noqa: E402
from diff_transformer.training.peak import calibrate_tflops  # noqa: E402

STAGES = ("env", "correctness", "kernels", "train", "profile", "decode", "tests")
EXTRA_STAGES = ("train_orbax",)  # the orbax check alone (a short rerun)
PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax",
            "orbax-checkpoint", "chex", "grain", "ml-collections", "numpy", "triton",
            "tensorboardX")
HF_EXTRA = ("transformers", "torch", "safetensors", "lm_eval", "accelerate", "tiktoken")
# The CPU suite's fast subset for the `tests` stage: kernels, model, training units, decoding.
TEST_SUBSET = ("tests/test_attention_numerics.py", "tests/test_pallas_kernel.py",
               "tests/test_model.py", "tests/test_training_units.py",
               "tests/test_eval_kvcache.py", "tests/test_config.py", "tests/test_params.py",
               "tests/test_variant_registry.py", "tests/test_attention_cost.py")


# Set by main from the command line: lengths (override a stage's GPU lengths), labels (the train
# stage's groups: auto, other), tag (appended to the output file's name, for a partial rerun),
# cases (the correctness groups to run).
OPTIONS: dict = dict(lengths=None, labels=("auto", "other"), tag="", cases=(), size="830m",
                     remat="none", train_tokens=16384)


def lengths_or(default: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(OPTIONS["lengths"]) if OPTIONS["lengths"] else default


class Record:
  """One stage's JSON, rewritten (atomically) after every cell."""

  def __init__(self, out: Path, stage: str, **fields):
    self.path = out / f"gpu_check_{stage}{OPTIONS['tag']}.json"
    device = jax.devices()[0]
    self.data = dict(stage=stage, device=f"{device.platform}:{device.device_kind}",
                     driver=nvidia_smi().get("driver_version") if device.platform == "gpu" else None,
                     versions=versions(), xla_flags=os.environ.get("XLA_FLAGS", ""),
                     host=platform.node(), started=time.time(), **fields, cells=[])
    self.write()

  def add(self, cell: dict) -> dict:
    self.data["cells"].append(cell)
    self.write()
    return cell

  def set(self, **fields) -> None:
    self.data.update(fields)
    self.write()

  def write(self) -> None:
    self.data["seconds"] = round(time.time() - self.data["started"], 1)
    write_atomic(self.path, json.dumps(self.data, indent=1, default=_jsonable) + "\n")


def _jsonable(x):
  if isinstance(x, (np.floating, np.integer, np.bool_)):
    return x.item()
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  return str(x)


class Deadline:
  def __init__(self, seconds: float):
    self.end = time.time() + seconds

  def left(self) -> float:
    return self.end - time.time()


def error_text(e: BaseException) -> str:
  return f"{type(e).__name__}: {first_line(e, 400)}"


def lower_or_error(fn, *args):
  """jit(fn).lower(*args), or the exception (a path that rejects the shapes fails here)."""
  try:
    return jax.jit(fn).lower(*args)
  except Exception as e:  # recorded per cell
    return e


def compile_all(lowered: dict, workers: int) -> dict:
  """{key: compiled executable or exception}. XLA compiles release the GIL, so a thread pool
  compiles many programs at once; nothing is timed while this runs."""
  def one(low):
    if isinstance(low, BaseException):
      return low
    try:
      return low.compile()
    except Exception as e:  # recorded per cell
      return e

  with ThreadPoolExecutor(max(1, workers)) as pool:
    return dict(zip(lowered, pool.map(one, lowered.values())))


def interleaved_times(calls: dict, rounds: int, inner: int, deadline: Deadline | None = None
                      ) -> dict:
  """{key: [seconds per call, one per round]}: each call warmed once, then A B C, A B C, ...
  so a change in the device's state hits every call alike."""
  for call in calls.values():
    jax.block_until_ready(call())
  times = {k: [] for k in calls}
  for _ in range(rounds):
    if deadline is not None and deadline.left() < 0 and all(times.values()):
      break
    for k, call in calls.items():
      start = time.perf_counter()
      for _ in range(inner):
        out = call()
      jax.block_until_ready(out)
      times[k].append((time.perf_counter() - start) / inner)
  return times


def temp_bytes(compiled) -> int | None:
  try:
    return int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # not every backend reports it
    return None


# ------------------------------------------------------------------------------------- env


def versions() -> dict:
  out = {"python": sys.version.split()[0]}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def cudnn_info() -> dict:
  """The cuDNN version jax loaded, and whether the exact layout (kernels/cudnn.py) runs here."""
  from diff_transformer.kernels import cudnn  # as the stage modules do: after main's options
  try:
    from jax._src.cudnn import fused_attention_stablehlo as entry
    version = entry.check_cudnn_version()
  except Exception as e:  # no GPU plugin, or no cuDNN: recorded
    version = error_text(e)
  return dict(version=version, exact_layout=cudnn.exact_reason() or "runs")


def nvidia_smi() -> dict:
  query = "name,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit,compute_cap"
  try:
    text = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=20).stdout.strip()
  except (OSError, subprocess.TimeoutExpired) as e:
    return {"error": error_text(e)}
  return dict(zip(query.split(","), (v.strip() for v in text.split("\n")[0].split(","))))


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


def stage_env(out: Path, cpu: bool, seconds: float) -> None:
  del seconds
  rec = Record(out, "env", cpu_mode=cpu, devices=[str(d) for d in jax.devices()],
               nvidia_smi={} if cpu else nvidia_smi(), cudnn=cudnn_info())
  try:
    info = jax.print_environment_info(return_string=True)
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
  failed, no_extra, count = {}, {}, 0
  for module in pkgutil.walk_packages(diff_transformer.__path__, "diff_transformer."):
    count += 1
    try:
      importlib.import_module(module.name)
    except ModuleNotFoundError as e:
      (no_extra if e.name and e.name.split(".")[0] in HF_EXTRA else failed)[module.name] = error_text(e)
    except Exception as e:  # recorded
      failed[module.name] = error_text(e)
  return dict(modules=count, failed=failed, hf_extra_missing=no_extra)


# ----------------------------------------------------------------------------------- tests


def stage_tests(out: Path, cpu: bool, seconds: float) -> None:
  """The subset under pytest -n 8 on this stack (CPU). Output goes to a file as it comes, so a
  run stopped by the cap still records which tests failed so far (-rfE lists them at the end)."""
  rec = Record(out, "tests", subset=list(TEST_SUBSET))
  if cpu:
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
                            timeout=max(10.0, seconds - 5))
      status = dict(returncode=proc.returncode)
    except subprocess.TimeoutExpired:
      status = dict(returncode=None, timed_out=True)
  text = log.read_text()
  rec.set(**status, wall_s=round(time.time() - start, 1), tail=text[-6000:],
          failed=[line for line in text.splitlines()
                  if line.startswith(("FAILED", "ERROR")) or re.search(r"tests/\S+:\d+: ", line)],
          summary=text.strip().split("\n")[-1] if text.strip() else "")


# ------------------------------------------------------------------------------------ main


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--stage", choices=STAGES + EXTRA_STAGES + ("all",), default="all")
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  p.add_argument("--cpu", action="store_true", help="tiny shapes, Pallas interpreted")
  p.add_argument("--seconds", type=float, default=120.0, help="this stage's time cap")
  p.add_argument("--train_layers", type=int, default=12, help="layer cut of the preset; 0: its "
                 "full depth")
  p.add_argument("--size", default="830m", help="the configs/scaling.py preset size the kernels, "
                 "train, profile and decode stages use (e.g. 3b)")
  p.add_argument("--remat", default="none", help="train and profile: model.remat")
  p.add_argument("--train_tokens", type=int, default=16384, help="train: tokens per step")
  p.add_argument("--lengths", default="", help="comma-separated T replacing the stage's (GPU)")
  p.add_argument("--labels", default="auto,other", help="train: kernel=auto and/or the other path")
  p.add_argument("--tag", default="", help="suffix of the output file's name")
  p.add_argument("--cases", default="", help="correctness: the groups to run, e.g. "
                 "gqa:256,packed:256,mha:2048 (layout or packed, then T)")
  args = p.parse_args()
  OPTIONS.update(lengths=[int(t) for t in args.lengths.split(",") if t] or None,
                 labels=tuple(args.labels.split(",")), tag=args.tag,
                 cases=tuple(c for c in args.cases.split(",") if c), size=args.size,
                 remat=args.remat, train_tokens=args.train_tokens)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  import gpu_check_kernels  # the stage modules import this one (Record, compile_all, ...)
  import gpu_check_model
  run = dict(env=stage_env, correctness=gpu_check_kernels.stage_correctness,
             kernels=gpu_check_kernels.stage_kernels, tests=stage_tests,
             train=lambda o, c, s: gpu_check_model.stage_train(o, c, s, args.train_layers),
             train_orbax=lambda o, c, s: gpu_check_model.stage_train(o, c, s, args.train_layers,
                                                                     timing=False),
             profile=lambda o, c, s: gpu_check_model.stage_profile(o, c, s, args.train_layers),
             decode=lambda o, c, s: gpu_check_model.stage_decode(o, c, s, args.train_layers))
  for stage in (STAGES if args.stage == "all" else (args.stage,)):
    start = time.time()
    print(f"== {stage}", flush=True)
    run[stage](out, args.cpu, args.seconds)
    print(f"== {stage} done in {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
  main()
