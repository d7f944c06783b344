"""The training objective: next-token cross-entropy with an optional z-loss.

Sums over weighted target tokens (weight 0 = padding, a cross-document target, or a position a
synthetic task does not score); the trainer divides by the whole batch's weight, so the
gradients of micro-batches add up to the full batch's gradient.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from diff_transformer.model.nll import nll_and_logz

Array = jax.Array


def token_sums(logits_BTV: Array, targets_BT: Array, weights_BT: Array
               ) -> tuple[Array, Array, Array]:
  """(nll sum, z sum, correct sum) over the weighted tokens; z = logsumexp(logits)^2 (the
  z-loss term), correct counts the targets that are the argmax (answer accuracy on synthetic
  tasks, next-token accuracy on text)."""
  nll_BT, logz_BT = nll_and_logz(logits_BTV, targets_BT)
  nll_sum = jnp.sum(weights_BT * nll_BT)
  z_sum = jnp.sum(weights_BT * jnp.square(logz_BT))
  correct_sum = jnp.sum(weights_BT * (jnp.argmax(logits_BTV, axis=-1) == targets_BT))
  return nll_sum, z_sum, correct_sum


def objective(nll_sum: Array, z_sum: Array, z_loss: float, total_weight: Array) -> Array:
  """What the optimiser minimises: (NLL + z_loss * z) per token of the whole batch."""
  return (nll_sum + z_loss * z_sum) / total_weight
