"""AdamW with the papers' settings: warmup + linear decay to a floor, clipping, decay masks.

Parameters are a pure dict (nnx.State.to_pure_dict()), so the mask and the schedule are plain
functions of paths and steps; gradient accumulation and z-loss live in the train step.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

# Leaves that are RMSNorm gains: the blocks' and final norms' `scale`, DIFF's sub-layer norm gain.
_NORM_LEAVES = ("subln_scale",)
# DIFF V1 / Shared DIFF re-parameterised lambda vectors, and DIFF V2's per-token lambda projection.
_LAMBDA_PREFIXES = ("lambda_", "wlambda")


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


def _path_names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def param_kind(path) -> str:
  """'norm', 'lambda', 'embedding' or 'weight' for a parameter's path in the pure dict."""
  names = _path_names(path)
  if names[-1] in _NORM_LEAVES or any(n.endswith("norm") for n in names[:-1]):
    return "norm"
  if any(n.startswith(_LAMBDA_PREFIXES) for n in names):
    return "lambda"
  if names[0] == "embed":  # the input embedding table (also the LM head when tied)
    return "embedding"
  return "weight"


def decay_mask(params: Any, t: ml_collections.ConfigDict) -> Any:
  """True where AdamW applies weight decay; matrices always, the rest as the config says."""
  allowed = {"weight": True, "norm": bool(t.decay_norms), "lambda": bool(t.decay_lambda),
             "embedding": bool(t.decay_embeddings)}
  return jax.tree_util.tree_map_with_path(lambda p, _: allowed[param_kind(p)], params)


def make_optimizer(t: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Clip by global norm (0 disables), then AdamW on the schedule with the config's mask.

  The chain keeps the same state structure either way, so a run resumed with another
  grad_clip still restores its optimizer state.
  """
  adamw = optax.adamw(learning_rate_schedule(t), b1=float(t.b1), b2=float(t.b2),
                      eps=float(t.eps), weight_decay=float(t.weight_decay),
                      mask=lambda params: decay_mask(params, t))
  clip = optax.clip_by_global_norm(float(t.grad_clip)) if t.grad_clip > 0 else optax.identity()
  return optax.chain(clip, adamw)
