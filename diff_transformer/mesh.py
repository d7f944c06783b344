"""The device mesh (data, fsdp, tensor), multi-host start-up, and global batch assembly.

The mesh uses Auto axis types so the logical rules of sharding.py drive GSPMD propagation.
Every inconsistency between config and hardware is a TrainError with one line naming the field.
"""
from __future__ import annotations

import math
import os

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding

from diff_transformer.errors import TrainError
from diff_transformer.model.spec import ModelSpec
from diff_transformer.sharding import BATCH, LENGTH, MESH_AXES, logical_to_spec


DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"


def request_determinism(deterministic: bool) -> bool:
  """train.deterministic: XLA's deterministic-ops flag in XLA_FLAGS, which XLA reads when the
  backend starts (so before any device is touched). Returns whether the flag was added."""
  flags = os.environ.get("XLA_FLAGS", "")
  if not deterministic or DETERMINISTIC_FLAG in flags.split():
    return False
  from jax._src import xla_bridge  # jax's public API cannot tell whether the backend started
  if xla_bridge.backends_are_initialized():
    raise TrainError("train.deterministic: the device backend already started; set it on "
                     "train.py's command line or in XLA_FLAGS before jax starts")
  os.environ["XLA_FLAGS"] = f"{flags} {DETERMINISTIC_FLAG}".strip()
  return True


def detect_cluster() -> str | None:
  """The cluster kind jax.distributed.initialize() can configure itself from, if any."""
  env = os.environ
  if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env:
    return "slurm"
  if len([h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
    return "tpu-pod"
  if "MEGASCALE_COORDINATOR_ADDRESS" in env:
    return "tpu-multislice"
  if int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
    return "open-mpi"
  return None


def initialize_distributed(coordinator_address: str = "", num_processes: int = 0,
                           process_id: int = -1) -> str:
  """Starts jax.distributed when the job spans several processes; returns how it was set up.

  Must run before anything touches the devices. Explicit flags win; otherwise TPU pods, SLURM
  and Open MPI are detected from their environment; a lone process needs nothing.
  """
  explicit = bool(coordinator_address) or num_processes > 1
  if explicit:
    if not coordinator_address or num_processes < 1 or not 0 <= process_id < num_processes:
      raise TrainError("--coordinator_address, --num_processes and --process_id must be given "
                       f"together with 0 <= process_id < num_processes (got "
                       f"'{coordinator_address}', {num_processes}, {process_id})")
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
      # CPU processes need a collectives backend to talk to each other (gloo on CPU).
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return f"explicit ({num_processes} processes)"
  kind = detect_cluster()
  if kind is not None:
    jax.distributed.initialize()  # reads the coordinator and ranks from the environment
    return kind
  return "single process"


def mesh_shape(mesh_config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with a -1 axis resolved to the remaining devices."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  free = [i for i, s in enumerate(sizes) if s == -1]
  if len(free) > 1:
    raise TrainError(f"mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
  fixed = math.prod(s for s in sizes if s != -1)
  if free:
    if num_devices % fixed:
      raise TrainError(f"mesh: fixed axes {dict(zip(MESH_AXES, sizes))} use {fixed} devices, "
                       f"which does not divide the {num_devices} devices available")
    sizes[free[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise TrainError(f"mesh: data*fsdp*tensor = {'*'.join(map(str, sizes))} = "
                     f"{math.prod(sizes)} but {num_devices} devices are available")
  data, fsdp, tensor = sizes
  return data, fsdp, tensor


def make_mesh(mesh_config: ml_collections.ConfigDict, devices=None) -> jax.sharding.Mesh:
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(mesh_config, len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  if devices == jax.devices():
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto)  # topology-aware device order
  return jax.sharding.Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=auto)


def data_parallel_size(mesh: jax.sharding.Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_parallelism(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                      spec: ModelSpec) -> None:
  """The config/mesh constraints the sharded step relies on, one clear line each."""
  t, m = config.train, config.model
  dp, tp = data_parallel_size(mesh), mesh.shape["tensor"]
  if t.global_batch_size % (dp * t.micro_batches):
    raise TrainError(
        f"train.global_batch_size: {t.global_batch_size} must be divisible by the data-parallel "
        f"size data*fsdp = {dp} times train.micro_batches = {t.micro_batches} (each micro-batch "
        f"is split evenly over the data-parallel devices)")
  if t.global_batch_size % jax.process_count():
    raise TrainError(f"train.global_batch_size: {t.global_batch_size} must be divisible by the "
                     f"process count {jax.process_count()}")
  if m.num_heads % tp:
    raise TrainError(f"model.num_heads: {m.num_heads} heads are not divisible by mesh.tensor = "
                     f"{tp}")
  kv_heads = spec.kv_heads
  if kv_heads % tp:
    raise TrainError(f"model.num_kv_heads: {kv_heads} kv heads are not divisible by "
                     f"mesh.tensor = {tp}")


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Rows over the data-parallel axes (the 'batch' rule), sequence replicated."""
  return NamedSharding(mesh, logical_to_spec((BATCH, LENGTH)))


def global_batch(mesh: jax.sharding.Mesh, local_batch: dict[str, np.ndarray]
                 ) -> dict[str, jax.Array]:
  """Each process passes its rows; the result is one global array per field."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


def local_rows(x) -> np.ndarray:
  """The rows this process holds: a host array as it is, a global array's addressable shards."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.concatenate([np.asarray(s.data) for s in x.addressable_shards])
  return np.asarray(x)
