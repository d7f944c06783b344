"""Shared DIFF (Cang et al.): DIFF V1 with one base W_Q / W_K shared by both signals plus four
rank-r updates: Q1 = x W_Q + (x U_q1) V_q1^T, Q2 = x W_Q + (x U_q2) V_q2^T, likewise K1, K2.

The updates span all heads of the layer (U: D x r, V^T: r x h*d) and are computed factored.
Initialisation (the paper is silent; model.lowrank_init, chosen by ablation in
docs/results/shared_diff_init.md): `matched` (default) draws the base and both factors so
that W_Q + U V^T has DIFF V1's elementwise std (half its variance shared, half per signal),
so the initial attention logits have DIFF V1's scale; `fan_in` draws both factors fan-in
scaled (the update then dominates: logits about 50x DIFF V1's at D = 64); `lora` zeroes V^T
(Q1 = Q2, K1 = K2).
"""
from __future__ import annotations

import dataclasses
import math

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention.diff_v1 import DiffAttention, DiffOptions
from diff_transformer.sharding import EMBED, HEADS, KV_HEADS, RANK


LOWRANK_INITS = ("matched", "fan_in", "lora")


@dataclasses.dataclass(frozen=True)
class SharedDiffOptions(DiffOptions):
  rank: int = 0  # r of the four rank-r updates (a preset sets it; the check bounds it)
  # matched: W + U V^T at DIFF V1's init scale (default, by ablation); fan_in: both factors
  # fan-in scaled (logits ~50x larger at init); lora: V^T zero (Q1 = Q2, K1 = K2)
  lowrank_init: str = "matched"

  def check(self, at: str) -> None:
    super().check(at)
    if self.lowrank_init not in LOWRANK_INITS:
      raise ConfigError(f"{at}.lowrank_init: '{self.lowrank_init}' is not one of "
                        f"{', '.join(LOWRANK_INITS)}")


class SharedDiffAttention(DiffAttention[SharedDiffOptions]):
  Options = SharedDiffOptions

  @classmethod
  def check(cls, spec):
    # h = D / 2d; Shared DIFF's Table 3 rows allow d = D // 2h (rounded down), a documented
    # deviation (configs/scaling.py), so 2hd may fall short of D.
    if 2 * spec.num_heads * spec.head_dim > spec.d_model:
      raise ConfigError(f"model.head_dim: 2 * num_heads * head_dim = "
                        f"{2 * spec.num_heads * spec.head_dim} must not exceed d_model = "
                        f"{spec.d_model}")
    widest = min(spec.d_model, spec.kv_heads * spec.head_dim)
    if not 1 <= spec.options.rank <= widest:
      raise ConfigError(f"model.{spec.variant}.rank: must be in [1, {widest}] (the smallest "
                        f"projection side), got {spec.options.rank}")

  def init_qk(self, rngs):
    s, o = self.spec, self.spec.options
    D, r, q_width, k_width = s.d_model, o.rank, s.num_heads * s.head_dim, s.kv_heads * s.head_dim
    matched, lora = o.lowrank_init == "matched", o.lowrank_init == "lora"
    # matched: base std s/sqrt(2); factors std f with sqrt(r) f^2 = s/sqrt(2), so U V^T has
    # elementwise std s/sqrt(2) and W + U V^T has DIFF V1's s. None: fan-in scaled.
    base_std = s.init_std / math.sqrt(2) if matched else s.init_std
    factor_std = math.sqrt(base_std / math.sqrt(r)) if matched else None
    self.wq = self._dense(D, q_width, (EMBED, HEADS), rngs, std=base_std)
    self.wk = self._dense(D, k_width, (EMBED, KV_HEADS), rngs, std=base_std)
    for name, width, axis in (("q1", q_width, HEADS), ("q2", q_width, HEADS),
                              ("k1", k_width, KV_HEADS), ("k2", k_width, KV_HEADS)):
      setattr(self, f"u_{name}", self._dense(D, r, (EMBED, RANK), rngs, std=factor_std))
      setattr(self, f"v_{name}", self._dense(r, width, (RANK, axis), rngs, std=factor_std,
                                             zeros=lora))

  def qk(self, x_BTD):
    s = self.spec
    q_BTF, k_BTF = self.wq(x_BTD), self.wk(x_BTD)
    update = lambda name: getattr(self, f"v_{name}")(getattr(self, f"u_{name}")(x_BTD))
    return (self._heads(q_BTF + update("q1"), s.num_heads),
            self._heads(q_BTF + update("q2"), s.num_heads),
            self._heads(k_BTF + update("k1"), s.kv_heads),
            self._heads(k_BTF + update("k2"), s.kv_heads))
