"""What a training run measures of its own state: the loss of the batch it just trained on
(before a checkpoint is saved) and the validation metrics at each eval step."""
from __future__ import annotations

import math

import jax
import ml_collections

from diff_transformer import data
from diff_transformer.errors import TrainError
from diff_transformer.mesh import global_batch
from diff_transformer.training.step import Trainer


def state_loss(trainer: Trainer, state, batch, micro_batches: int) -> float:
  """The loss a state gives on the batch it was just trained on (its first micro-batch, a size
  a step already fits in memory): a checkpoint is saved only once this is finite."""
  if micro_batches > 1:  # rows j*m of each device's block: micro-batch 0, no resharding
    batch = jax.tree.map(lambda x: x[::micro_batches], batch)
  nll, tokens, _ = trainer.eval_step(state, batch)
  return float(nll) / max(float(tokens), 1.0)


def metrics(trainer: Trainer, state, dataset, config: ml_collections.ConfigDict, mesh) -> dict:
  """Validation loss, perplexity and argmax accuracy over the weighted tokens (the answers on
  synthetic tasks) of up to train.eval_batches held-out batches."""
  t = config.train
  batch_size = t.global_batch_size // t.micro_batches  # the size a step already fits in memory
  nll, tokens, correct = 0.0, 0.0, 0.0
  for local in data.validation_batches(dataset, config.data, batch_size, t.eval_batches,
                                       process_index=jax.process_index(),
                                       process_count=jax.process_count()):
    batch_nll, batch_tokens, batch_correct = trainer.eval_step(state, global_batch(mesh, local))
    nll, tokens, correct = nll + batch_nll, tokens + batch_tokens, correct + batch_correct
  nll, tokens, correct = float(nll), float(tokens), float(correct)
  if tokens == 0:
    raise TrainError(f"{dataset.path}: the validation split yields no tokens")
  loss = nll / tokens
  return dict(val_loss=loss, val_perplexity=math.exp(min(loss, 80.0)), val_tokens=tokens,
              val_accuracy=correct / tokens)
