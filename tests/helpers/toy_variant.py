"""A fifth attention variant defined outside the package (tests/test_variant_registry.py): run by
name after `register_variant`, or as
`model.variant=tests.helpers.toy_variant:FixedLambdaAttention`."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import Attention, Projected
from diff_transformer.model.attention.base import VariantOptions
from diff_transformer.model.roles import Gain

FIXED_LAMBDA = 0.25
TOY_PATH = "tests.helpers.toy_variant:FixedLambdaAttention"  # the run's name for it


@dataclasses.dataclass(frozen=True)
class FixedLambdaOptions(VariantOptions):
  """The variant's own knob: model.fixed_lambda, once registered."""
  fixed_lambda: float = FIXED_LAMBDA

  def check(self, at: str) -> None:
    if not 0.0 <= self.fixed_lambda < 1.0:
      raise ConfigError(f"{at}.fixed_lambda: must be in [0, 1), got {self.fixed_lambda}")


class FixedLambdaAttention(Attention[FixedLambdaOptions]):
  """(softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)) V, lambda = model.fixed_lambda: two maps of
  N heads over 2 x K key groups, one d-wide value per kv head, no learned lambda and no
  sub-layer norm; a learned gain on the merged heads."""
  map_name = "A1 - fixed lambda A2"
  Options = FixedLambdaOptions

  def __init__(self, spec, layer_idx, *, rngs):
    super().__init__(spec, layer_idx, rngs=rngs)
    D, N, K, H = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
    self.wq = self._dense(D, 2 * N * H, ("embed", "heads"), rngs)
    self.wk = self._dense(D, 2 * K * H, ("embed", "kv_heads"), rngs)
    self.wv = self._dense(D, K * H, ("embed", "kv_heads"), rngs)
    self.wo = self._dense(N * H, D, ("heads", "embed"), rngs)
    # A learned gain on the merged heads: declared a Gain, so AdamW leaves it undecayed.
    self.out_gain = Gain(jnp.ones((N * H,), jnp.float32), out_sharding=("heads",))

  @classmethod
  def cache_layout(cls, spec):
    return (2 * spec.kv_heads, spec.head_dim), (spec.kv_heads, spec.head_dim)

  @classmethod
  def attention_flops(cls, spec, seq_len):
    return 2 * super().attention_flops(spec, seq_len)  # two maps, each QK^T and AV

  def project(self, x_BTD, positions_BT):
    s = self.spec
    q_BTNH = self._rope(self._heads(self.wq(x_BTD), 2 * s.num_heads), positions_BT)
    k_BTKH = self._rope(self._heads(self.wk(x_BTD), 2 * s.kv_heads), positions_BT)
    n, k = s.num_heads, s.kv_heads
    return Projected(q1=q_BTNH[:, :, :n], k1=k_BTKH[:, :, :k], v=self._heads(self.wv(x_BTD), k),
                     q2=q_BTNH[:, :, n:], k2=k_BTKH[:, :, k:],
                     lam=jnp.asarray(s.options.fixed_lambda, jnp.float32))

  def output(self, o_BTNH, p):
    return self.wo(self._merge(o_BTNH) * self.out_gain[...][None, None])

  def metrics(self, p, weights_BT):
    return {"lambda": p.lam}
