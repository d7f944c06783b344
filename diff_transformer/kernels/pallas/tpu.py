"""Grid-loop variant (Mosaic TPU; also the CPU interpret default).

The K/V (or Q, for dK/dV) loop is the last grid dimension ("arbitrary" semantics) with the
running state in VMEM scratch, as Mosaic pipelines block DMAs across grid steps. Layout is heads
major ([B, N, T, H]) so every block's last two dims are (rows, head width): TPU-legal when rows
are multiples of 8 / 128. Per-row vectors (lam, lse, delta, segment ids) live in HBM as
lane-dense [B, N, 1, T] rows (a [.., T, 1] column would be padded 128x by the TPU tiling) and are
reshaped to (rows, 1) columns in VMEM; so on TPU block_q and block_k must be multiples of 128
(or cover the whole padded sequence).
Causal tiles above the diagonal are skipped, and their index maps are clamped to the last useful
block so the pipeline does not fetch them.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from diff_transformer.kernels.pallas import _math
from diff_transformer.kernels.pallas._math import KernelConfig
from diff_transformer.kernels.pallas.tpu_backward import backward
from diff_transformer.kernels.pallas.tpu_blocks import (SQ, call, col, row, seg_specs,
                                                        tile_mask, when_visible)

__all__ = ["backward", "forward"]


def _fwd_kernel(r, cfg: KernelConfig, length: int, with_res: bool) -> None:
  i, j = pl.program_id(2), pl.program_id(3)
  maps = ("1", "2") if "q2" in r else ("1",)

  @pl.when(j == 0)
  def _init():
    for t in maps:
      r["m" + t][...] = jnp.full(r["m" + t].shape, _math.MASK_VALUE, jnp.float32)
      r["l" + t][...] = jnp.zeros(r["l" + t].shape, jnp.float32)
      r["acc" + t][...] = jnp.zeros(r["acc" + t].shape, jnp.float32)

  def step():
    mask = tile_mask(r, cfg, i, j, length)
    v = r["v"][...]
    k1 = r["k1"][...]
    keys = {"1": k1, "2": r["k2"][...] if "k2" in r else k1}  # shared K block read once
    for t in maps:
      s = _math.logits(r["q" + t][...], keys[t], cfg.scale, mask)
      m, l, acc = _math.online_update(s, v, r["m" + t][...], r["l" + t][...], r["acc" + t][...])
      r["m" + t][...], r["l" + t][...], r["acc" + t][...] = m, l, acc

  when_visible(cfg, i, j, step)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    out = r["acc1"][...] / r["l1"][...]
    if "q2" in r:
      o2 = r["acc2"][...] / r["l2"][...]
      out = out - col(r["lam"]) * o2
    r["out"][...] = out.astype(r["out"].dtype)
    if with_res:
      for t in maps:
        lse = r["m" + t][...] + jnp.log(r["l" + t][...])
        r["lse" + t][...] = lse.reshape(1, -1)
      if "q2" in r:
        r["o2"][...] = o2


def forward(cfg: KernelConfig, q1, k1, v, q2, k2, lam, q_seg, kv_seg, with_res: bool):
  batch, heads, length, dim = q1.shape
  kv_heads, dim_v = k1.shape[1], v.shape[-1]
  group, bq, bk = heads // kv_heads, cfg.block_q, cfg.block_k
  nq, nk = length // bq, length // bk

  def kv_block(i, j):
    return jnp.minimum(j, (i * bq + bq - 1) // bk) if cfg.causal else j

  q_spec = pl.BlockSpec((SQ, SQ, bq, dim), lambda b, n, i, j: (b, n, i, 0))
  row_spec = pl.BlockSpec((SQ, SQ, 1, bq), lambda b, n, i, j: (b, n, 0, i))
  k_spec = pl.BlockSpec((SQ, SQ, bk, dim), lambda b, n, i, j: (b, n // group, kv_block(i, j), 0))
  v_spec = pl.BlockSpec((SQ, SQ, bk, dim_v), lambda b, n, i, j: (b, n // group, kv_block(i, j), 0))
  inputs = {"q1": (q1, q_spec), "k1": (k1, k_spec), "v": (v, v_spec), "q2": (q2, q_spec),
            "k2": (k2, k_spec), "lam": (row(lam), row_spec)}
  inputs.update(seg_specs(q_seg, kv_seg, bq, bk, lambda b, n, i, j: (b, 0, i),
                           lambda b, n, i, j: (b, 0, kv_block(i, j))))
  o_spec = pl.BlockSpec((SQ, SQ, bq, dim_v), lambda b, n, i, j: (b, n, i, 0))
  outs = {"out": (jax.ShapeDtypeStruct((batch, heads, length, dim_v), q1.dtype), o_spec)}
  maps = ("1", "2") if q2 is not None else ("1",)
  if with_res:
    for t in maps:
      outs["lse" + t] = (jax.ShapeDtypeStruct((batch, heads, 1, length), jnp.float32), row_spec)
    if q2 is not None:
      outs["o2"] = (jax.ShapeDtypeStruct((batch, heads, length, dim_v), jnp.float32), o_spec)
  scratch = {}
  for t in maps:
    scratch.update({"m" + t: (bq, 1), "l" + t: (bq, 1), "acc" + t: (bq, dim_v)})
  kernel = functools.partial(_fwd_kernel, cfg=cfg, length=length, with_res=with_res)
  res = call(kernel, cfg, (batch, heads, nq, nk), inputs, outs, scratch)
  if not with_res:
    return res["out"]
  lse2 = res["lse2"][:, :, 0] if q2 is not None else None
  return res["out"], (res.get("o2"), res["lse1"][:, :, 0], lse2)


# ---------------------------------------------------------------------------------- backward
