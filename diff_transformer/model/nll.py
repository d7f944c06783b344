"""What a model's logits give each target: its negative log-likelihood (the training objective
sums it, evaluation reads it per token)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def token_nll(logits_BTV: Array, targets_BT: Array) -> Array:
  """float32 [B, T]: -log p(target) = logsumexp(logits) - logit of the target."""
  return nll_and_logz(logits_BTV, targets_BT)[0]


def nll_and_logz(logits_BTV: Array, targets_BT: Array) -> tuple[Array, Array]:
  """(float32 [B, T] -log p(target), [B, T] logsumexp(logits))."""
  logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  target_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return logz_BT - target_BT, logz_BT
