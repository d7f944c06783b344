"""The divergence guard: stops a run whose loss is not finite or (train.max_loss_spike) spikes,
and sets aside the checkpoints that are not known to be good so a resume never starts from them.

Step s's loss is computed from the state after s - 1 updates, i.e. checkpoint s - 1's state: a bad
loss at step s condemns checkpoint s - 1 and everything after it. A checkpoint is only saved once
its own state has produced a finite loss (Trainer.eval_step on the batch just trained on), so
every checkpoint left in checkpoints/ has been seen to produce a finite loss.
"""
from __future__ import annotations

import math

from diff_transformer.runs import folder as run_folder
from diff_transformer.errors import TrainError
from diff_transformer.runs.checkpoint import Checkpointer

_MEAN_DECAY = 0.9  # the running mean follows roughly the last 10 checked losses


class DivergenceGuard:
  """Checks each step's loss in step order; raises TrainError (one line) on divergence."""

  def __init__(self, checkpointer: Checkpointer, max_loss_spike: float = 0.0):
    self.checkpointer = checkpointer
    self.max_loss_spike = float(max_loss_spike)
    self.mean: float | None = None  # running mean of the checked losses (this process's run)

  def _problem(self, loss: float, grad_norm: float | None = None) -> str | None:
    if grad_norm is not None and not (math.isfinite(loss) and math.isfinite(grad_norm)):
      return f"loss {loss}, grad norm {grad_norm} is not finite"
    if not math.isfinite(loss):
      return f"loss {loss} is not finite"
    if self.max_loss_spike and self.mean is not None and loss > self.max_loss_spike * self.mean:
      return (f"loss {loss:.4g} is more than train.max_loss_spike = {self.max_loss_spike:g} times "
              f"the running mean {self.mean:.4g}")
    return None

  def check_step(self, step: int, values: dict) -> None:
    """Step `step`'s training metrics (its loss comes from checkpoint step - 1's state)."""
    loss, grad_norm = float(values["loss"]), float(values["grad_norm"])
    problem = self._problem(loss, grad_norm)
    if problem:
      self._stop(f"step {step}: {problem}", first_bad=step - 1)
    self.mean = loss if self.mean is None else _MEAN_DECAY * self.mean + (1 - _MEAN_DECAY) * loss

  def check_state(self, step: int, loss: float) -> None:
    """The loss the state after `step` updates gives (checked before that state is saved)."""
    problem = self._problem(loss)
    if problem:
      self._stop(f"step {step}: the updated state's {problem}", first_bad=step)

  def _stop(self, what: str, first_bad: int) -> None:
    ckpt = self.checkpointer
    ckpt.wait()
    suspect = [s for s in ckpt.committed_steps() if s >= first_bad]
    moved = ""
    if suspect:
      target = ckpt.set_aside(suspect, run_folder.DIVERGED_CHECKPOINTS)
      moved = f"moved checkpoints {suspect} (not known good) to {target}; "
    good = ckpt.committed_steps()
    kept = (f"the last good checkpoint (step {good[-1]}) is intact in {ckpt.directory}"
            if good else "no good checkpoint is left")
    raise TrainError(f"{what}; stopped without saving it; {moved}{kept}; {_advice(first_bad)}")


def _advice(first_bad: int) -> str:
  """Step 1's loss comes from the initial state at the smallest lr of the warmup: if that is
  already not finite, the lr is an unlikely cause."""
  if first_bad == 0:
    return ("the first step is already not finite, so the data or the initial state is the likely "
            "cause, not the lr: check the data's token ids against model.vocab_size, "
            "model.init_std and model.dtype")
  return "lower train.lr or raise train.warmup_steps"
