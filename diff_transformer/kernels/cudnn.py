"""cuDNN's fused flash attention (GPU), in one of two layouts; `implementation='xla'` runs the
padded layout through XLA, which is how it is tested and timed on CPU.

The two softmax maps become extra query heads of ONE call:
- shared keys (DIFF V2): q1/q2 interleave back to 2H heads over the K kv heads, one GQA call;
- separate keys (DIFF V1, Shared DIFF): heads [q1; q2] over kv heads [k1; k2] with values [v; v]
  (autodiff sums the two halves of dV).

- **exact** (where `exact_reason()` is '': jax's own cuDNN entry, jax._src.cudnn, on a CUDA GPU
  with cuDNN >= 9.10.2 and compute capability 9.0+): q/k at the model's width with values wider
  (cuDNN's "MLA" case: DIFF V1's d and 2d), and packed rows as cuDNN's packed layout (each
  contiguous run of one segment id a sequence of its own: `packed_segments`), so no dense
  [B, 1, T, T] mask and no bias gradient. A row holds at most `max_segments` such sequences
  (cuDNN's batch and its softmax statistics grow with that cap); a batch with a row over the
  cap takes the padded layout instead (`lax.cond`, rematerialised, so it stores nothing when not
  taken). A train step takes no cond: under autodiff it would keep both branches' residuals for
  every layer, zeros for the branch not taken. Its driver reads the rows on the host
  (`rows_over_cap`) and runs the step traced for the one layout (`decided`). Packed offsets
  hold for q's head width only, so a packed call has its values at q's width
  (`equal_widths`): DIFF V1's 2d-wide values as two d-wide halves (and, before jax 0.11.2,
  GQA's k/v heads repeated).
- **padded** (elsewhere, for an explicit decoding mask, and where the environment variable
  DIFF_TRANSFORMER_CUDNN_LAYOUT=padded forces it): `jax.nn.dot_product_attention`, which wants
  values as wide as keys: q and k are zero-padded to the value width (the scale stays
  1/sqrt(d), so the logits are unchanged) and segment ids become a dense mask.
Which layout runs, and why, is said once per process.
"""
from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from diff_transformer import sharding
from diff_transformer.kernels import common
# Which layout runs is cudnn_layout's to say; its names are this module's too.
from diff_transformer.kernels.cudnn_layout import LAYOUT_ENV as LAYOUT_ENV  # noqa: F401
from diff_transformer.kernels.cudnn_layout import MLA_MIN_CUDNN as MLA_MIN_CUDNN  # noqa: F401
from diff_transformer.kernels.cudnn_layout import deviceless as deviceless  # noqa: F401
from diff_transformer.kernels.cudnn_layout import exact_reason
from diff_transformer.kernels.cudnn_layout import forced_layout as forced_layout  # noqa: F401

Array = jax.Array
# Packed rows: jax offsets k and v by the key's head count from 0.11.2 (earlier, by the
# query's, which misplaces GQA's keys); by q's head width in every version.
KV_OFFSETS_BY_KEY_HEADS = jax.__version_info__ >= (0, 11, 2)
# The sequences (documents) a packed row may hold in cuDNN's packed layout (model.max_segments).
# cuDNN's batch is rows x this cap, so its softmax statistics are [B * cap, heads, T] float32.
MAX_SEGMENTS = 16
_SAID: set[str] = set()


_DECIDED: list[bool] = []  # decided()'s answers, innermost last


@contextlib.contextmanager
def decided(over_cap: bool):
  """Traces packed calls for rows known to be over the cap (`over_cap`: the padded layout) or
  within it (the exact layout), with no cond of their own."""
  _DECIDED.append(over_cap)
  try:
    yield
  finally:
    _DECIDED.pop()


def cap_applies(implementation: str) -> bool:
  """Whether packed rows through `implementation` (a resolved kernel) meet the cap here."""
  return implementation == "cudnn" and not exact_reason()


def rows_over_cap(segment_ids, max_segments: int = MAX_SEGMENTS) -> bool:
  """On the host: whether a row of `segment_ids` ([..., T]) holds more contiguous runs than the
  packed layout takes (packed_segments' `over_cap`, from the rows before they reach a device)."""
  seg = np.asarray(segment_ids)
  seg = seg.reshape(-1, seg.shape[-1])
  runs = 1 + np.count_nonzero(seg[:, 1:] != seg[:, :-1], axis=1)
  return bool(np.any(runs > min(max_segments, seg.shape[-1])))


def _say_once(line: str) -> None:
  if line not in _SAID:
    _SAID.add(line)
    print(line, flush=True)


