"""What a preset should launch with on GPU nodes, chosen by the compiled peak: the mesh (FSDP over
every GPU), the sequences per GPU per micro-batch and remat.

The rule, in order of preference: no remat at the most sequences per GPU (8, 4, 2, 1) that fits;
else full remat, likewise; else the next node count. The global batch stays the preset's (the
papers' tokens per step): micro-batches make up the rest, and the compile includes their
gradient accumulator. A fit keeps the compiled peak plus a margin (aot/gpu.py) within the memory
jax may take at the launch fraction (`Gpu.launch_fraction`, set as
XLA_PYTHON_CLIENT_MEM_FRACTION when launching).
"""
from __future__ import annotations

import dataclasses

import ml_collections

from diff_transformer import aot
from diff_transformer.aot import gpu as gpu_targets

BATCHES = (8, 4, 2, 1)
REMATS = ("none", "full")


def for_gpus(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A config as it trains on GPUs: bfloat16 compute (cuDNN attention), FSDP over every GPU."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.model.dtype = "bfloat16"
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  return c


def candidates(config: ml_collections.ConfigDict, data_parallel: int):
  """(remat, sequences per GPU per micro-batch, micro-batches) in order of preference."""
  rows = config.train.global_batch_size // data_parallel
  for remat in REMATS:
    for batch in BATCHES:
      if rows % batch == 0:
        yield remat, batch, rows // batch


def lighter(config: ml_collections.ConfigDict, data_parallel: int) -> list[tuple[str, int, int]]:
  """The candidates after the config's own (remat, micro-batches), in order: what a step over
  its memory tries next (a remat policy outside REMATS: the full-remat candidates)."""
  order = list(candidates(config, data_parallel))
  here = (config.model.remat, int(config.train.micro_batches))
  at = next((i for i, (remat, _, micro) in enumerate(order) if (remat, micro) == here), None)
  return [c for c in order if c[0] == "full"] if at is None else order[at + 1:]


def plan(config: ml_collections.ConfigDict, where: aot.Target) -> dict:
  """{chosen: the first candidate that fits (its AotResult as a dict) or None, tried: every
  compiled candidate, in order}."""
  tried = []
  dp = aot.data_parallel_size_on(config, where)
  for remat, batch, micro in candidates(config, dp):
    c = ml_collections.ConfigDict(config.to_dict())
    c.model.remat, c.train.micro_batches = remat, micro
    result = dataclasses.asdict(aot.compile_train_step(c, where))
    tried.append(result)
    if result["compiled"] and result["fits"]:
      return dict(chosen=result, tried=tried)
  return dict(chosen=None, tried=tried)


def plan_on_nodes(config: ml_collections.ConfigDict, topology: str) -> dict:
  """The plan on `topology` (e.g. h100:8), and on twice its nodes where it does not suffice:
  {topology, plans: [per node count tried], launch: what to launch with (absent: nothing fits)}."""
  nodes = gpu_targets.parse(topology)
  out: dict = dict(topology=topology, plans=[])
  for count in (nodes.nodes, 2 * nodes.nodes):
    name = (f"{nodes.kind}:{count}x{nodes.per_node}" if count > 1
            else f"{nodes.kind}:{nodes.per_node}")
    result = plan(for_gpus(config), aot.target(name, nodes.gpu.launch_fraction))
    out["plans"].append(dict(topology=name, **result))
    if result["chosen"] is not None:
      out["launch"] = dict(topology=name, **{k: result["chosen"][k] for k in (
          "mesh", "per_device_batch", "micro_batches", "remat", "total_gib", "margin_gib",
          "usable_gib", "memory_fraction")})
      break
  return out
