"""NVIDIA GPU nodes as compile targets on a host without a GPU (no driver, no cuDNN library).

jax's CUDA plugin (the `gpu-aot` extra: jax-cuda12-plugin and jax-cuda12-pjrt of the installed
jax, and nvidia-cuda-nvcc-cu12 for ptxas; not the `cuda12` extra's GBs of runtime libraries)
compiles for devices described by a GpuTargetConfigProto (`target_config`, below) under
JAX_PLATFORMS=cpu: `jax.experimental.topologies.get_topology_desc(platform="cuda", ...)` gives
compile-only devices; a program compiled for them gives its memory analysis and optimised HLO.
What the compile cannot see: cuDNN's workspace (the cuDNN graph is built on the device at run
time) and autotuning (nothing is measured), so a fit keeps a margin for them (FIXED_MARGIN_BYTES
plus the modelled dQ accumulator).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from diff_transformer.errors import UserError

GIB = 1024 ** 3
MIB = 1024 ** 2
# jax preallocates this fraction of a GPU's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says
# otherwise (jax's GPU memory documentation); a job sets it explicitly (GPU.launch_fraction).
JAX_DEFAULT_FRACTION = 0.75
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# The cuDNN version jax's cuDNN entry is told while tracing (9.12: at or above the 9.10.2 the
# exact layout needs); the H200 image's own is in benchmarks/results/gpu_check_env.json.
CUDNN_VERSION = 91200
# What a fit keeps free beyond the compiled peak: cuDNN's workspace and what autotuning may
# choose, neither seen without a device, plus the largest modelled cuDNN dQ accumulator
# (aot/hlo.py). 1 GiB is a choice, to be replaced by the first on-device measurement.
FIXED_MARGIN_BYTES = 1 * GIB


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One GPU kind's facts, as a compile target. memory_bytes: the total nvidia-smi reports."""
  name: str  # jax's device_kind
  memory_bytes: int
  bandwidth: float  # HBM bytes/s (the vendor's peak)
  compute_capability: float = 9.0
  core_count: int = 132
  clock_ghz: float = 1.98
  l2_bytes: int = 50 * MIB
  launch_fraction: float = 0.90  # XLA_PYTHON_CLIENT_MEM_FRACTION a job sets for this kind


# H100 SXM (80 GB HBM3) and H200 (141 GB HBM3e): SXM parts, 132 SMs at 1.98 GHz, Hopper (9.0).
# H200's 143,771 MiB is what nvidia-smi reported on the H200 the GPU check ran on
# (benchmarks/results/gpu_check_env.json); H100's 81,559 MiB is nvidia-smi's for an
# H100 80GB HBM3.
GPUS = {
    "h100": Gpu("NVIDIA H100 80GB HBM3", 81559 * MIB, 3.35e12),
    "h200": Gpu("NVIDIA H200", 143771 * MIB, 4.8e12),
}
# <gpu>:<gpus per node> or <gpu>:<nodes>x<gpus per node>, e.g. h100:8, h200:1, h100:2x8.
TOPOLOGY = re.compile(
    r"(?P<gpu>[a-z][a-z0-9]*):(?:(?P<nodes>[1-9][0-9]*)x)?(?P<per_node>[1-9][0-9]*)")


@dataclasses.dataclass(frozen=True)
class GpuTopology:
  gpu: Gpu
  kind: str  # h100, h200
  nodes: int
  per_node: int

  @property
  def count(self) -> int:
    return self.nodes * self.per_node


def parse(name: str) -> GpuTopology:
  """'h100:8' -> one node of 8 H100s; 'h100:2x8' -> two nodes of 8. A one-line error names
  --topology and the GPUs known."""
  m = TOPOLOGY.fullmatch(name)
  if not m or m["gpu"] not in GPUS:
    raise UserError(f"--topology: '{name}' is not a GPU topology: give <gpu>:<gpus per node> or "
                    f"<gpu>:<nodes>x<gpus per node> with gpu one of {', '.join(GPUS)} "
                    "(e.g. h100:8, h200:2x8)")
  return GpuTopology(GPUS[m["gpu"]], m["gpu"], int(m["nodes"] or 1), int(m["per_node"]))