def packed_segments(segment_ids_BT: Array, max_segments: int = MAX_SEGMENTS
                    ) -> tuple[dict[str, Array], Array]:
  """cuDNN's packed layout of rows whose documents are contiguous runs of one segment id: per
  row, each of its first M = min(max_segments, T) runs' start (`*_offsets`, [B, M + 1]) and
  length (`*_seqlen`, [B, M]), left-aligned, unused entries -1; and whether some row has more
  than M runs (then the layout is incomplete and the caller takes another path). Within a
  contiguous run, causal by position in the row is causal by position in the run, so this
  computes what the segment mask does."""
  B, T = segment_ids_BT.shape
  M = min(max_segments, T)
  pos = jnp.arange(T, dtype=jnp.int32)
  new_run = jnp.concatenate([jnp.ones((B, 1), bool),
                             segment_ids_BT[:, 1:] != segment_ids_BT[:, :-1]], axis=1)
  # The runs' starts in order, then T (a run's end is the next start).
  starts = jnp.concatenate([jnp.sort(jnp.where(new_run, pos, T), axis=1),
                            jnp.full((B, 1), T, jnp.int32)], axis=1)[:, :M + 1]
  valid = starts[:, :M] < T
  seqlen = jnp.where(valid, starts[:, 1:] - starts[:, :M], -1).astype(jnp.int32)
  offsets = jnp.concatenate([jnp.where(valid, starts[:, :M], -1), jnp.full((B, 1), -1, jnp.int32)],
                            axis=1).astype(jnp.int32)
  over_cap = jnp.any(jnp.sum(new_run, axis=1) > M)
  return dict(q_seqlen=seqlen, kv_seqlen=seqlen, q_offsets=offsets, kv_offsets=offsets), over_cap


def cudnn_exact(q, k, v, *, scale, causal, q_seqlen=None, kv_seqlen=None, q_offsets=None,
                kv_offsets=None) -> Array:
  """One call of jax's cuDNN entry (BTNH; values may be wider than q/k)."""
  from jax._src.cudnn import fused_attention_stablehlo as entry
  kinds = entry.MaskType
  if q_seqlen is None:
    mask_type = kinds.CAUSAL if causal else kinds.NO_MASK
  else:
    mask_type = kinds.PADDING_CAUSAL if causal else kinds.PADDING
    # Sharded by rows as q is: left to propagation, the offsets come out replicated and jax's
    # cuDNN partitioner then gathers every row onto every device (seen in the deviceless H100
    # compile: each of 8 GPUs attending over all 16 rows).
    q_seqlen, kv_seqlen, q_offsets, kv_offsets = (
        sharding.constrain(x, (sharding.BATCH, None))
        for x in (q_seqlen, kv_seqlen, q_offsets, kv_offsets))
  q, k, v = (sharding.constrain(x, (sharding.BATCH, sharding.LENGTH, sharding.ACT_HEADS, None))
             for x in (q, k, v))
  return entry.dot_product_attention(q, k, v, q_seqlen=q_seqlen, kv_seqlen=kv_seqlen,
                                     q_offsets=q_offsets, kv_offsets=kv_offsets, scale=scale,
                                     mask_type=mask_type)


