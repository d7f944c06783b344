"""Baseline causal softmax attention (MHA or GQA): the "Transformer" row of every table."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import nnx

from diff_transformer.model.attention.base import Attention, NormOutOptions, Projected
from diff_transformer.model.layers import rms_normalize
from diff_transformer.model.roles import Gain
from diff_transformer.sharding import EMBED, HEADS, KV_HEADS, NORM


@dataclasses.dataclass(frozen=True)
class TransformerOptions(NormOutOptions):
  # Per-head RMSNorm of each head's output with one (d,) gain shared by the heads, the
  # Transformer's analog of DIFF's sub-layer norm (DIFF paper Table 6, "+ GroupNorm"). Either
  # way the heads are then times norm_out_scale ("rule": 1).
  head_norm: bool = False


class TransformerAttention(Attention[TransformerOptions]):
  hf_target = "llama"
  Options = TransformerOptions

  def __init__(self, spec, layer_idx, *, rngs: nnx.Rngs):
    super().__init__(spec, layer_idx, rngs=rngs)
    D, N, K, H = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
    self.wq = self._dense(D, N * H, (EMBED, HEADS), rngs)
    self.wk = self._dense(D, K * H, (EMBED, KV_HEADS), rngs)
    self.wv = self._dense(D, K * H, (EMBED, KV_HEADS), rngs)
    self.wo = self._dense(N * H, D, (HEADS, EMBED), rngs)
    if spec.options.head_norm:
      self.head_norm_scale = Gain(jnp.ones((H,), jnp.float32), out_sharding=(NORM,))

  def project(self, x_BTD, positions_BT) -> Projected:
    s = self.spec
    q_BTNH = self._rope(self._heads(self.wq(x_BTD), s.num_heads), positions_BT)
    k_BTKH = self._rope(self._heads(self.wk(x_BTD), s.kv_heads), positions_BT)
    return Projected(q1=q_BTNH, k1=k_BTKH, v=self._heads(self.wv(x_BTD), s.kv_heads))

  def output(self, o_BTNH, p):
    rule = None
    if self.spec.options.head_norm:
      o_BTNH, rule = rms_normalize(o_BTNH, self.head_norm_scale[...]), 1.0
    return self.wo(self._merge(self._scaled(o_BTNH, rule)))