def memory_fraction() -> float:
  """The fraction of a GPU's memory jax takes: XLA_PYTHON_CLIENT_MEM_FRACTION, else jax's
  default; a value outside (0, 1] is one line naming the variable."""
  text = os.environ.get(MEM_FRACTION_ENV, "")
  if not text:
    return JAX_DEFAULT_FRACTION
  try:
    value = float(text)
  except ValueError:
    value = -1.0
  if not 0 < value <= 1:
    raise UserError(f"{MEM_FRACTION_ENV}: '{text}' is not a fraction in (0, 1]")
  return value


def target_config(gpu: Gpu) -> str:
  """The GpuTargetConfigProto text XLA compiles for: the device facts XLA's GPU compiler reads
  (thread and memory limits, SMs, clocks, bandwidth, L2), kept to fields every jax the project
  admits parses (jax 0.10.2 to 0.12)."""
  major, minor = divmod(round(gpu.compute_capability * 10), 10)
  return "\n".join([
      "gpu_device_info {",
      "  threads_per_block_limit: 1024",
      "  threads_per_warp: 32",
      "  shared_memory_per_block: 49152",
      "  shared_memory_per_core: 233472",  # 228 KiB per SM on Hopper
      "  threads_per_core_limit: 2048",
      f"  core_count: {gpu.core_count}",
      "  fpus_per_core: 128",
      "  block_dim_limit_x: 2147483647",
      "  block_dim_limit_y: 65535",
      "  block_dim_limit_z: 65535",
      f"  memory_bandwidth: {int(gpu.bandwidth)}",
      f"  l2_cache_size: {gpu.l2_bytes}",
      f"  clock_rate_ghz: {gpu.clock_ghz}",
      f"  device_memory_size: {gpu.memory_bytes}",
      "  shared_memory_per_block_optin: 232448",
      f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
      "  registers_per_core_limit: 65536",
      "  registers_per_block_limit: 65536",
      "}",
      'platform_name: "CUDA"',
      f"dnn_version_info {{ major: {CUDNN_VERSION // 10000} minor: {CUDNN_VERSION // 100 % 100} "
      f"patch: {CUDNN_VERSION % 100} }}",
      f'device_description_str: "{gpu.name}"',
      ""])


def missing_extra() -> str:
  """'' when this environment can compile for a CUDA GPU, else what is missing (one line)."""
  if importlib.util.find_spec("jax_plugins") is None or not any(
      importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)):
    return "jax's CUDA plugin is not installed"
  if importlib.util.find_spec("nvidia") is None or not _ptxas():
    return "ptxas (nvidia-cuda-nvcc-cu12) is not installed"
  return ""


def _ptxas() -> bool:
  import nvidia
  for root in getattr(nvidia, "__path__", []):
    for sub in ("cuda_nvcc/bin/ptxas", "cu13/bin/ptxas"):
      if os.path.exists(os.path.join(root, sub)):
        return True
  return False


def devices(topology: GpuTopology):
  """Compile-only devices of the topology (jax's CUDA plugin; no GPU needed)."""
  why = missing_extra()
  if why:
    raise UserError(f"--topology: compiling for {topology.kind} needs the gpu-aot extra ({why}): "
                    "pip install -e '.[gpu-aot]'")
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")  # no driver here to check
  from jax.experimental import topologies
  try:
    return topologies.get_topology_desc(
        platform="cuda", topology=f"1x{topology.nodes}x{topology.per_node}",
        target_config=target_config(topology.gpu)).devices
  except Exception as e:  # noqa: BLE001 - the plugin's own message, as one line
    raise UserError(f"--topology: the CUDA plugin cannot describe {topology.count} "
                    f"{topology.gpu.name} ({str(e).splitlines()[0] if str(e) else e!r})") from None
