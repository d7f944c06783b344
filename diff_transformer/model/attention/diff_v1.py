"""DIFF V1 (Ye et al.): head_i = (softmax(Q1 K1^T/sqrt d) - lambda softmax(Q2 K2^T/sqrt d)) V.

- q viewed as (2h, d), k as (2h_kv, d), v as (h_kv, 2d); head i pairs sub-heads 2i and 2i+1,
  key group j pairs sub-heads 2j and 2j+1 (adjacent, never the two halves); under GQA head i
  reads key group i // (h / h_kv) for both K1 and K2 (the kernel contract's g(n)).
- lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, one float32 scalar per layer.
- Sub-layer norm: RMSNorm over each head's 2d vector with one (2d,) gain shared by all heads,
  times (1 - lambda_init), or as model.norm_out_scale says.
"""
from __future__ import annotations

import dataclasses
from typing import TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention.base import (Attention, NormOutOptions, Projected,
                                                  lambda_init_value)
from diff_transformer.model.layers import rms_normalize
from diff_transformer.model.roles import Gain, Lambda, LayerConstant
from diff_transformer.sharding import EMBED, HEADS, HEAD_DIM, KV_HEADS, NORM


@dataclasses.dataclass(frozen=True)
class DiffOptions(NormOutOptions):
  """DIFF paper Table 6's ablations. norm_out_scale: "rule" is (1 - lambda_init) after the
  sub-layer norm (1 without it); "layer_rule" is 1 - (0.8 - 0.6 exp(-0.3 l)) even where
  lambda_init is a constant; or a fixed number."""
  subln: bool = True  # per-head RMSNorm with one (2d,) gain, then * norm_out_scale
  lambda_init: float | None = None  # None = 0.8 - 0.6 exp(-0.3 l), l counted from 0
  lambda_std: float = 0.1
  NORM_OUT_RULES = ("rule", "layer_rule")

  def check(self, at: str) -> None:
    super().check(at)
    if self.lambda_init is not None and not 0.0 <= self.lambda_init < 1.0:
      raise ConfigError(f"{at}.lambda_init: must be in [0, 1) or None (layer-dependent), got "
                        f"{self.lambda_init}")


# DiffOptions or a subclass of it (Shared DIFF's): spec.options is typed by the subclass's own
DiffOptionsT = TypeVar("DiffOptionsT", bound=DiffOptions)


class DiffAttention(Attention[DiffOptionsT]):
  map_name = "A1 - lambda A2"
  Options = DiffOptions
  hf_target = "diff_llama"  # Shared DIFF too: its low-rank factors are materialised

  def __init__(self, spec, layer_idx, *, rngs: nnx.Rngs):
    super().__init__(spec, layer_idx, rngs=rngs)
    D, h, K, d = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
    self.init_qk(rngs)
    self.wv = self._dense(D, K * 2 * d, (EMBED, KV_HEADS), rngs)
    self.wo = self._dense(h * 2 * d, D, (HEADS, EMBED), rngs)
    o = spec.options
    lambda_vector = lambda: Lambda(nnx.initializers.normal(o.lambda_std)(
        rngs.params(), (d,), jnp.float32), out_sharding=(HEAD_DIM,))
    # drawn in this order (q1, k1, q2, k2), the order every committed initialisation used
    self.lambda_q1, self.lambda_k1 = lambda_vector(), lambda_vector()
    self.lambda_q2, self.lambda_k2 = lambda_vector(), lambda_vector()
    self.lambda_init = LayerConstant(lambda_init_value(layer_idx, o.lambda_init))
    if o.subln:
      self.subln_scale = Gain(jnp.ones((2 * d,), jnp.float32), out_sharding=(NORM,))
    if o.norm_out_scale == "layer_rule":  # the default model's multiplier, whatever lambda is
      self.norm_out_rule = LayerConstant(1.0 - lambda_init_value(layer_idx, None))

  @classmethod
  def cache_layout(cls, spec):
    """2 h_kv keys ([K1; K2]) of width d and h_kv values of width 2d (model/cache.py)."""
    return (2 * spec.kv_heads, spec.head_dim), (spec.kv_heads, 2 * spec.head_dim)

  @classmethod
  def heads_for(cls, d_model, head_dim):
    """h = D / 2d differential heads (each has two d-wide query sub-heads)."""
    return d_model // (2 * head_dim)

  @classmethod
  def check(cls, spec):
    if 2 * spec.num_heads * spec.head_dim != spec.d_model:
      raise ConfigError(f"model.head_dim: 2 * num_heads * head_dim = "
                        f"{2 * spec.num_heads * spec.head_dim} must equal d_model = {spec.d_model}"
                        f"{cls.heads_fix(spec)}")

  @classmethod
  def attention_flops(cls, spec, seq_len):
    """Two maps per head: QK^T of width d each, and their products with the 2d-wide V."""
    h, d = spec.num_heads, spec.head_dim
    return 2 * seq_len * h * d * 2 + 2 * seq_len * h * (2 * d) * 2

  def metrics(self, p, weights_BT):
    return {"lambda": p.lam}

  def init_qk(self, rngs):
    s = self.spec
    self.wq = self._dense(s.d_model, 2 * s.num_heads * s.head_dim, (EMBED, HEADS), rngs)
    self.wk = self._dense(s.d_model, 2 * s.kv_heads * s.head_dim, (EMBED, KV_HEADS), rngs)

  def qk(self, x_BTD):
    """(q1, q2) [B, T, h, d] and (k1, k2) [B, T, h_kv, d] before RoPE."""
    s = self.spec
    q_BTNH = self._heads(self.wq(x_BTD), 2 * s.num_heads)
    k_BTNH = self._heads(self.wk(x_BTD), 2 * s.kv_heads)
    return q_BTNH[:, :, 0::2], q_BTNH[:, :, 1::2], k_BTNH[:, :, 0::2], k_BTNH[:, :, 1::2]

  def lam(self) -> jax.Array:
    dot = lambda a, b: jnp.sum(a[...].astype(jnp.float32) * b[...].astype(jnp.float32))
    return (jnp.exp(dot(self.lambda_q1, self.lambda_k1))
            - jnp.exp(dot(self.lambda_q2, self.lambda_k2)) + self.lambda_init[...])

  def project(self, x_BTD, positions_BT) -> Projected:
    q1, q2, k1, k2 = (self._rope(t, positions_BT) for t in self.qk(x_BTD))
    v_BTKH = self._heads(self.wv(x_BTD), self.spec.kv_heads)
    return Projected(q1=q1, k1=k1, v=v_BTKH, q2=q2, k2=k2, lam=self.lam())

  def output(self, o_BTNH, p):
    o = self.spec.options
    rule = self.norm_out_rule[...] if o.norm_out_scale == "layer_rule" else None
    if o.subln:
      o_BTNH = rms_normalize(o_BTNH, self.subln_scale[...])
      rule = 1.0 - self.lambda_init[...] if rule is None else rule
    return self.wo(self._merge(self._scaled(o_BTNH, rule)))
