"""In-kernel-loop variant for GPUs (Pallas Triton lowering).

Triton programs run independently, so a grid dimension cannot carry an accumulator: each
program owns one output tile and loops over the other axis with lax.fori_loop, slicing K/V (or
Q/dO) from whole-sequence refs. Per-row vectors are 1-D [B, N, T] / [B, T] arrays here.
Causal loops stop at (forward, dQ) or start from (dK/dV) the diagonal block.
Selected explicitly with triton.CompilerParams (the 0.10.2 GPU default is Mosaic GPU).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from diff_transformer.kernels.pallas import _math
from diff_transformer.kernels.pallas._math import KernelConfig

Array = jax.Array
_SQ = pl.squeezed


def _call(kernel, cfg: KernelConfig, grid, inputs, out_shapes):
  names = [n for n, (a, _) in inputs.items() if a is not None]
  out_names = list(out_shapes)

  def body(*refs):
    kernel(dict(zip(names + out_names, refs)))

  outs = pl.pallas_call(
      body, name=_math.kernel_name(kernel), grid=grid,
      in_specs=[inputs[n][1] for n in names],
      out_specs=[out_shapes[n][1] for n in out_names],
      out_shape=[out_shapes[n][0] for n in out_names],
      compiler_params=pltr.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
      interpret=cfg.interpret,
  )(*[inputs[n][0] for n in names])
  return dict(zip(out_names, outs))


def _mask(cfg: KernelConfig, length: int, q_start, k_start, q_seg, kv_seg):
  padded = cfg.padded(length)
  if not (cfg.causal or padded or q_seg is not None):
    return None
  rows = q_start + jnp.arange(cfg.block_q, dtype=jnp.int32)[:, None]
  cols = k_start + jnp.arange(cfg.block_k, dtype=jnp.int32)[None, :]
  seg = (None, None) if q_seg is None else (q_seg[:, None], kv_seg[None, :])
  return _math.tile_mask(rows, cols, cfg, padded, *seg)


def _rows(ref, start, size):
  return ref[pl.ds(start, size)] if ref.ndim == 1 else ref[pl.ds(start, size), :]


# ----------------------------------------------------------------------------------- forward


def _fwd_kernel(r, cfg: KernelConfig, length: int, with_res: bool) -> None:
  bq, bk = cfg.block_q, cfg.block_k
  q_start = pl.program_id(2) * bq
  diff = "q2" in r
  q1 = r["q1"][...]
  q2 = r["q2"][...] if diff else None
  q_seg = r["qs"][...] if "qs" in r else None
  num_k: int | jax.Array = length // bk
  if cfg.causal:
    num_k = jnp.minimum(num_k, (q_start + bq + bk - 1) // bk)
  dim_v = r["v"].shape[-1]
  init = (jnp.full((bq, 1), _math.MASK_VALUE, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
          jnp.zeros((bq, dim_v), jnp.float32))

  def body(j, carry):
    k_start = j * bk
    kv_seg = _rows(r["ks"], k_start, bk) if "ks" in r else None
    mask = _mask(cfg, length, q_start, k_start, q_seg, kv_seg)
    k1 = _rows(r["k1"], k_start, bk)
    v = _rows(r["v"], k_start, bk)
    state1 = _math.online_update(_math.logits(q1, k1, cfg.scale, mask), v, *carry[0])
    if not diff:
      return (state1,)
    k2 = _rows(r["k2"], k_start, bk) if "k2" in r else k1
    assert q2 is not None  # a differential call has its second queries
    state2 = _math.online_update(_math.logits(q2, k2, cfg.scale, mask), v, *carry[1])
    return state1, state2

  states = jax.lax.fori_loop(0, num_k, body, (init, init) if diff else (init,))
  (m1, l1, acc1) = states[0]
  out = acc1 / l1
  if diff:
    m2, l2, acc2 = states[1]
    o2 = acc2 / l2
    out = out - r["lam"][...][:, None] * o2
  r["out"][...] = out.astype(r["out"].dtype)
  if with_res:
    r["lse1"][...] = (m1 + jnp.log(l1))[:, 0]
    if diff:
      r["lse2"][...] = (m2 + jnp.log(l2))[:, 0]
      r["o2"][...] = o2


def forward(cfg: KernelConfig, q1, k1, v, q2, k2, lam, q_seg, kv_seg, with_res: bool):
  batch, heads, length, dim = q1.shape
  kv_heads, dim_v = k1.shape[1], v.shape[-1]
  group, bq = heads // kv_heads, cfg.block_q
  q_spec = pl.BlockSpec((_SQ, _SQ, bq, dim), lambda b, n, i: (b, n, i, 0))
  row_spec = pl.BlockSpec((_SQ, _SQ, bq), lambda b, n, i: (b, n, i))
  k_spec = pl.BlockSpec((_SQ, _SQ, length, dim), lambda b, n, i: (b, n // group, 0, 0))
  v_spec = pl.BlockSpec((_SQ, _SQ, length, dim_v), lambda b, n, i: (b, n // group, 0, 0))
  inputs = {"q1": (q1, q_spec), "k1": (k1, k_spec), "v": (v, v_spec), "q2": (q2, q_spec),
            "k2": (k2, k_spec), "lam": (lam, row_spec),
            "qs": (q_seg, pl.BlockSpec((_SQ, bq), lambda b, n, i: (b, i))),
            "ks": (kv_seg, pl.BlockSpec((_SQ, length), lambda b, n, i: (b, 0)))}
  o_spec = pl.BlockSpec((_SQ, _SQ, bq, dim_v), lambda b, n, i: (b, n, i, 0))
  outs = {"out": (jax.ShapeDtypeStruct((batch, heads, length, dim_v), q1.dtype), o_spec)}
  if with_res:
    outs["lse1"] = (jax.ShapeDtypeStruct((batch, heads, length), jnp.float32), row_spec)
    if q2 is not None:
      outs["lse2"] = (jax.ShapeDtypeStruct((batch, heads, length), jnp.float32), row_spec)
      outs["o2"] = (jax.ShapeDtypeStruct((batch, heads, length, dim_v), jnp.float32), o_spec)
  kernel = functools.partial(_fwd_kernel, cfg=cfg, length=length, with_res=with_res)
  res = _call(kernel, cfg, (batch, heads, length // bq), inputs, outs)
  if not with_res:
    return res["out"]
  return res["out"], (res.get("o2"), res["lse1"], res.get("lse2"))


# ---------------------------------------------------------------------------------- backward


def _tile_grads(cfg: KernelConfig, mask, q1, q2, k1, k2, v, do, lse1, lse2, delta1, delta2, lam):
  """(dS1, dS2 or None, P1 - lam P2) for one tile; per-row inputs are (rows,) vectors."""
  dp = _math.dot(do, v, trans_b=True)
  p1 = _math.probs(_math.logits(q1, k1, cfg.scale, mask), lse1[:, None])
  ds1 = _math.grad_logits(p1, dp, delta1[:, None], cfg.scale)
  if q2 is None:
    return ds1, None, p1
  lam = lam[:, None]
  p2 = _math.probs(_math.logits(q2, k2, cfg.scale, mask), lse2[:, None])
  ds2 = _math.grad_logits(p2, -lam * dp, delta2[:, None], cfg.scale)
  return ds1, ds2, p1 - lam * p2


_ROW_INPUTS = ("lse1", "lse2", "delta1", "delta2", "lam")


def _dkdv_kernel(r, cfg: KernelConfig, length: int, group: int) -> None:
  bq, bk = cfg.block_q, cfg.block_k
  k_start = pl.program_id(2) * bk
  k1 = r["k1"][...]
  k2 = r["k2"][...] if "k2" in r else k1
  v = r["v"][...]
  kv_seg = r["ks"][...] if "ks" in r else None
  first = k_start // bq if cfg.causal else 0
  blocks = length // bq - first

  def body(step, accs):
    h, i = step // blocks, first + step % blocks
    q_start = i * bq
    q_seg = _rows(r["qs"], q_start, bq) if "qs" in r else None
    mask = _mask(cfg, length, q_start, k_start, q_seg, kv_seg)
    get = lambda n: r[n][h, pl.ds(q_start, bq)] if n in r else None
    q1 = r["q1"][h, pl.ds(q_start, bq), :]
    q2 = r["q2"][h, pl.ds(q_start, bq), :] if "q2" in r else None
    do = r["do"][h, pl.ds(q_start, bq), :]
    ds1, ds2, pv = _tile_grads(cfg, mask, q1, q2, k1, k2, v, do, *map(get, _ROW_INPUTS))
    dk1 = accs[0] + _math.dot(ds1.astype(q1.dtype), q1, trans_a=True)
    dk2 = accs[1]
    if ds2 is not None:
      assert q2 is not None  # a second map's gradient comes with its queries
      ds2_q2 = _math.dot(ds2.astype(q2.dtype), q2, trans_a=True)
      dk1, dk2 = (dk1, dk2 + ds2_q2) if "k2" in r else (dk1 + ds2_q2, dk2)
    dv = accs[2] + _math.dot(pv.astype(do.dtype), do, trans_a=True)
    return dk1, dk2, dv

  zeros_k = jnp.zeros(k1.shape, jnp.float32)
  accs = (zeros_k, zeros_k, jnp.zeros(v.shape, jnp.float32))
  dk1, dk2, dv = jax.lax.fori_loop(0, group * blocks, body, accs)
  r["dk1"][...] = dk1.astype(r["dk1"].dtype)
  r["dv"][...] = dv.astype(r["dv"].dtype)
  if "dk2" in r:
    r["dk2"][...] = dk2.astype(r["dk2"].dtype)


def _dq_kernel(r, cfg: KernelConfig, length: int) -> None:
  bq, bk = cfg.block_q, cfg.block_k
  q_start = pl.program_id(2) * bq
  q1 = r["q1"][...]
  q2 = r["q2"][...] if "q2" in r else None
  do = r["do"][...]
  rows = [r[n][...] if n in r else None for n in _ROW_INPUTS]
  q_seg = r["qs"][...] if "qs" in r else None
  num_k: int | jax.Array = length // bk
  if cfg.causal:
    num_k = jnp.minimum(num_k, (q_start + bq + bk - 1) // bk)

  def body(j, accs):
    k_start = j * bk
    kv_seg = _rows(r["ks"], k_start, bk) if "ks" in r else None
    mask = _mask(cfg, length, q_start, k_start, q_seg, kv_seg)
    k1 = _rows(r["k1"], k_start, bk)
    k2 = _rows(r["k2"], k_start, bk) if "k2" in r else k1
    v = _rows(r["v"], k_start, bk)
    ds1, ds2, _ = _tile_grads(cfg, mask, q1, q2, k1, k2, v, do, *rows)
    dq1 = accs[0] + _math.dot(ds1.astype(k1.dtype), k1)
    dq2 = accs[1] if ds2 is None else accs[1] + _math.dot(ds2.astype(k2.dtype), k2)
    return dq1, dq2

  zeros = jnp.zeros(q1.shape, jnp.float32)
  dq1, dq2 = jax.lax.fori_loop(0, num_k, body, (zeros, zeros))
  r["dq1"][...] = dq1.astype(r["dq1"].dtype)
  if "dq2" in r:
    r["dq2"][...] = dq2.astype(r["dq2"].dtype)


def backward(cfg: KernelConfig, q1, k1, v, q2, k2, lam, q_seg, kv_seg, do, lse1, lse2, delta1,
             delta2):
  batch, heads, length, dim = q1.shape
  kv_heads, dim_v = k1.shape[1], v.shape[-1]
  group, bq, bk = heads // kv_heads, cfg.block_q, cfg.block_k
  row_arrays = dict(zip(_ROW_INPUTS, (lse1, lse2, delta1, delta2, lam)))

  # dK/dV: one program per (batch, kv head, kv block) loops over its group's heads and q blocks.
  grp = lambda last: pl.BlockSpec((_SQ, group, length, last), lambda b, h, j: (b, h, 0, 0))
  kv = lambda last: pl.BlockSpec((_SQ, _SQ, bk, last), lambda b, h, j: (b, h, j, 0))
  grp_rows = pl.BlockSpec((_SQ, group, length), lambda b, h, j: (b, h, 0))
  inputs = {"q1": (q1, grp(dim)), "q2": (q2, grp(dim)), "do": (do, grp(dim_v)),
            "k1": (k1, kv(dim)), "k2": (k2, kv(dim)), "v": (v, kv(dim_v)),
            "qs": (q_seg, pl.BlockSpec((_SQ, length), lambda b, h, j: (b, 0))),
            "ks": (kv_seg, pl.BlockSpec((_SQ, bk), lambda b, h, j: (b, j)))}
  inputs.update({n: (x, grp_rows) for n, x in row_arrays.items()})
  outs = {"dk1": (jax.ShapeDtypeStruct(k1.shape, k1.dtype), kv(dim)),
          "dv": (jax.ShapeDtypeStruct(v.shape, v.dtype), kv(dim_v))}
  if k2 is not None:
    outs["dk2"] = (jax.ShapeDtypeStruct(k2.shape, k2.dtype), kv(dim))
  kernel = functools.partial(_dkdv_kernel, cfg=cfg, length=length, group=group)
  kv_grads = _call(kernel, cfg, (batch, kv_heads, length // bk), inputs, outs)

  # dQ: one program per (batch, head, q block) loops over kv blocks.
  row = lambda last: pl.BlockSpec((_SQ, _SQ, bq, last), lambda b, n, i: (b, n, i, 0))
  full = lambda last: pl.BlockSpec((_SQ, _SQ, length, last), lambda b, n, i: (b, n // group, 0, 0))
  inputs = {"q1": (q1, row(dim)), "q2": (q2, row(dim)), "do": (do, row(dim_v)),
            "k1": (k1, full(dim)), "k2": (k2, full(dim)), "v": (v, full(dim_v)),
            "qs": (q_seg, pl.BlockSpec((_SQ, bq), lambda b, n, i: (b, i))),
            "ks": (kv_seg, pl.BlockSpec((_SQ, length), lambda b, n, i: (b, 0)))}
  row_vec = pl.BlockSpec((_SQ, _SQ, bq), lambda b, n, i: (b, n, i))
  inputs.update({n: (x, row_vec) for n, x in row_arrays.items()})
  outs = {"dq1": (jax.ShapeDtypeStruct(q1.shape, q1.dtype), row(dim))}
  if q2 is not None:
    outs["dq2"] = (jax.ShapeDtypeStruct(q2.shape, q2.dtype), row(dim))
  kernel = functools.partial(_dq_kernel, cfg=cfg, length=length)
  q_grads = _call(kernel, cfg, (batch, heads, length // bq), inputs, outs)
  return (q_grads["dq1"], kv_grads["dk1"], kv_grads["dv"], q_grads.get("dq2"),
          kv_grads.get("dk2"))
