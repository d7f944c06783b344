"""Ahead-of-time compilation of the full sharded train step for a TPU topology, on a CPU machine.

libtpu (the `tpu` extra) compiles for abstract TPU devices from
`jax.experimental.topologies.get_topology_desc`; `compiled.memory_analysis()` then gives the
per-chip memory of the real executable. Nothing runs; nothing needs a TPU.
"""
from __future__ import annotations

import dataclasses
import os
import re

import jax
import jax.numpy as jnp
import ml_collections

from diff_transformer import kernels
from diff_transformer.errors import UserError, first_line
from diff_transformer.model.attention import spec_from_config
from diff_transformer.mesh import (batch_sharding, check_parallelism, data_parallel_size,
                                            make_mesh)
from diff_transformer.training.step import Trainer

# HBM per chip in GiB, by topology prefix.
HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}
GIB = 1024 ** 3
# <generation>:<chips per dimension>, e.g. v5e:2x2, v5p:4x4x4 (checked before libtpu sees it).
TOPOLOGY_NAME = re.compile(r"v[0-9]+[a-z]*:[0-9]+(x[0-9]+){1,2}")


class AotError(UserError, RuntimeError):
  """A topology name or libtpu problem; the message is one line naming --topology."""


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
  hbm_gib: float = 0.0
  error: str = ""


def topology_devices(topology: str):
  if not TOPOLOGY_NAME.fullmatch(topology):
    raise AotError(f"--topology: '{topology}' is not a TPU topology name like v5e:2x2, "
                   "v5p:4x4x4 or v6e:16x16 (generation:chips per dimension)")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # libtpu's lock would bar a second compiler
  try:
    from jax.experimental import topologies
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
  except Exception as e:  # noqa: BLE001 - libtpu missing or an unknown name: one clear line
    raise AotError(f"--topology: cannot get TPU topology '{topology}' ({first_line(e)}); install the "
                       "tpu extra (pip install -e '.[tpu]') and use names like v5e:2x2, v5p:4x4x4")


def compile_train_step(config: ml_collections.ConfigDict, topology: str) -> AotResult:
  """Lower and compile Trainer's train step for `topology`; report per-chip memory."""
  devices = topology_devices(topology)
  mesh = make_mesh(config.mesh, devices=devices)
  spec = spec_from_config(config.model)
  check_parallelism(config, mesh, spec)
  hbm = HBM_GIB.get(topology.split(":")[0], 0.0)
  seq, batch = config.data.seq_len, config.train.global_batch_size
  result = AotResult(topology, dict(mesh.shape), batch // data_parallel_size(mesh), seq, compiled=False, fits=False,
                     hbm_gib=hbm)
  trainer = Trainer(config, mesh, spec)
  sharding = batch_sharding(mesh)
  abstract_batch = {k: jax.ShapeDtypeStruct((batch, seq), dtype, sharding=sharding)
                    for k, dtype in (("inputs", jnp.int32), ("targets", jnp.int32),
                                     ("segment_ids", jnp.int32), ("positions", jnp.int32),
                                     ("weights", jnp.float32))}
  try:
    with kernels.auto.target_platform("tpu"):  # kernel='auto' as it runs on the TPU: pallas
      compiled = trainer.lower_train_step(abstract_batch).compile()
  except Exception as e:  # noqa: BLE001 - out-of-memory and other compile errors are results
    result.error = first_line(e)
    return result
  mem = compiled.memory_analysis()
  result.compiled = True
  if mem is None:
    result.error = f"the compiler for {topology} reports no memory analysis"
    return result
  result.argument_gib = mem.argument_size_in_bytes / GIB
  result.output_gib = mem.output_size_in_bytes / GIB
  result.temp_gib = mem.temp_size_in_bytes / GIB
  result.alias_gib = mem.alias_size_in_bytes / GIB
  result.total_gib = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                      + mem.temp_size_in_bytes - mem.alias_size_in_bytes) / GIB
  result.fits = not hbm or result.total_gib <= hbm
  return result


def data_parallel_size_on(config: ml_collections.ConfigDict, topology: str) -> int:
  """Batch rows per step are global_batch_size / this on `topology` (config.mesh laid out)."""
  return data_parallel_size(make_mesh(config.mesh, devices=topology_devices(topology)))


def largest_fitting_batch(config: ml_collections.ConfigDict, topology: str,
                          start_per_device: int) -> int:
  """Halve the per-device batch until the step compiles within HBM (0 if even 1 does not)."""
  dp = data_parallel_size_on(config, topology)
  per_device = start_per_device
  while per_device >= 1:
    c = ml_collections.ConfigDict(config.to_dict())
    c.train.global_batch_size = per_device * dp
    c.train.micro_batches = 1
    result = compile_train_step(c, topology)
    if result.compiled and result.fits:
      return per_device
    per_device //= 2
  return 0
