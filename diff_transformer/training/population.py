"""P members of one cell trained by one compiled program: the train state stacked on a leading
member axis, the step vmapped over it, and a learning rate per member.

A member is the run its (seed, lr) would be alone: `init` builds member i from seeds[i] exactly
as Trainer.init(seeds[i]) does, and each member steps on its own batch (stacked [P, B, T]). The
lr is an input, not a recompile: AdamW's update is -lr_t (m/sqrt(v) + wd p) with lr_t =
lr * shape(t) (warmup, then linear decay to final_lr, whose ratio to lr the study keeps), so a
member at lr * s is the reference optimizer's update scaled by s (Trainer.train_step_fn). A
member whose loss is not finite stops updating (its state is held) and is reported in
`finite`; the others go on. A member that is no longer `active` (failed, or finished at its
accuracy level) is held too. The attention of a step vmapped over members is never cuDNN's
(kernels/auto.py `population_members`). population_loop.py drives it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from diff_transformer import kernels
from diff_transformer.runs.layout import State
from diff_transformer.training.step import Batch, Trainer


class Population:
  """Members of `trainer`'s config at train.lr * lr_scales[i], initialised from seeds[i]."""

  def __init__(self, trainer: Trainer, seeds: list[int], lr_scales: list[float]):
    if len(seeds) != len(lr_scales) or not seeds:
      raise ValueError(f"population: {len(seeds)} seeds and {len(lr_scales)} lr scales; give "
                       "one of each per member")
    self.trainer = trainer
    self.seeds = jnp.asarray(seeds, jnp.uint32)
    self.lr_scales = jnp.asarray(lr_scales, jnp.float32)
    # nnx.Rngs(seed) keys from jax.random.key(seed): the same key from a traced seed
    self._init = jax.jit(jax.vmap(lambda seed: trainer.init_fn(jax.random.key(seed))))
    self._step = jax.jit(jax.vmap(self._member_step), donate_argnums=0)
    self._active = jnp.ones(len(seeds), bool)

  @property
  def size(self) -> int:
    return int(self.seeds.shape[0])

  def init(self) -> State:
    """The stacked state: member i as Trainer.init(seeds[i]) builds it."""
    with self.trainer.context():
      return self._init(self.seeds)

  def _member_step(self, state: State, batch: Batch, lr_scale: jax.Array, active: jax.Array):
    stepped, metrics = self.trainer.train_step_fn(state, batch, lr_scale)
    finite = jnp.isfinite(metrics["loss"])
    # a member whose loss is not finite stops updating; the others are not affected
    keep = finite & active
    new_state = jax.tree.map(lambda new, old: jnp.where(keep, new, old), stepped, state)
    return new_state, dict(metrics, finite=finite)

  def members_step(self, state: State, batches: Batch, active=None) -> tuple[State, dict]:
    """One step of every member on its own batch ([P, B, T] leaves); metrics are [P]. Members
    where `active` ([P] bool, default all) is False keep their state."""
    active = self._active if active is None else jnp.asarray(active, bool)
    with self.trainer.context(), kernels.auto.population_members():
      return self._step(state, batches, self.lr_scales, active)

  @property
  def abstract_state(self):
    """The stacked state's shapes (for lower_step), made without computing it."""
    with self.trainer.context():
      return jax.eval_shape(self._init, self.seeds)

  def lower_step(self, state, batches: Batch) -> jax.stages.Lowered:
    """The members' step lowered as members_step traces it (arrays or ShapeDtypeStructs):
    compile() it to check it ahead of time."""
    with self.trainer.context(), kernels.auto.population_members():
      return self._step.lower(state, batches, self.lr_scales, self._active)
