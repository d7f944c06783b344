"""Building blocks shared by every variant: dense projections, RMSNorm, SwiGLU, RoPE."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer.model.roles import Gain
from diff_transformer.sharding import EMBED, MLP, NORM

Array = jax.Array
NORM_EPS = 1e-5


def dense(d_in: int, d_out: int, names: tuple[str | None, str | None], *, dtype, rngs: nnx.Rngs,
          std: float | None = 0.02, zeros: bool = False) -> nnx.Linear:
  """Bias-free float32 projection computing in `dtype`; std None = fan-in (1/sqrt(d_in))."""
  if zeros:
    init = nnx.initializers.zeros_init()
  elif std is None:
    init = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  else:
    init = nnx.initializers.truncated_normal(std)
  return nnx.Linear(d_in, d_out, use_bias=False, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=nnx.with_partitioning(init, names), rngs=rngs)


def rms_normalize(x: Array, scale: Array | None, eps: float = NORM_EPS) -> Array:
  """RMSNorm over the last axis with float32 statistics; returns x's dtype."""
  return _rms_normalize(x, jnp.ones(x.shape[-1:], jnp.float32) if scale is None else scale, eps)


# The backward keeps x in its own dtype and recomputes the float32 upcast from it: autodiff of
# the formula would save the float32 copy, twice x's bytes under bf16, for every norm of every
# layer. The gradient is the formula's, computed in float32 as the forward is.
@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _rms_normalize(x: Array, scale: Array, eps: float) -> Array:
  return _rms_forward(x, scale, eps)[0]


def _rms_forward(x, scale, eps):
  x32 = x.astype(jnp.float32)
  inverse_rms = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  y = x32 * inverse_rms * jnp.broadcast_to(scale, x32.shape)
  return y.astype(x.dtype), (x, scale, inverse_rms)


def _rms_backward(eps, saved, g):
  x, scale, inverse_rms = saved
  n = x.astype(jnp.float32) * inverse_rms  # the normalised x
  g32 = g.astype(jnp.float32)
  d_scale = jnp.sum(g32 * n, axis=tuple(range(g.ndim - scale.ndim))).astype(scale.dtype)
  gn = g32 * jnp.broadcast_to(scale, g32.shape)
  d_x = inverse_rms * (gn - n * jnp.mean(gn * n, axis=-1, keepdims=True))
  return d_x.astype(x.dtype), d_scale


_rms_normalize.defvjp(_rms_forward, _rms_backward)


class RMSNorm(nnx.Module):
  def __init__(self, dim: int, names: tuple[str, ...] = (NORM,)):
    self.scale = Gain(jnp.ones((dim,), jnp.float32), out_sharding=names)

  def __call__(self, x: Array) -> Array:
    return rms_normalize(x, self.scale[...])


class SwiGLU(nnx.Module):
  """(silu(x W_g) * (x W_1)) W_2, no biases."""

  def __init__(self, d_model: int, ffn_dim: int, *, dtype, std: float, rngs: nnx.Rngs):
    self.gate = dense(d_model, ffn_dim, (EMBED, MLP), dtype=dtype, std=std, rngs=rngs)
    self.up = dense(d_model, ffn_dim, (EMBED, MLP), dtype=dtype, std=std, rngs=rngs)
    self.down = dense(ffn_dim, d_model, (MLP, EMBED), dtype=dtype, std=std, rngs=rngs)

  def __call__(self, x_BTD: Array) -> Array:
    return self.down(jax.nn.silu(self.gate(x_BTD)) * self.up(x_BTD))


def rope(x_BTNH: Array, positions_BT: Array, theta: float, pairs: str = "interleaved") -> Array:
  """Rotary embedding of every H-wide head. interleaved: pairs (2i, 2i+1) as the official code;
  half: pairs (i, i + H/2) as LLaMA/HF (a weight permutation of the same model)."""
  width = x_BTNH.shape[-1]
  freq_P = theta ** (-jnp.arange(0, width, 2, dtype=jnp.float32) / width)
  angle_BTP = positions_BT[..., None].astype(jnp.float32) * freq_P[None, None]
  cos, sin = jnp.cos(angle_BTP)[:, :, None], jnp.sin(angle_BTP)[:, :, None]
  x = x_BTNH.astype(jnp.float32)
  if pairs == "interleaved":
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)
  else:
    x1, x2 = x[..., : width // 2], x[..., width // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
  return out.astype(x_BTNH.dtype)


class ShortConv(nnx.Module):
  """x + a causal depthwise convolution of `width` taps, kept inside each packed segment.

  y_t = x_t + sum_{j < width} w_j * x_{t-j} (terms from another segment or before the start are
  zero). Decoding keeps the last width - 1 inputs per row (`state`) and gives the same outputs.
  """

  def __init__(self, d_model: int, width: int, *, rngs: nnx.Rngs):
    self.width = width
    init = nnx.initializers.normal(1.0 / width ** 0.5)
    self.weight = nnx.Param(init(rngs.params(), (width, d_model), jnp.float32),
                            out_sharding=(None, NORM))

  def __call__(self, x_BTD: Array, segment_ids_BT: Array | None = None) -> Array:
    w_WD = self.weight[...].astype(x_BTD.dtype)
    T = x_BTD.shape[1]
    y_BTD = x_BTD + w_WD[0][None, None] * x_BTD
    for j in range(1, self.width):
      shifted_BTD = jnp.pad(x_BTD, ((0, 0), (j, 0), (0, 0)))[:, :T]
      if segment_ids_BT is not None:
        same_BT = jnp.pad(segment_ids_BT, ((0, 0), (j, 0)), constant_values=-1)[:, :T] == (
            segment_ids_BT)
        shifted_BTD = jnp.where(same_BT[..., None], shifted_BTD, 0)
      y_BTD = y_BTD + w_WD[j][None, None] * shifted_BTD
    return y_BTD

  def step(self, x_BTD: Array, state_BWD: Array, advance_B: Array) -> tuple[Array, Array]:
    """Outputs for T new inputs after the cached `state` [B, width - 1, D] and the new state
    (the width - 1 inputs ending at each row's last real token, `advance_B` new ones)."""
    T, W = x_BTD.shape[1], self.width
    w_WD = self.weight[...].astype(x_BTD.dtype)
    buf_BSD = jnp.concatenate([state_BWD.astype(x_BTD.dtype), x_BTD], axis=1)
    y_BTD = x_BTD + sum(w_WD[j][None, None] * buf_BSD[:, W - 1 - j:W - 1 - j + T] for j in range(W))
    keep = lambda buf_SD, start: jax.lax.dynamic_slice_in_dim(buf_SD, start, W - 1, axis=0)
    return y_BTD, jax.vmap(keep)(buf_BSD, advance_B).astype(state_BWD.dtype)
