"""AdamW with the papers' settings: warmup + linear decay to a floor, clipping, decay masks.

Parameters are a pure dict (nnx.State.to_pure_dict()); the decay mask is a pure dict built once
from the model's variable types (model/roles.py), never from names. Gradient accumulation and
z-loss live in the train step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from diff_transformer.model.roles import decayed


def learning_rate_schedule(t: ml_collections.ConfigDict) -> optax.Schedule:
  """lr * (s + 1) / warmup for s < warmup, then linear from lr to final_lr at step `steps`.

  The warmup counts from 1 so the first update is not a wasted zero-lr step; after `steps` the
  rate stays at final_lr (a resumed run that extends `steps` keeps a sane value).
  """
  lr, final, warmup, total = float(t.lr), float(t.final_lr), int(t.warmup_steps), int(t.steps)

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    warm = lr * jnp.minimum(1.0, (s + 1.0) / max(warmup, 1))
    frac = jnp.clip((s - warmup) / max(total - warmup, 1), 0.0, 1.0)
    decay = lr + (final - lr) * frac
    return jnp.where(s < warmup, warm, decay)

  return schedule


def decay_mask(params: nnx.State, t: ml_collections.ConfigDict) -> dict:
  """The pure-dict tree of AdamW's mask (True: decayed) for a model's nnx.Param state, as each
  parameter's role says (model/roles.py `decayed`): a weight always; a gain, lambda or embedding
  as its config flag says; a role of a variant's own as its class says."""
  return nnx.to_pure_dict(jax.tree.map(lambda v: decayed(v, t), params,
                                       is_leaf=lambda x: isinstance(x, nnx.Variable)))


def make_optimizer(t: ml_collections.ConfigDict, mask: dict) -> optax.GradientTransformation:
  """Clip by global norm (0 disables), then AdamW on the schedule with `mask` (decay_mask).

  The chain keeps the same state structure either way, so a run resumed with another
  grad_clip still restores its optimizer state.
  """
  adamw = optax.adamw(learning_rate_schedule(t), b1=float(t.b1), b2=float(t.b2),
                      eps=float(t.eps), weight_decay=float(t.weight_decay),
                      mask=mask)
  clip = optax.clip_by_global_norm(float(t.grad_clip)) if t.grad_clip > 0 else optax.identity()
  return optax.chain(clip, adamw)
