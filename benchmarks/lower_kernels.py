"""Lower the fused differential Pallas kernels (forward and backward) without accelerators,
each variant's kernel call shaped by its own projection (model/attention.kernel_inputs).

- TPU (Mosaic): jit(...).trace(ShapeDtypeStructs).lower(lowering_platforms=("tpu",)) under an
  abstract mesh whose device kind is "TPU v5 lite" (Mosaic needs a TPU generation).
- GPU (Triton): lowering_platforms=("cuda",), backend="triton" (0.10.2 defaults to Mosaic GPU),
  under an abstract mesh of one "NVIDIA H100" (jax 0.11's Triton lowering asks for the generation).
- AOT (needs libtpu, `pip install "jax[tpu]==0.10.2"`): compile the shard_map wrapper for a
  v5e:2x2 topology (4 abstract chips, batch x heads mesh) and record memory_analysis().

  JAX_PLATFORMS=cpu python benchmarks/lower_kernels.py [--no-aot | --aot-only] [--json PATH]
Exits non-zero if any lowering or compile fails.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

# AOT only: libtpu's lockfile would refuse a second process (e.g. a parallel AOT run).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractDevice, AbstractMesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diff_transformer.aot import topology_devices  # noqa: E402
from diff_transformer.kernels.pallas import attention, sharded_attention  # noqa: E402
from diff_transformer.model.attention import kernel_inputs  # noqa: E402

from benchmarks.bench_common import fwd_and_bwd, kernel_spec  # noqa: E402

# Shared DIFF's kernel inputs are DIFF V1's.
VARIANTS = ("transformer", "diff", "diff_v2")


def shapes(variant: str, B: int, T: int, N: int, K: int, d: int, sharding=None, lam_sharding=None):
  """ShapeDtypeStructs (bf16 activations) of the variant's own kernel call (q1, k1, v, q2, k2,
  lam; bench_common.kernel_spec's heads) and of segment ids; activations take `sharding`, a
  scalar lambda `lam_sharding`, a per-token lambda the activations' batch and head axes."""
  p = kernel_inputs(kernel_spec(variant, heads=N, kv_heads=K, d=d, dtype="bfloat16"), T, B)
  def place(s, sh):
    return None if s is None else jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)
  lam_sh = lam_sharding
  if sharding is not None and p.lam is not None and p.lam.ndim == 3:
    lam_sh = NamedSharding(sharding.mesh, P(sharding.spec[0], None, sharding.spec[2]))
  seg = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=None if sharding is None else
                             NamedSharding(sharding.mesh, P(sharding.spec[0], None)))
  acts = [place(getattr(p, n), sharding) for n in ("q1", "k1", "v", "q2", "k2")]
  return (*acts, place(p.lam, lam_sh)), seg


def lower_all(T: int = 1024) -> list[dict]:
  rows = []
  tpu_mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="TPU v5 lite", num_cores=1, platform="tpu"))
  # jax 0.11 asks the Triton lowering for a GPU generation too (0.10.2 assumed one).
  gpu_mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="cuda"))
  for platform, backend in (("tpu", "tpu"), ("cuda", "triton")):
    for variant in VARIANTS:
      args, seg = shapes(variant, 1, T, 4, 2, 128)
      f, g, present = fwd_and_bwd(attention, args, lead=("segment_ids",), backend=backend,
                                  interpret=False)
      for name, fn in (("fwd", f), ("bwd", g)):

        def lower(fn=fn):
          with jax.sharding.use_abstract_mesh(tpu_mesh if platform == "tpu" else gpu_mesh):
            text = jax.jit(fn).trace(seg, *present).lower(lowering_platforms=(platform,)).as_text()
          target = "tpu_custom_call" if platform == "tpu" else "xla.gpu.triton"
          return dict(ok=text.count(target) > 0, kernels=text.count(target))

        row = _attempt(dict(platform=platform, variant=variant, pass_=name, T=T), lower)
        rows.append(row)
        print(f"lower {platform:4s} {variant:11s} {name}: {'ok' if row['ok'] else 'FAILED'} "
              f"({row.get('kernels', 0)} kernels, {row['seconds']} s) {row.get('error', '')}")
  return rows


def _attempt(row: dict, work) -> dict:
  """row updated with work()'s fields, or ok=False and the error, plus the seconds taken."""
  start = time.time()
  try:
    row.update(work())
  except Exception as e:  # recorded, and the script exits non-zero
    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:2000]}")
  row["seconds"] = round(time.time() - start, 2)
  return row


def tpu_topology_mesh(topology: str = "v5e:2x2", shape=(2, 2)):
  return jax.sharding.Mesh(np.array(topology_devices(topology)).reshape(shape), ("data", "model"))


def per_chip_bytes(*structs: jax.ShapeDtypeStruct) -> int:
  """Bytes of one chip's shards of these sharded arguments, from their shapes alone."""
  return sum(math.prod(s.sharding.shard_shape(s.shape)) * s.dtype.itemsize for s in structs)


def aot_all(T: int = 2048, topology: str = "v5e:2x2") -> list[dict]:
  """Compile fwd and bwd of the sharded wrapper for real TPU chips; per-chip memory."""
  mesh = tpu_topology_mesh(topology)
  act = NamedSharding(mesh, P("data", None, "model", None))
  rows = []
  for variant in VARIANTS:
    args, seg = shapes(variant, 2, T, 8, 2, 128, act, NamedSharding(mesh, P()))
    f, g, present = fwd_and_bwd(sharded_attention(mesh, "data", "model", backend="tpu",
                                                  interpret=False), args, lead=("segment_ids",))
    for name, fn in (("fwd", f), ("bwd", g)):

      def compile_(fn=fn):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
          lowered = jax.jit(fn).trace(seg, *present).lower()
        mem = lowered.compile().memory_analysis()
        return dict(ok=True, memory={k: getattr(mem, k) for k in (
            "argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
            "generated_code_size_in_bytes")}, expected_argument_bytes=per_chip_bytes(seg, *present))

      row = _attempt(dict(topology=topology, variant=variant, pass_=name, T=T,
                          shape="B2 N8 K2 d128 bf16, mesh data2 x model2"), compile_)
      rows.append(row)
      print(f"aot {topology} {variant:11s} {name}: {'ok' if row['ok'] else 'FAILED'} "
            f"{row.get('memory', row.get('error'))}")
  return rows


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--no-aot", action="store_true")
  parser.add_argument("--aot-only", action="store_true")
  parser.add_argument("--json",
                      default=str(Path(__file__).parent / "results" / "lower_kernels.json"))
  opts = parser.parse_args()
  result: dict[str, Any] = {"jax": jax.__version__}
  if not opts.aot_only:
    result["lowering"] = lower_all()
  if not opts.no_aot:
    if importlib.util.find_spec("libtpu") is None:
      print("aot: skipped (libtpu not installed)")
      result["aot"] = "skipped: libtpu not installed"
    else:
      result["aot"] = aot_all()
  Path(opts.json).parent.mkdir(parents=True, exist_ok=True)
  Path(opts.json).write_text(json.dumps(result, indent=1))
  rows = [r for k in ("lowering", "aot") if isinstance(result.get(k), list) for r in result[k]]
  return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
