"""Grid-loop backward (Mosaic TPU; also the CPU interpret default): dK/dV with the Q loop last
in the grid, then dQ with the K/V loop last (see tpu.py for the layout)."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from diff_transformer.kernels.pallas import _math
from diff_transformer.kernels.pallas._math import KernelConfig
from diff_transformer.kernels.pallas.tpu_blocks import (SQ, call, col, row, seg_specs,
                                                        tile_mask, when_visible)


def _tile_grads(r, cfg: KernelConfig, mask):
  """Shared backward tile math: (dS1, dS2 or None, P1 - lam P2) for the current tile."""
  do, v = r["do"][...], r["v"][...]
  dp = _math.dot(do, v, trans_b=True)
  k1 = r["k1"][...]
  p1 = _math.probs(_math.logits(r["q1"][...], k1, cfg.scale, mask), col(r["lse1"]))
  ds1 = _math.grad_logits(p1, dp, col(r["delta1"]), cfg.scale)
  if "q2" not in r:
    return ds1, None, p1
  lam = col(r["lam"])
  k2 = r["k2"][...] if "k2" in r else k1
  p2 = _math.probs(_math.logits(r["q2"][...], k2, cfg.scale, mask), col(r["lse2"]))
  ds2 = _math.grad_logits(p2, -lam * dp, col(r["delta2"]), cfg.scale)
  return ds1, ds2, p1 - lam * p2


def _dkdv_kernel(r, cfg: KernelConfig, length: int, nq: int) -> None:
  j, step_id = pl.program_id(2), pl.program_id(3)
  i = step_id % nq
  accs = [a for a in ("dk1", "dk2", "dv") if a + "_acc" in r]

  @pl.when(step_id == 0)
  def _init():
    for a in accs:
      r[a + "_acc"][...] = jnp.zeros(r[a + "_acc"].shape, jnp.float32)

  def step():
    ds1, ds2, pv = _tile_grads(r, cfg, tile_mask(r, cfg, i, j, length))
    q1 = r["q1"][...]
    r["dk1_acc"][...] += _math.dot(ds1.astype(q1.dtype), q1, trans_a=True)
    if ds2 is not None:  # shared keys (V2) fold both maps into dk1
      q2 = r["q2"][...]
      acc = "dk2_acc" if "dk2_acc" in r else "dk1_acc"
      r[acc][...] += _math.dot(ds2.astype(q2.dtype), q2, trans_a=True)
    do = r["do"][...]
    r["dv_acc"][...] += _math.dot(pv.astype(do.dtype), do, trans_a=True)

  when_visible(cfg, i, j, step)

  @pl.when(step_id == pl.num_programs(3) - 1)
  def _finish():
    for a in accs:
      r[a][...] = r[a + "_acc"][...].astype(r[a].dtype)


def _dq_kernel(r, cfg: KernelConfig, length: int) -> None:
  i, j = pl.program_id(2), pl.program_id(3)
  accs = [a for a in ("dq1", "dq2") if a + "_acc" in r]

  @pl.when(j == 0)
  def _init():
    for a in accs:
      r[a + "_acc"][...] = jnp.zeros(r[a + "_acc"].shape, jnp.float32)

  def step():
    ds1, ds2, _ = _tile_grads(r, cfg, tile_mask(r, cfg, i, j, length))
    k1 = r["k1"][...]
    r["dq1_acc"][...] += _math.dot(ds1.astype(k1.dtype), k1)
    if ds2 is not None:
      k2 = r["k2"][...] if "k2" in r else k1
      r["dq2_acc"][...] += _math.dot(ds2.astype(k2.dtype), k2)

  when_visible(cfg, i, j, step)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    for a in accs:
      r[a][...] = r[a + "_acc"][...].astype(r[a].dtype)


def backward(cfg: KernelConfig, q1, k1, v, q2, k2, lam, q_seg, kv_seg, do, lse1, lse2, delta1,
             delta2):
  batch, heads, length, dim = q1.shape
  kv_heads, dim_v = k1.shape[1], v.shape[-1]
  group, bq, bk = heads // kv_heads, cfg.block_q, cfg.block_k
  nq, nk = length // bq, length // bk
  per_row = {"lam": lam, "lse1": lse1, "lse2": lse2, "delta1": delta1, "delta2": delta2}

  # dK/dV: grid (B, K, kv block, group head x q block); the GQA sum happens in the accumulator.
  def q_block(j, s):
    return jnp.maximum(s % nq, (j * bk) // bq) if cfg.causal else s % nq

  def q_map(b, h, j, s):
    return (b, h * group + s // nq, q_block(j, s), 0)

  def kv_map(b, h, j, s):
    return (b, h, j, 0)

  specs = {"q": pl.BlockSpec((SQ, SQ, bq, dim), q_map),
           "do": pl.BlockSpec((SQ, SQ, bq, dim_v), q_map),
           "row": pl.BlockSpec((SQ, SQ, 1, bq), lambda b, h, j, s: (*q_map(b, h, j, s)[:2], 0,
                                                                     q_block(j, s))),
           "k": pl.BlockSpec((SQ, SQ, bk, dim), kv_map),
           "v": pl.BlockSpec((SQ, SQ, bk, dim_v), kv_map)}
  inputs = {"q1": (q1, specs["q"]), "q2": (q2, specs["q"]), "k1": (k1, specs["k"]),
            "k2": (k2, specs["k"]), "v": (v, specs["v"]), "do": (do, specs["do"])}
  inputs.update({n: (row(x), specs["row"]) for n, x in per_row.items()})
  inputs.update(seg_specs(q_seg, kv_seg, bq, bk, lambda b, h, j, s: (b, 0, q_block(j, s)),
                           lambda b, h, j, s: (b, 0, j)))
  outs = {"dk1": (jax.ShapeDtypeStruct(k1.shape, k1.dtype), specs["k"]),
          "dv": (jax.ShapeDtypeStruct(v.shape, v.dtype), specs["v"])}
  scratch = {"dk1_acc": (bk, dim), "dv_acc": (bk, dim_v)}
  if k2 is not None:
    outs["dk2"] = (jax.ShapeDtypeStruct(k2.shape, k2.dtype), specs["k"])
    scratch["dk2_acc"] = (bk, dim)
  kernel = functools.partial(_dkdv_kernel, cfg=cfg, length=length, nq=nq)
  kv_grads = call(kernel, cfg, (batch, kv_heads, nk, group * nq), inputs, outs, scratch)

  # dQ: grid (B, N, q block, kv block), same clamping of skipped causal tiles as the forward.
  def kv_block(i, j):
    return jnp.minimum(j, (i * bq + bq - 1) // bk) if cfg.causal else j

  def row_map(b, n, i, j):
    return (b, n, i, 0)

  def k_map(b, n, i, j):
    return (b, n // group, kv_block(i, j), 0)

  q_spec = pl.BlockSpec((SQ, SQ, bq, dim), row_map)
  inputs = {"q1": (q1, q_spec), "q2": (q2, q_spec),
            "k1": (k1, pl.BlockSpec((SQ, SQ, bk, dim), k_map)),
            "k2": (k2, pl.BlockSpec((SQ, SQ, bk, dim), k_map)),
            "v": (v, pl.BlockSpec((SQ, SQ, bk, dim_v), k_map)),
            "do": (do, pl.BlockSpec((SQ, SQ, bq, dim_v), row_map))}
  row_vec = pl.BlockSpec((SQ, SQ, 1, bq), lambda b, n, i, j: (b, n, 0, i))
  inputs.update({n: (row(x), row_vec) for n, x in per_row.items()})
  inputs.update(seg_specs(q_seg, kv_seg, bq, bk, lambda b, n, i, j: (b, 0, i),
                           lambda b, n, i, j: (b, 0, kv_block(i, j))))
  outs = {"dq1": (jax.ShapeDtypeStruct(q1.shape, q1.dtype), q_spec)}
  scratch = {"dq1_acc": (bq, dim)}
  if q2 is not None:
    outs["dq2"] = (jax.ShapeDtypeStruct(q2.shape, q2.dtype), q_spec)
    scratch["dq2_acc"] = (bq, dim)
  kernel = functools.partial(_dq_kernel, cfg=cfg, length=length)
  q_grads = call(kernel, cfg, (batch, heads, nq, nk), inputs, outs, scratch)
  return (q_grads["dq1"], kv_grads["dk1"], kv_grads["dv"], q_grads.get("dq2"),
          kv_grads.get("dk2"))
