"""What every attention variant shares: project -> kernel -> output, and the analysis path.

A variant subclasses `Attention` and defines `project` (inputs to the kernel contract of
kernels/common.py, RoPE applied) and `output` (heads back to d_model). Everything else (kernel
choice, packing masks, attention maps for analysis) lives here once.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer import kernels
from diff_transformer.kernels import reference
from diff_transformer.model.layers import dense, rope
from diff_transformer.model.spec import ModelSpec

Array = jax.Array


class LayerConstant(nnx.Variable):
  """A per-layer constant (e.g. lambda_init): saved with the model, never trained."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Projected:
  """Kernel inputs (see kernels/common.py) for one attention call."""
  q1: Array
  k1: Array
  v: Array
  q2: Array | None = None
  k2: Array | None = None
  lam: Array | None = None
  out_lam: Array | None = None  # lambda applied by the variant's output() instead of the kernel


def lambda_init_value(layer_idx, constant: float | None):
  """0.8 - 0.6 exp(-0.3 l) with l counted from 0 (first layer 0.2), or the ablation's constant."""
  if constant is not None:
    return jnp.asarray(constant, jnp.float32)
  return 0.8 - 0.6 * jnp.exp(-0.3 * jnp.asarray(layer_idx, jnp.float32))


class Attention(nnx.Module):
  def __init__(self, spec: ModelSpec, layer_idx, *, rngs: nnx.Rngs):
    del layer_idx, rngs
    self.spec = spec
    self.kernel = spec.kernel

  def project(self, x_BTD: Array, positions_BT: Array) -> Projected:
    raise NotImplementedError

  def output(self, o_BTNH: Array, p: Projected) -> Array:
    raise NotImplementedError

  def __call__(self, x_BTD: Array, positions_BT: Array, segment_ids_BT: Array | None = None,
               *, return_maps: bool = False):
    p = self.project(x_BTD, positions_BT)
    if return_maps:
      o_BTNH, maps = reference.attention_maps(p.q1, p.k1, p.v, p.q2, p.k2, p.lam,
                                              segment_ids=segment_ids_BT)
      return self.output(o_BTNH, p), maps
    o_BTNH = kernels.attention(p.q1, p.k1, p.v, p.q2, p.k2, p.lam, segment_ids=segment_ids_BT,
                               implementation=self.kernel)
    return self.output(o_BTNH, p)

  # Helpers for the variants.
  def _dense(self, d_in: int, d_out: int, names, rngs, **kw) -> nnx.Linear:
    return dense(d_in, d_out, names, dtype=self.spec.compute_dtype, rngs=rngs,
                 std=kw.pop("std", self.spec.init_std), **kw)

  def _heads(self, x_BTF: Array, heads: int) -> Array:
    return x_BTF.reshape(*x_BTF.shape[:2], heads, x_BTF.shape[-1] // heads)

  def _rope(self, x_BTNH: Array, positions_BT: Array) -> Array:
    return rope(x_BTNH, positions_BT, self.spec.rope_theta, self.spec.rope_pairs)

  def _merge(self, o_BTNH: Array) -> Array:
    return o_BTNH.reshape(*o_BTNH.shape[:2], math.prod(o_BTNH.shape[2:]))
