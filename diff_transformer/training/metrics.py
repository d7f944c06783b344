"""Training metrics: FLOPs and MFU, JSONL + TensorBoard files in the workdir, a tqdm bar.

FLOPs follow MaxText's accounting: 6 FLOPs per weight per token for the matmul weights (forward
2, backward 4; the embedding lookup is not a matmul, the LM head is), plus the attention score
and value matmuls, halved because causal attention computes only the lower triangle, times 3
for forward + backward. Each variant states its attention FLOPs (`Attention.attention_flops`):
differential variants count what their kernels execute, two softmax maps per head, each with its
QK^T and its product with V. MFU divides these model FLOPs by the peak of training/peak.py;
`executed_flops_per_token` counts what the chosen kernel path computes instead (its utilisation is
logged as `hfu`).
"""
from __future__ import annotations

import functools
import json
import math
import sys
import time
from typing import Any
from pathlib import Path

import jax
import numpy as np

from diff_transformer import kernels
from diff_transformer.files import mend_jsonl_tail
from diff_transformer.model.attention import kernel_inputs, variant_class
from diff_transformer.model.spec import ModelSpec
from diff_transformer.params import abstract_model, param_shapes
from diff_transformer.runs.folder import RunFolder


@functools.lru_cache(maxsize=256)  # an abstract model per call: the FLOP counts ask twice
def matmul_params(spec: ModelSpec) -> int:
  """Weights that take part in a matmul per token: every kernel, the LM head (tied: the
  embedding, used as the head); not the embedding lookup, norm gains or lambda vectors."""
  total = 0
  for name, shape in param_shapes(abstract_model(spec)).items():
    if name.endswith("kernel"):
      total += math.prod(shape)
  if spec.tie_embeddings:
    total += spec.vocab_size * spec.d_model
  return total


def attention_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
  """Forward attention-matmul FLOPs per token summed over layers, causal (halved)."""
  return 0.5 * variant_class(spec.variant).attention_flops(spec, seq_len) * spec.num_layers


def train_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
  return 6.0 * matmul_params(spec) + 3.0 * attention_flops_per_token(spec, seq_len)


def executed_flops_per_token(spec: ModelSpec, seq_len: int, packed: bool = False
                             ) -> tuple[float, str]:
  """(matmul FLOPs per token the compiled train step executes, the attention kernel that runs):
  6 x matmul weights plus what the chosen kernel computes (kernels/flops.py) per layer, plus what
  the remat policy recomputes in the backward: `full` the blocks' forward (weights and
  attention), `dots_with_no_batch_dims_saveable` the attention's forward (its products have batch
  dimensions), `dots_saveable` nothing. `packed`: rows of packed documents (text)."""
  p = kernel_inputs(spec, seq_len)
  kernel = kernels.resolve(spec.kernel, p.q1, p.k1, p.v)
  flops = lambda backward: kernels.executed_flops(kernel, p.q1, p.k1, p.v, p.q2,
                                                  backward=backward, packed=packed
                                                  ) / seq_len * spec.num_layers
  weights = matmul_params(spec)
  total = 6.0 * weights + flops(True)
  if spec.remat == "full":  # the blocks' weights: all but the LM head
    total += 2.0 * (weights - spec.vocab_size * spec.d_model) + flops(False)
  elif spec.remat == "dots_with_no_batch_dims_saveable":
    total += flops(False)
  return total, kernel


