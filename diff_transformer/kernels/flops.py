"""Matmul FLOPs a kernel actually executes for one attention call (QK^T and PV products only).

Counts what each path computes, not what the formula needs (training/metrics.py counts the model
FLOPs that MFU is measured against):
- 'xla': one QK^T per map, ONE PV on the differential map; causal self-attention computes the
  query blocks' lower-left rectangles, sum_i rows_i * end_i (about (n + 1) / 2n of T x S);
- 'reference': every map in full, and one PV per map;
- 'cudnn': the layout of kernels/cudnn.py: 2h query heads; q/k padded to the value width when
  values are wider, unless the exact layout runs here (cudnn.exact_reason() is ''); flash
  attention skips masked blocks (counted as T*S/2);
- 'pallas': one PV per map (two accumulators), masked blocks skipped (T*S/2).
Backward: twice the forward for the einsum paths; the fused kernels also recompute QK^T.
"""
from __future__ import annotations

from diff_transformer.kernels import cudnn, xla


def executed_flops(implementation: str, q1, k1, v, q2=None, *, causal: bool = True,
                   backward: bool = False, block_q: int = xla.BLOCK_Q,
                   cudnn_exact: bool | None = None, packed: bool = False) -> float:
  """FLOPs of one call (forward, or forward + backward); inputs may be ShapeDtypeStructs.
  `cudnn_exact`: whether 'cudnn' runs its exact layout (None: as it would on this host);
  `packed`: rows of packed documents (segment ids), where the exact layout splits values wider
  than q/k into q-wide parts and repeats QK^T for each (kernels/cudnn.py `_exact`)."""
  batch, q_len, heads, key_width = q1.shape
  kv_len, value_width = k1.shape[1], v.shape[-1]
  maps = 1 if q2 is None else 2
  area = float(q_len * kv_len)
  if implementation == "xla" and causal and q_len == kv_len and q_len > block_q:
    area = float(sum((end - start) * end for start, end in xla.causal_blocks(q_len, block_q)))
  elif implementation in ("cudnn", "pallas") and causal:
    area /= 2
  per_area = 2.0 * batch * heads * area
  if implementation == "xla":
    qk, pv = maps * key_width, value_width
  elif implementation in ("reference", "pallas"):  # one PV product per map
    qk, pv = maps * key_width, maps * value_width
  elif implementation == "cudnn":
    exact = not cudnn.exact_reason() if cudnn_exact is None else cudnn_exact
    padded = key_width if exact else max(key_width, value_width)
    if exact and packed:
      padded = key_width * max(1, value_width // key_width)
    qk, pv = maps * padded, maps * value_width
  else:
    raise ValueError(f"model.kernel: no FLOP count for kernel '{implementation}'")
  forward = per_area * (qk + pv)
  if not backward:
    return forward
  recompute = per_area * qk if implementation in ("cudnn", "pallas") else 0.0
  return 3.0 * forward + recompute
