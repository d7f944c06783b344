"""Shared DIFF (Cang et al.): DIFF V1 with one base W_Q / W_K shared by both signals plus four
rank-r updates: Q1 = x W_Q + (x U_q1) V_q1^T, Q2 = x W_Q + (x U_q2) V_q2^T, likewise K1, K2.

The updates span all heads of the layer (U: D x r, V^T: r x h*d) and are computed factored.
Initialisation (the paper is silent): `fan_in` draws both factors (the signals start as different
as DIFF V1's); `lora` zeroes V^T so Q1 = Q2 and K1 = K2 at the start.
"""
from __future__ import annotations

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention.diff_v1 import DiffAttention


class SharedDiffAttention(DiffAttention):
  low_rank = True

  @classmethod
  def check(cls, spec):
    # h = D / 2d; Shared DIFF's Table 3 rows allow d = D // 2h (rounded down), a documented
    # deviation (configs/scaling.py), so 2hd may fall short of D.
    if 2 * spec.num_heads * spec.head_dim > spec.d_model:
      raise ConfigError(f"model.head_dim: 2 * num_heads * head_dim = "
                        f"{2 * spec.num_heads * spec.head_dim} must not exceed d_model = "
                        f"{spec.d_model}")
    widest = min(spec.d_model, spec.kv_heads * spec.head_dim)
    if not 1 <= spec.rank <= widest:
      raise ConfigError(f"model.rank: must be in [1, {widest}] (the smallest projection side), "
                        f"got {spec.rank}")
    if spec.lowrank_init not in ("fan_in", "lora"):
      raise ConfigError(f"model.lowrank_init: '{spec.lowrank_init}' is not one of fan_in, lora")

  def init_qk(self, rngs):
    s = self.spec
    D, r, q_width, k_width = s.d_model, s.rank, s.num_heads * s.head_dim, s.kv_heads * s.head_dim
    self.wq = self._dense(D, q_width, ("embed", "heads"), rngs)
    self.wk = self._dense(D, k_width, ("embed", "kv_heads"), rngs)
    lora = s.lowrank_init == "lora"
    for name, width, axis in (("q1", q_width, "heads"), ("q2", q_width, "heads"),
                              ("k1", k_width, "kv_heads"), ("k2", k_width, "kv_heads")):
      setattr(self, f"u_{name}", self._dense(D, r, ("embed", "rank"), rngs, std=None))
      setattr(self, f"v_{name}", self._dense(r, width, ("rank", axis), rngs, std=None, zeros=lora))

  def qk(self, x_BTD):
    s = self.spec
    q_BTF, k_BTF = self.wq(x_BTD), self.wk(x_BTD)
    update = lambda name: getattr(self, f"v_{name}")(getattr(self, f"u_{name}")(x_BTD))
    return (self._heads(q_BTF + update("q1"), s.num_heads), self._heads(q_BTF + update("q2"), s.num_heads),
            self._heads(k_BTF + update("k1"), s.kv_heads), self._heads(k_BTF + update("k2"), s.kv_heads))