def _summary_writer():
  """tensorboardX's SummaryWriter, imported without torch where torch is not loaded yet: with the
  hf extra installed, tensorboardX would import torch (about 1.3 s in every training process)
  only to recognise torch tensors, and this logger writes floats."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricsLogger:
  """The metrics log (JSON rows) and TensorBoard events in the run folder, and a progress bar.

  Only process 0 writes; every process may call it.
  """

  def __init__(self, workdir: Path, total_steps: int, start_step: int, bar: bool = True):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    from tqdm import tqdm
    workdir.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(workdir)
    mend_jsonl_tail(folder.metrics)  # a resumed run appends after a whole line
    self.jsonl = open(folder.metrics, "a", buffering=1)
    self.tb = _summary_writer()(str(folder.tensorboard))
    self.bar = (tqdm(total=total_steps, initial=start_step, dynamic_ncols=True, unit="step",
                     mininterval=1.0) if bar else None)

  def write(self, step: int, values: dict[str, Any], kind: str = "train") -> None:
    if not self.enabled:
      return
    row = {"step": int(step), "kind": kind, "time": time.time()}
    row.update({k: _scalar(v) for k, v in values.items()})
    self.jsonl.write(json.dumps(row) + "\n")
    for k, v in row.items():
      if k not in ("step", "kind", "time") and isinstance(v, (int, float)) and math.isfinite(v):
        self.tb.add_scalar(f"{kind}/{k}", v, step)

  def progress(self, step: int, values: dict[str, float]) -> None:
    if not self.enabled or self.bar is None:
      return
    self.bar.n = step
    keys = ("loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "mfu")
    shown = {k: values[k] for k in keys if k in values}
    self.bar.set_postfix({k: (f"{v:.3g}" if k != "mfu" else f"{100 * v:.1f}%")
                          for k, v in shown.items()}, refresh=False)
    self.bar.refresh()

  def print(self, message: str) -> None:
    if not self.enabled:
      return
    if self.bar is None:
      print(message, flush=True)
    else:
      self.bar.write(message)

  def close(self) -> None:
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.close()
    self.tb.close()
    self.jsonl.close()


def _scalar(v):
  v = np.asarray(v)
  if v.ndim == 0:
    return v.item()
  return v.tolist()


def log_train_row(logger: MetricsLogger, window: "RateWindow", summary: dict, step: int,
                  values: dict) -> None:
  """A train step's row (its `layers` expanded per layer, perplexity, the window's rates)
  written and shown; the run's summary follows it."""
  values = dict(values)
  for name, per_layer in values.pop("layers").items():
    values |= expand_layers(name, per_layer)
  rates = window.measure()  # the first window (compilation) is not timed
  values |= dict(perplexity=math.exp(min(float(values["loss"]), 80.0)), **rates)
  logger.write(step, values)
  logger.progress(step, values)
  summary.update(step=step, loss=float(values["loss"]), **rates)
  window.reset()


def expand_layers(name: str, values) -> dict[str, float]:
  """Per-layer values as name/l{i} plus mean/min/max over layers."""
  values = np.asarray(values, np.float64)
  out = {f"{name}/l{i}": float(v) for i, v in enumerate(values)}
  out.update({f"{name}/mean": float(values.mean()), f"{name}/min": float(values.min()),
              f"{name}/max": float(values.max())})
  return out


class RateWindow:
  """Tokens/s, MFU and HFU over the training steps since the last reset: compilation (the first
  step), evaluation and checkpoint saves are kept out of the rate."""

  def __init__(self, tokens_per_step: int, model_flops_per_step: float,
               executed_flops_per_step: float, peak_flops: float):
    self.tokens, self.model_flops = tokens_per_step, model_flops_per_step
    self.executed_flops, self.peak_flops = executed_flops_per_step, peak_flops
    self.started: float | None = None
    self.steps = 0
    self.rates = dict(tokens_per_s=float("nan"), mfu=float("nan"), hfu=float("nan"))

  def step(self) -> None:
    self.steps += 1

  def reset(self) -> None:
    self.started, self.steps = time.perf_counter(), 0

  def measure(self) -> dict:
    """The rates over the window (the last ones if nothing was timed since)."""
    if self.started is not None and self.steps:
      seconds = (time.perf_counter() - self.started) / self.steps
      self.rates = dict(tokens_per_s=self.tokens / seconds,
                        mfu=self.model_flops / seconds / self.peak_flops,
                        hfu=self.executed_flops / seconds / self.peak_flops)
    return dict(self.rates)
