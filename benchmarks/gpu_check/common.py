"""What the GPU check's stages share: the command line's options, one stage's run and its JSON
record, time caps, compiling many programs at once, interleaved timing, the model configs they
build."""
from __future__ import annotations

import dataclasses
import gzip
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np

from benchmarks.bench_common import paper_config, small_config
from diff_transformer.errors import first_line
from diff_transformer.kernels import auto, cudnn
from diff_transformer.model.attention import PAPER_VARIANTS
from diff_transformer.paths import write_atomic

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax",
            "orbax-checkpoint", "chex", "grain", "ml-collections", "numpy", "triton",
            "tensorboardX")


@dataclasses.dataclass(frozen=True)
class Options:
  """The command line's choices (__main__.py): lengths (replace a stage's GPU lengths), labels
  (the train stage's groups: auto, other), tag (appended to the output files' names, for a
  partial rerun), cases (the correctness groups to run), size / train_layers / remat /
  train_tokens (the preset the model stages build), states and rounds (train: all | one | auto,
  as train.one_state_at_a_time says; its timed rounds on a GPU), command_buffers and batches
  (decode: the step's compile settings, the batch sizes replacing the stage's on a GPU),
  variants and paths (what the correctness, kernels and train stages run; empty paths: all),
  masks (train and kernels: causal rows and/or document-masked rows; empty: the stage's own,
  train causal, kernels document), document_variants (train: the variants timed masked),
  dtypes (correctness on a GPU)."""
  lengths: tuple[int, ...] = ()
  labels: tuple[str, ...] = ("auto", "other")
  tag: str = ""
  cases: tuple[str, ...] = ()
  size: str = "830m"
  train_layers: int = 12
  remat: str = "none"
  train_tokens: int = 16384
  states: str = "auto"
  rounds: int = 5
  command_buffers: tuple[str, ...] = ("default",)
  batches: tuple[int, ...] = ()
  variants: tuple[str, ...] = PAPER_VARIANTS
  paths: tuple[str, ...] = ()
  masks: tuple[str, ...] = ()
  document_variants: tuple[str, ...] = ("diff", "transformer")
  dtypes: tuple[str, ...] = ("bfloat16", "float32")

  def lengths_or(self, default: tuple[int, ...]) -> tuple[int, ...]:
    return self.lengths or default

  def masks_or(self, default: tuple[str, ...]) -> tuple[str, ...]:
    return self.masks or default

  def chosen_paths(self, paths: dict) -> dict:
    """The stage's paths that `paths` names (all where it names none)."""
    return {k: v for k, v in paths.items() if not self.paths or k in self.paths}


@dataclasses.dataclass(frozen=True)
class StageRun:
  """One stage's run: its name (stages.py), where it writes, CPU mode, its time cap, options."""
  stage: str
  out: Path
  cpu: bool
  seconds: float
  options: Options = Options()


class Record:
  """One stage's JSON, rewritten (atomically) after every cell."""

  def __init__(self, run: StageRun, **fields):
    self.path = run.out / f"gpu_check_{run.stage}{run.options.tag}.json"
    device = jax.devices()[0]
    self.data = dict(stage=run.stage, device=f"{device.platform}:{device.device_kind}",
                     driver=(nvidia_smi().get("driver_version") if device.platform == "gpu"
                             else None),
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


def cudnn_refused(path: str, p) -> str:
  """Why cuDNN refuses kernel call `p` on `path` ('' where it takes it or the path is not
  cuDNN's): its dtype, or a head width (Shared DIFF's 3B heads are 102 wide); named and skipped
  rather than failing the stage's other cells. The padded layout checks one width (q/k padded to
  the value's), the exact layout q/k and values each."""
  if not path.startswith("cudnn") or jax.default_backend() != "gpu":
    return ""
  exact = path != "cudnn_padded" and not (path == "cudnn" and cudnn.exact_reason())
  return auto.cudnn_refusal(p.q1, p.k1, p.v, exact=exact)


def error_text(e: BaseException) -> str:
  return f"{type(e).__name__}: {first_line(e, 400)}"


def lower_or_error(fn, *args):
  """jit(fn).lower(*args), or the exception (a path that rejects the shapes fails here)."""
  try:
    return jax.jit(fn).lower(*args)
  except Exception as e:  # recorded per cell
    return e


def compile_all(lowered: dict, workers: int, options: dict | None = None) -> dict:
  """{key: compiled executable or exception}; options: {key: XLA compile options} for some keys.
  XLA compiles release the GIL, so a thread pool compiles many programs at once; nothing is
  timed while this runs."""
  def one(key):
    low = lowered[key]
    if isinstance(low, BaseException):
      return low
    try:
      return low.compile(compiler_options=(options or {}).get(key) or None)
    except Exception as e:  # recorded per cell
      return e

  with ThreadPoolExecutor(max(1, workers)) as pool:
    return dict(zip(lowered, pool.map(one, lowered)))


def save_hlo(run: StageRun, name: str, compiled) -> str:
  """A compiled program's optimised HLO, gzipped beside the records (which fusions and copies
  XLA made: a profile's hlo_op names point into it); returns the file's name."""
  path = run.out / f"gpu_check_{name}{run.options.tag}.txt.gz"
  path.write_bytes(gzip.compress(compiled.as_text().encode()))
  return path.name


def versions() -> dict:
  out: dict[str, str | None] = {"python": sys.version.split()[0]}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def nvidia_smi() -> dict:
  query = "name,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit,compute_cap"
  try:
    text = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=20).stdout.strip()
  except (OSError, subprocess.TimeoutExpired) as e:
    return {"error": error_text(e)}
  return dict(zip(query.split(","), (v.strip() for v in text.split("\n")[0].split(","))))


def model_config(run: StageRun, variant: str, *, seq_len: int, batch: int, kernel: str):
  """The model stages' config: the preset options.size names, its depth cut to
  options.train_layers (0: full depth), options.remat; on CPU a small config."""
  if run.cpu:  # the loop a GPU runs (model.layer_loop 'auto' scans there), at a small size
    c = small_config(variant, seq_len=seq_len, batch=batch, kernel=kernel)
    c.model.layer_loop = "scan"
    return c
  o = run.options
  c = paper_config(variant, seq_len=seq_len, batch=batch, layers=o.train_layers,
                   kernel=kernel, size=o.size)
  c.model.remat = o.remat
  return c