def equal_widths(core):
  """`core` (a cuDNN-entry-like call) for packed rows: jax turns the token offsets into element
  offsets with ONE per-token stride for q and the output and one for k and v (XLA reads Q/O and
  K/V at them), both at q's head width (and, before jax 0.11.2, k/v must have q's heads: GQA's
  are repeated, autodiff summing their gradients back). Values `parts` times as wide as q become
  `parts` heads of q's width: [q; q], [k; k], [v_1; v_2] in one call, the outputs' halves put
  back side by side. Unpacked calls pass as they are."""
  def call(q, k, v, *, scale, causal, **packed):
    heads, width = q.shape[2], q.shape[3]
    kv_heads_ok = k.shape[2] == heads or KV_OFFSETS_BY_KEY_HEADS
    if not packed or (kv_heads_ok and v.shape[3] == width):
      return core(q, k, v, scale=scale, causal=causal, **packed)
    if not kv_heads_ok:
      k, v = (jnp.repeat(x, heads // k.shape[2], axis=2) for x in (k, v))
    parts = v.shape[3] // width
    if parts * width != v.shape[3]:
      raise ValueError(f"cudnn packed rows: value width {v.shape[3]} is not a multiple of the "
                       f"query width {width}")
    o = core(jnp.concatenate([q] * parts, axis=2), jnp.concatenate([k] * parts, axis=2),
             jnp.concatenate(jnp.split(v, parts, axis=3), axis=2), scale=scale, causal=causal,
             **packed)
    return jnp.concatenate(jnp.split(o, parts, axis=2), axis=3)
  return call


def _exact(core, q, k, v, *, scale, causal, segment_ids, max_segments: int, fallback) -> Array:
  """One call in the exact layout; packed rows over the cap take `fallback` (the padded layout,
  rematerialised: under a gradient a cond keeps both branches' residuals, and this one's are
  then its inputs alone)."""
  if segment_ids is None:
    return core(q, k, v, scale=scale, causal=causal)
  padded = lambda q, k, v: fallback(q, k, v, scale=scale, causal=causal,
                                    segment_ids=segment_ids, mask=None)
  if _DECIDED and _DECIDED[-1]:
    return padded(q, k, v)
  packed, over_cap = packed_segments(segment_ids, max_segments)
  in_layout = lambda q, k, v: core(q, k, v, scale=scale, causal=causal, **packed)
  if _DECIDED:
    return in_layout(q, k, v)
  return jax.lax.cond(over_cap, jax.checkpoint(padded), in_layout, q, k, v)


def _padded(q, k, v, *, scale, causal, segment_ids, mask, implementation) -> Array:
  width = max(q.shape[-1], v.shape[-1])
  q, k = _pad_to(q, width), _pad_to(k, width)
  bias_mask = None
  if mask is not None:
    bias_mask = mask.astype(bool)[:, None]
  elif segment_ids is not None:
    bias_mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
  if bias_mask is not None:
    q, k, v, bias_mask = _sharded_as_query(q, k, v, bias_mask)
  return jax.nn.dot_product_attention(
      q, k, v, scale=scale, is_causal=causal and mask is None, mask=bias_mask,
      implementation=implementation)


def _sharded_as_query(q_BTNH: Array, k_BTKH: Array, v_BTKH: Array, mask_B1TT: Array
                      ) -> tuple[Array, Array, Array, Array]:
  """q, k, v and the dense mask sharded alike on batch and heads, as jax's cuDNN partitioner
  demands under a mesh (else: "Query and bias should have same sharding on batch and num_head
  dim"); where the heads are split over devices the mask is broadcast to every head first."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return q_BTNH, k_BTKH, v_BTKH, mask_B1TT
  heads_axes = sharding.mesh_axes(mesh, sharding.ACT_HEADS)
  split = heads_axes is not None and math.prod(
      mesh.shape[a] for a in ((heads_axes,) if isinstance(heads_axes, str) else heads_axes)) > 1
  if split:
    mask_B1TT = jnp.broadcast_to(mask_B1TT, (mask_B1TT.shape[0], q_BTNH.shape[2])
                                 + mask_B1TT.shape[2:])
  names = (sharding.BATCH, sharding.LENGTH, sharding.ACT_HEADS, None)
  return (sharding.constrain(q_BTNH, names), sharding.constrain(k_BTKH, names),
          sharding.constrain(v_BTKH, names),
          sharding.constrain(mask_B1TT, (sharding.BATCH, sharding.ACT_HEADS, None, None)))


def attention(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal=True, scale=None,
              mask=None, implementation: str = "cudnn", core=None, padded: bool = False,
              separate_calls: bool = False, max_segments: int = MAX_SEGMENTS) -> Array:
  """The kernel contract (kernels/common.py) through cuDNN. `core`: the exact layout's attention
  call (default `equal_widths(cudnn_exact)` where `exact_reason()` allows it; the tests put an
  exact CPU attention in cuDNN's place, the GPU check also the entry without `equal_widths`);
  `implementation`: jax.nn.dot_product_attention's, for the padded layout (and for packed rows
  over `max_segments`, which take it); `padded`: the padded layout even where the exact one
  runs; `separate_calls`: DIFF V1's two maps as two calls sharing v instead of one call over
  [v; v] (the GPU check times all three)."""
  common.check_shapes(q1, k1, v, q2, k2, lam)
  scale = common.default_scale(q1, scale)
  if core is None and implementation == "cudnn" and mask is None and not padded:
    why = exact_reason()
    core = None if why else equal_widths(cudnn_exact)
    _say_once("cudnn: q/k at the model's width, packed rows in cuDNN's own layout" if not why
              else f"cudnn: padded layout (q/k padded to the value width, a dense segment mask): "
                   f"{why}")
  padded_call = functools.partial(_padded, implementation=implementation)
  if core is not None and mask is None and not padded:
    call = functools.partial(_exact, core, scale=scale, causal=causal, segment_ids=segment_ids,
                             max_segments=max_segments, fallback=padded_call)
  else:
    call = functools.partial(padded_call, scale=scale, causal=causal, segment_ids=segment_ids,
                             mask=mask)
  batch, q_len, heads, _ = q1.shape
  if q2 is None:
    return call(q1, k1, v)
  lam_BTN1 = common.lam_per_query(lam, batch, q_len, heads)[..., None]
  if k2 is None and v.shape[-1] == k1.shape[-1]:
    q_BT2NH = jnp.stack([q1, q2], axis=3).reshape(batch, q_len, 2 * heads, q1.shape[-1])
    o_BT2NH = call(q_BT2NH, k1, v).reshape(batch, q_len, heads, 2, v.shape[-1])
    o1, o2 = o_BT2NH[:, :, :, 0], o_BT2NH[:, :, :, 1]
  elif separate_calls:
    o1, o2 = call(q1, k1, v), call(q2, k1 if k2 is None else k2, v)
  else:
    k2 = k1 if k2 is None else k2
    o = call(jnp.concatenate([q1, q2], axis=2), jnp.concatenate([k1, k2], axis=2),
             jnp.concatenate([v, v], axis=2))
    o1, o2 = o[:, :, :heads], o[:, :, heads:]
  out = o1.astype(jnp.float32) - lam_BTN1 * o2.astype(jnp.float32)
  return out.astype(q1.dtype)


def _pad_to(x: Array, width: int) -> Array:
  extra = width - x.shape[-1]
  return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])
