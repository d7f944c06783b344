"""Training metrics: FLOPs and MFU, JSONL + TensorBoard files in the workdir, a tqdm bar.

FLOPs follow MaxText's accounting: 6 FLOPs per weight per token for the matmul weights (forward
2, backward 4; the embedding lookup is not a matmul, the LM head is), plus the attention score
and value matmuls, halved because causal attention computes only the lower triangle, times 3
for forward + backward. Each variant states its attention FLOPs (`Attention.attention_flops`):
differential variants count what their kernels execute, two softmax maps per head, each with its
QK^T and its product with V.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import numpy as np

from diff_transformer.errors import TrainError
from diff_transformer.model.attention import variant_class
from diff_transformer.model.spec import ModelSpec
from diff_transformer.params import abstract_model, param_shapes

# Dense bf16 peak TFLOP/s per device by jax device_kind (first matching substring wins).
PEAK_TFLOPS = (
    ("TPU v6", 918.0),  # Trillium ("TPU v6 lite")
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5", 459.0),  # v5p
    ("TPU v4", 275.0),
    ("H200", 989.0),
    ("H100", 989.0),  # SXM dense
    ("A100", 312.0),
)
# CPU has no vendor peak: a nominal 0.35 TFLOP/s per host, the float32 2048^3 matmul rate measured
# on the project's 2-core AVX-512 machines, shared by that host's CPU devices.
CPU_HOST_TFLOPS = 0.35


def peak_tflops_per_device(configured: float = 0.0) -> float:
  """train.peak_tflops if set, else the table entry for this device kind."""
  if configured > 0:
    return float(configured)
  device = jax.local_devices()[0]
  if device.platform == "cpu":
    return CPU_HOST_TFLOPS / jax.local_device_count()
  for key, value in PEAK_TFLOPS:
    if key in device.device_kind:
      return value
  raise TrainError(f"train.peak_tflops: unknown device kind '{device.device_kind}'; set the "
                   "per-device peak TFLOP/s in the config")


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


class MetricsLogger:
  """metrics.jsonl + TensorBoard events (tb/) in the workdir, and a console progress bar.

  Only process 0 writes; every process may call it.
  """

  def __init__(self, workdir: Path, total_steps: int, start_step: int):
    self.enabled = jax.process_index() == 0
    if not self.enabled:
      return
    from tensorboardX import SummaryWriter
    from tqdm import tqdm
    workdir.mkdir(parents=True, exist_ok=True)
    self.jsonl = open(workdir / "metrics.jsonl", "a", buffering=1)
    self.tb = SummaryWriter(str(workdir / "tb"))
    self.bar = tqdm(total=total_steps, initial=start_step, dynamic_ncols=True, unit="step",
                    mininterval=1.0)

  def write(self, step: int, values: dict[str, float], kind: str = "train") -> None:
    if not self.enabled:
      return
    row = {"step": int(step), "kind": kind, "time": time.time()}
    row.update({k: _scalar(v) for k, v in values.items()})
    self.jsonl.write(json.dumps(row) + "\n")
    for k, v in row.items():
      if k not in ("step", "kind", "time") and isinstance(v, (int, float)) and math.isfinite(v):
        self.tb.add_scalar(f"{kind}/{k}", v, step)

  def progress(self, step: int, values: dict[str, float]) -> None:
    if not self.enabled:
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
    self.bar.write(message)

  def close(self) -> None:
    if not self.enabled:
      return
    self.bar.close()
    self.tb.close()
    self.jsonl.close()


def _scalar(v):
  v = np.asarray(v)
  if v.ndim == 0:
    return v.item()
  return v.tolist()


def expand_layers(name: str, values) -> dict[str, float]:
  """Per-layer values as name/l{i} plus mean/min/max over layers."""
  values = np.asarray(values, np.float64)
  out = {f"{name}/l{i}": float(v) for i, v in enumerate(values)}
  out.update({f"{name}/mean": float(values.mean()), f"{name}/min": float(values.min()),
              f"{name}/max": float(values.max())})
  return out
