"""Attention kernels behind one contract (see kernels/common.py for the exact formula).

`attention(..., implementation=name)` dispatches; adding a kernel is one module plus one entry in
KERNELS. 'xla' is the einsum path at the arithmetic floor (kernels/xla.py), 'pallas' the fused
differential flash kernel (one pass over K/V for both maps), 'cudnn' jax.nn.dot_product_attention
with cuDNN (GPU), 'auto' the choice of kernels/auto.py for this platform and these shapes.
"""
from __future__ import annotations

from typing import Callable

import jax

from diff_transformer import sharding

from diff_transformer.kernels import auto, cudnn, reference, xla
from diff_transformer.kernels.flops import executed_flops


def _pallas(*args, **kwargs):
  """Under a mesh the kernel runs per shard (jax.shard_map: batch and heads by the logical
  rules), since XLA cannot partition a Pallas call; without one it is called directly."""
  from diff_transformer.kernels import pallas  # imported lazily: Pallas pulls in Triton/Mosaic.
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return pallas.attention(*args, **kwargs)
  batch_axes, head_axes = sharding.mesh_axes(mesh, "batch"), sharding.mesh_axes(mesh, "act_heads")
  return pallas.sharded_attention(mesh, batch_axes, head_axes)(*args, **kwargs)


KERNELS: dict[str, Callable] = {
    "reference": reference.attention,
    "xla": xla.attention,
    "pallas": _pallas,
    "cudnn": cudnn.attention,
}


def resolve(implementation: str, q1, k1, v, *, explicit_mask: bool = False) -> str:
  """The kernel that runs for `implementation` with these inputs (arrays or ShapeDtypeStructs):
  'auto' is chosen by kernels/auto.py, and an explicit mask (KV-cache decoding) takes 'xla'
  because the fused kernels take causal and segment masks only."""
  if implementation == "auto":
    return auto.choose(q1, k1, v, explicit_mask=explicit_mask,
                       exact_layout=not cudnn.exact_reason())
  if implementation not in KERNELS:
    raise ValueError(f"model.kernel: unknown kernel '{implementation}'; choose one of "
                     f"{sorted(KERNELS) + ['auto']}")
  return "xla" if explicit_mask and implementation in ("pallas", "cudnn") else implementation


def attention(q1, k1, v, q2=None, k2=None, lam=None, *, implementation: str = "xla", **kwargs):
  """The kernel contract through `implementation`; `max_segments` (the documents a packed row
  may hold in cuDNN's packed layout) reaches the cudnn kernel only."""
  implementation = resolve(implementation, q1, k1, v,
                           explicit_mask=kwargs.get("mask") is not None)
  max_segments = kwargs.pop("max_segments", None)
  if implementation == "cudnn" and max_segments is not None:
    kwargs["max_segments"] = max_segments
  return KERNELS[implementation](q1, k1, v, q2, k2, lam, **kwargs)


__all__ = ["KERNELS", "attention", "auto", "executed_flops", "resolve"]
