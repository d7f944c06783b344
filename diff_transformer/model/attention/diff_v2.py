"""DIFF V2: 2h query heads over h_kv kv heads in one ordinary attention call, then
out_j = o_{2j} - sigmoid(lambda_j) o_{2j+1}, lambda = x W_lambda per token and head.

No sub-layer norm, no lambda_init. Even/odd pairs share their K and V (2h / h_kv must be even),
so the kernel sees q1 = q[0::2], q2 = q[1::2] over shared keys. Ablations: `halves` pairing
(o_j - s o_{h+j}, crossing GQA groups), v2_lambda `none` (o1 - o2) and `linear` (no sigmoid).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention.base import Attention, NormOutOptions, Projected
from diff_transformer.model.roles import Lambda, declare
from diff_transformer.sharding import EMBED, HEADS, KV_HEADS, LAMBDA_HEADS


@dataclasses.dataclass(frozen=True)
class DiffV2Options(NormOutOptions):
  v2_pairing: str = "interleaved"  # interleaved (even/odd, shares K/V) or halves (crosses groups)
  v2_lambda: str = "sigmoid"  # sigmoid, none (o1 - o2), linear (lambda without sigmoid)

  def check(self, at: str) -> None:
    super().check(at)  # model.norm_out_scale: no norm here, so "rule" is 1
    if self.v2_pairing not in ("interleaved", "halves"):
      raise ConfigError(f"{at}.v2_pairing: '{self.v2_pairing}' is not one of interleaved, halves")
    if self.v2_lambda not in ("sigmoid", "none", "linear"):
      raise ConfigError(f"{at}.v2_lambda: '{self.v2_lambda}' is not one of sigmoid, none, linear")


class DiffV2Attention(Attention[DiffV2Options]):
  map_name = "A1 - lambda A2"
  hf_target = "diff_v2"
  Options = DiffV2Options

  @classmethod
  def query_heads(cls, spec):
    return 2 * spec.num_heads

  @classmethod
  def check(cls, spec):
    super().check(spec)
    group = cls.query_heads(spec) // spec.kv_heads
    if spec.options.v2_pairing == "interleaved" and group % 2:
      raise ConfigError(f"model.num_kv_heads: 2h / h_kv = {group} query heads per kv group must "
                        "be even so each (2j, 2j+1) pair shares its keys (or set "
                        "v2_pairing=halves)")

  @classmethod
  def attention_flops(cls, spec, seq_len):
    """2h query heads of width d over the shared K/V: QK^T and AV each."""
    return 2 * seq_len * (2 * spec.num_heads) * spec.head_dim * 2

  def metrics(self, p, weights_BT):
    """lambda's mean over the real tokens and the h heads (sigmoid(lambda) by default)."""
    if self.spec.options.v2_lambda == "none":
      return {}
    lam_BTN = p.lam if p.lam is not None else p.out_lam
    h = self.spec.num_heads
    total = jnp.sum(lam_BTN * weights_BT[..., None].astype(jnp.float32))
    return {"lambda": total / jnp.maximum(jnp.sum(weights_BT) * h, 1.0)}

  def __init__(self, spec, layer_idx, *, rngs: nnx.Rngs):
    super().__init__(spec, layer_idx, rngs=rngs)
    D, h, K, d = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
    self.wq = self._dense(D, 2 * h * d, (EMBED, HEADS), rngs)
    self.wk = self._dense(D, K * d, (EMBED, KV_HEADS), rngs)
    self.wv = self._dense(D, K * d, (EMBED, KV_HEADS), rngs)
    self.wo = self._dense(h * d, D, (HEADS, EMBED), rngs)
    if spec.options.v2_lambda != "none":
      self.wlambda = self._dense(D, h, (EMBED, LAMBDA_HEADS), rngs)
      declare(self.wlambda, "kernel", Lambda)

  def lam(self, x_BTD) -> jax.Array:
    """float32 [B, T, h] (or the scalar 1 for the no-lambda ablation)."""
    if self.spec.options.v2_lambda == "none":
      return jnp.ones((), jnp.float32)
    lam_BTN = self.wlambda(x_BTD).astype(jnp.float32)
    return jax.nn.sigmoid(lam_BTN) if self.spec.options.v2_lambda == "sigmoid" else lam_BTN

  def project(self, x_BTD, positions_BT) -> Projected:
    s = self.spec
    q_BTNH = self._rope(self._heads(self.wq(x_BTD), 2 * s.num_heads), positions_BT)
    k_BTKH = self._rope(self._heads(self.wk(x_BTD), s.kv_heads), positions_BT)
    v_BTKH = self._heads(self.wv(x_BTD), s.kv_heads)
    if s.options.v2_pairing == "halves":  # two maps whose kv groups differ: one plain 2h-head call
      return Projected(q1=q_BTNH, k1=k_BTKH, v=v_BTKH, out_lam=self.lam(x_BTD))
    return Projected(q1=q_BTNH[:, :, 0::2], k1=k_BTKH, v=v_BTKH, q2=q_BTNH[:, :, 1::2],
                     lam=self.lam(x_BTD))

  def output(self, o_BTNH, p):
    if self.spec.options.v2_pairing == "halves":
      h = self.spec.num_heads
      lam_BTN1 = jnp.broadcast_to(p.out_lam, o_BTNH.shape[:2] + (h,))[..., None]
      o_BTNH = (o_BTNH[:, :, :h] - lam_BTN1 * o_BTNH[:, :, h:]).astype(o_BTNH.dtype)
    return self.wo(self._merge(self._scaled(o_BTNH)))
