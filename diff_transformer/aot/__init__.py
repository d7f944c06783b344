"""Ahead-of-time compilation of the full sharded train step for a TPU slice or NVIDIA GPU nodes,
on a CPU machine: nothing runs, nothing needs the accelerator.

- TPU (`v5e:2x2`, `v5p:4x4x4`): libtpu (the `tpu` extra) compiles for abstract TPU devices from
  `jax.experimental.topologies.get_topology_desc`.
- GPU (`h100:8`, `h200:8`, `h100:2x8`): jax's CUDA plugin (the `gpu-aot` extra) compiles for
  compile-only devices described by the project's target configs (aot/gpu.py), with jax's cuDNN
  entry answered as on that GPU (kernels/cudnn_layout.py `deviceless`); the optimised HLO's
  kernels are read back (aot/hlo.py).

`compiled.memory_analysis()` then gives the per-device memory of the real executable.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time

import jax
import jax.numpy as jnp
import ml_collections

from diff_transformer import kernels
from diff_transformer.aot import gpu as gpu_targets
from diff_transformer.aot import inventory
from diff_transformer.aot.gpu import GIB
from diff_transformer.aot.hlo import Hlo
from diff_transformer.errors import UserError, first_line
from diff_transformer.kernels import cudnn
from diff_transformer.model.attention import spec_from_config
from diff_transformer.mesh import (batch_sharding, check_parallelism, data_parallel_size,
                                   make_mesh)
from diff_transformer.training.step import Trainer

# HBM per chip in GiB, by topology prefix.
HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}
# <generation>:<chips per dimension>, e.g. v5e:2x2, v5p:4x4x4 (checked before libtpu sees it).
TOPOLOGY_NAME = re.compile(r"v[0-9]+[a-z]*:[0-9]+(x[0-9]+){1,2}")


class AotError(UserError, RuntimeError):
  """A topology name or compiler problem; the message is one line naming --topology."""


@dataclasses.dataclass
class AotResult:
  topology: str
  mesh: dict
  per_device_batch: int
  seq_len: int
  compiled: bool
  fits: bool
  argument_gib: float = 0.0
  output_gib: float = 0.0
  temp_gib: float = 0.0
  alias_gib: float = 0.0
  total_gib: float = 0.0
  hbm_gib: float = 0.0  # the device's memory
  error: str = ""
  device_kind: str = ""
  devices: int = 0
  nodes: int = 1
  remat: str = ""
  micro_batches: int = 1
  document_mask: bool = False
  # GPU: the memory jax may use (the fraction of hbm_gib, stated) and what a fit keeps free of it
  memory_fraction: float = 1.0
  usable_gib: float = 0.0
  margin_gib: float = 0.0
  compile_seconds: float = 0.0
  kernels: dict = dataclasses.field(default_factory=dict)  # the optimised HLO's (GPU)


@dataclasses.dataclass(frozen=True)
class Target:
  """Where a step is compiled for: its devices, memory per device, and how kernels are chosen."""
  name: str
  platform: str  # "tpu" or "gpu"
  devices: list
  hbm_bytes: float
  nodes: int = 1
  memory_fraction: float = 1.0
  gpu: gpu_targets.Gpu | None = None


def target(topology: str, memory_fraction: float | None = None) -> Target:
  """The compile target a --topology names (a TPU slice or GPU nodes); one-line errors."""
  if TOPOLOGY_NAME.fullmatch(topology):
    return Target(topology, "tpu", topology_devices(topology),
                  HBM_GIB.get(topology.split(":")[0], 0.0) * GIB)
  if not gpu_targets.TOPOLOGY.fullmatch(topology):
    raise AotError(f"--topology: '{topology}' is neither a TPU topology (v5e:2x2, v5p:4x4x4) nor "
                   "GPU nodes (h100:8, h200:8, h100:2x8)")
  nodes = gpu_targets.parse(topology)
  fraction = gpu_targets.memory_fraction() if memory_fraction is None else memory_fraction
  return Target(topology, "gpu", list(gpu_targets.devices(nodes)), nodes.gpu.memory_bytes,
                nodes.nodes, fraction, nodes.gpu)


def topology_devices(topology: str):
  if not TOPOLOGY_NAME.fullmatch(topology):
    raise AotError(f"--topology: '{topology}' is not a TPU topology name like v5e:2x2, "
                   "v5p:4x4x4 or v6e:16x16 (generation:chips per dimension)")
  # libtpu's lock would bar a second compiler
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    from jax.experimental import topologies
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
  except Exception as e:  # noqa: BLE001 - libtpu missing or an unknown name: one clear line
    raise AotError(f"--topology: cannot get TPU topology '{topology}' ({first_line(e)}); "
                   "install the tpu extra (pip install -e '.[tpu]') and use names like v5e:2x2, "
                   "v5p:4x4x4")


def for_target(where: Target):
  """The context a step is traced in for `where`: 'auto' kernels as they run there."""
  if where.platform == "gpu":
    assert where.gpu is not None
    return cudnn.deviceless(gpu_targets.CUDNN_VERSION, where.gpu.compute_capability)
  return kernels.auto.target_platform("tpu")  # kernel='auto' as it runs on the TPU: pallas


def compile_step(config: ml_collections.ConfigDict, where: Target):
  """(the compiled train step, its mesh) for `where` (raises what the compiler raises)."""
  mesh = make_mesh(config.mesh, devices=where.devices)
  spec = spec_from_config(config.model)
  check_parallelism(config, mesh, spec)
  seq, batch = config.data.seq_len, config.train.global_batch_size
  trainer = Trainer(config, mesh, spec)
  sharding = batch_sharding(mesh)
  abstract_batch = {k: jax.ShapeDtypeStruct((batch, seq), dtype, sharding=sharding)
                    for k, dtype in (("inputs", jnp.int32), ("targets", jnp.int32),
                                     ("segment_ids", jnp.int32), ("positions", jnp.int32),
                                     ("weights", jnp.float32))}
  with for_target(where):
    return trainer.lower_train_step(abstract_batch).compile(), mesh


def compile_train_step(config: ml_collections.ConfigDict, topology: str | Target) -> AotResult:
  """Lower and compile Trainer's train step for `topology`; report per-device memory (and, for
  a GPU, the optimised HLO's kernels). A compile error is the result's `error`."""
  where = topology if isinstance(topology, Target) else target(topology)
  data_parallel = data_parallel_size(make_mesh(config.mesh, devices=where.devices))
  rows_per_device = config.train.global_batch_size // data_parallel // config.train.micro_batches
  result = AotResult(where.name, {}, rows_per_device,
                     config.data.seq_len, compiled=False, fits=False,
                     hbm_gib=where.hbm_bytes / GIB, device_kind=str(where.devices[0].device_kind),
                     devices=len(where.devices), nodes=where.nodes, remat=config.model.remat,
                     micro_batches=config.train.micro_batches,
                     document_mask=bool(config.data.document_mask),
                     memory_fraction=where.memory_fraction,
                     usable_gib=where.hbm_bytes * where.memory_fraction / GIB)
  start = time.perf_counter()
  try:
    compiled, mesh = compile_step(config, where)
  except Exception as e:  # noqa: BLE001 - out-of-memory and other compile errors are results
    result.error = first_line(e)
    return result
  result.compile_seconds = round(time.perf_counter() - start, 2)
  result.mesh = dict(mesh.shape)
  mem = compiled.memory_analysis()
  result.compiled = True
  if mem is None:
    result.error = f"the compiler for {where.name} reports no memory analysis"
    return result
  result.argument_gib = mem.argument_size_in_bytes / GIB
  result.output_gib = mem.output_size_in_bytes / GIB
  result.temp_gib = mem.temp_size_in_bytes / GIB
  result.alias_gib = mem.alias_size_in_bytes / GIB
  result.total_gib = peak_bytes(mem) / GIB
  if where.platform == "gpu":
    result.kernels = inventory.inventory(Hlo(compiled.as_text()))
    dq_bytes = result.kernels["cudnn"]["largest_dq_accumulator_bytes"]
    margin = gpu_targets.FIXED_MARGIN_BYTES + dq_bytes
    result.margin_gib = margin / GIB
  result.fits = not result.usable_gib or result.total_gib + result.margin_gib <= result.usable_gib
  return result


def peak_bytes(mem) -> int:
  """A compiled program's peak per device from its memory analysis: arguments + outputs +
  temporaries, less what the outputs alias."""
  return (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
          - mem.alias_size_in_bytes)


def data_parallel_size_on(config: ml_collections.ConfigDict, topology: str | Target) -> int:
  """Batch rows per step are global_batch_size / this on `topology` (config.mesh laid out)."""
  where = topology if isinstance(topology, Target) else target(topology)
  return data_parallel_size(make_mesh(config.mesh, devices=where.devices))


def largest_fitting_batch(config: ml_collections.ConfigDict, topology: str | Target,
                          start_per_device: int) -> int:
  """Halve the per-device batch until the step compiles within memory (0 if even 1 does not)."""
  where = topology if isinstance(topology, Target) else target(topology)
  dp = data_parallel_size_on(config, where)
  per_device = start_per_device
  while per_device >= 1:
    c = ml_collections.ConfigDict(config.to_dict())
    c.train.global_batch_size = per_device * dp
    c.train.micro_batches = 1
    result = compile_train_step(c, where)
    if result.compiled and result.fits:
      return per_device
    per_device //= 2
  return 0
