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
from jax.experimental.pallas import tpu as pltpu

from diff_transformer.kernels.pallas import _math
from diff_transformer.kernels.pallas._math import Config

Array = jax.Array
_SQ = pl.squeezed


def _row(x: Array | None) -> Array | None:
  """[B, N, T] -> lane-dense [B, N, 1, T]."""
  return None if x is None else x[:, :, None, :]


def _col(ref) -> Array:
  """A (1, rows) row block as a (rows, 1) column."""
  return ref[...].reshape(-1, 1)


def _call(kernel, cfg: Config, grid, inputs, out_shapes, scratch, num_arbitrary: int = 1):
  """pallas_call over named (array, BlockSpec) inputs; the kernel gets a name -> ref dict."""
  names = [n for n, (a, _) in inputs.items() if a is not None]
  out_names = list(out_shapes)
  sem = (pltpu.PARALLEL,) * (len(grid) - num_arbitrary) + (pltpu.ARBITRARY,) * num_arbitrary

  def body(*refs):
    kernel(dict(zip(names + out_names + list(scratch), refs)))

  outs = pl.pallas_call(
      body,
      grid=grid,
      in_specs=[inputs[n][1] for n in names],
      out_specs=[out_shapes[n][1] for n in out_names],
      out_shape=[out_shapes[n][0] for n in out_names],
      scratch_shapes=[pltpu.VMEM(shape, jnp.float32) for shape in scratch.values()],
      compiler_params=pltpu.CompilerParams(dimension_semantics=sem),
      interpret=cfg.interpret,
  )(*[inputs[n][0] for n in names])
  return dict(zip(out_names, outs))


def _tile_mask(r, cfg: Config, i, j, length: int):
  bq, bk = cfg.block_q, cfg.block_k
  padded = cfg.padded(length)
  if not (cfg.causal or padded or "qs" in r):
    return None
  rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  cols = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  q_seg = _col(r["qs"]) if "qs" in r else None
  kv_seg = r["ks"][...] if "ks" in r else None
  return _math.tile_mask(rows, cols, cfg, padded, q_seg, kv_seg)


def _when_visible(cfg: Config, i, j, fn) -> None:
  """Run fn unless the (i, j) tile lies entirely above the causal diagonal."""
  if cfg.causal:
    pl.when(j * cfg.block_k <= i * cfg.block_q + cfg.block_q - 1)(fn)
  else:
    fn()


def _seg_specs(q_seg, kv_seg, bq: int, bk: int, q_map, k_map):
  """Segment ids as [B, 1, T] rows: (1, bq) blocks for queries, (1, bk) for keys."""
  if q_seg is None:
    return {"qs": (None, None), "ks": (None, None)}
  return {"qs": (q_seg[:, None, :], pl.BlockSpec((_SQ, 1, bq), q_map)),
          "ks": (kv_seg[:, None, :], pl.BlockSpec((_SQ, 1, bk), k_map))}


# ----------------------------------------------------------------------------------- forward
def _fwd_kernel(r, cfg: Config, length: int, with_res: bool) -> None:
  i, j = pl.program_id(2), pl.program_id(3)
  maps = ("1", "2") if "q2" in r else ("1",)

  @pl.when(j == 0)
  def _init():
    for t in maps:
      r["m" + t][...] = jnp.full(r["m" + t].shape, _math.MASK_VALUE, jnp.float32)
      r["l" + t][...] = jnp.zeros(r["l" + t].shape, jnp.float32)
      r["acc" + t][...] = jnp.zeros(r["acc" + t].shape, jnp.float32)

  def step():
    mask = _tile_mask(r, cfg, i, j, length)
    v = r["v"][...]
    k1 = r["k1"][...]
    keys = {"1": k1, "2": r["k2"][...] if "k2" in r else k1}  # shared K block read once
    for t in maps:
      s = _math.logits(r["q" + t][...], keys[t], cfg.scale, mask)
      m, l, acc = _math.online_update(s, v, r["m" + t][...], r["l" + t][...], r["acc" + t][...])
      r["m" + t][...], r["l" + t][...], r["acc" + t][...] = m, l, acc

  _when_visible(cfg, i, j, step)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    out = r["acc1"][...] / r["l1"][...]
    if "q2" in r:
      o2 = r["acc2"][...] / r["l2"][...]
      out = out - _col(r["lam"]) * o2
    r["out"][...] = out.astype(r["out"].dtype)
    if with_res:
      for t in maps:
        lse = r["m" + t][...] + jnp.log(r["l" + t][...])
        r["lse" + t][...] = lse.reshape(1, -1)
      if "q2" in r:
        r["o2"][...] = o2


def forward(cfg: Config, q1, k1, v, q2, k2, lam, q_seg, kv_seg, with_res: bool):
  batch, heads, length, dim = q1.shape
  kv_heads, dim_v = k1.shape[1], v.shape[-1]
  group, bq, bk = heads // kv_heads, cfg.block_q, cfg.block_k
  nq, nk = length // bq, length // bk

  def kv_block(i, j):
    return jnp.minimum(j, (i * bq + bq - 1) // bk) if cfg.causal else j

  q_spec = pl.BlockSpec((_SQ, _SQ, bq, dim), lambda b, n, i, j: (b, n, i, 0))
  row_spec = pl.BlockSpec((_SQ, _SQ, 1, bq), lambda b, n, i, j: (b, n, 0, i))
  k_spec = pl.BlockSpec((_SQ, _SQ, bk, dim), lambda b, n, i, j: (b, n // group, kv_block(i, j), 0))
  v_spec = pl.BlockSpec((_SQ, _SQ, bk, dim_v), lambda b, n, i, j: (b, n // group, kv_block(i, j), 0))
  inputs = {"q1": (q1, q_spec), "k1": (k1, k_spec), "v": (v, v_spec), "q2": (q2, q_spec),
            "k2": (k2, k_spec), "lam": (_row(lam), row_spec)}
  inputs.update(_seg_specs(q_seg, kv_seg, bq, bk, lambda b, n, i, j: (b, 0, i),
                           lambda b, n, i, j: (b, 0, kv_block(i, j))))
  o_spec = pl.BlockSpec((_SQ, _SQ, bq, dim_v), lambda b, n, i, j: (b, n, i, 0))
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
  res = _call(kernel, cfg, (batch, heads, nq, nk), inputs, outs, scratch)
  if not with_res:
    return res["out"]
  lse2 = res["lse2"][:, :, 0] if q2 is not None else None
  return res["out"], (res.get("o2"), res["lse1"][:, :, 0], lse2)


# ---------------------------------------------------------------------------------- backward
def _tile_grads(r, cfg: Config, mask):
  """Shared backward tile math: (dS1, dS2 or None, P1 - lam P2) for the current tile."""
  do, v = r["do"][...], r["v"][...]
  dp = _math.dot(do, v, trans_b=True)
  k1 = r["k1"][...]
  p1 = _math.probs(_math.logits(r["q1"][...], k1, cfg.scale, mask), _col(r["lse1"]))
  ds1 = _math.grad_logits(p1, dp, _col(r["delta1"]), cfg.scale)
  if "q2" not in r:
    return ds1, None, p1
  lam = _col(r["lam"])
  k2 = r["k2"][...] if "k2" in r else k1
  p2 = _math.probs(_math.logits(r["q2"][...], k2, cfg.scale, mask), _col(r["lse2"]))
  ds2 = _math.grad_logits(p2, -lam * dp, _col(r["delta2"]), cfg.scale)
  return ds1, ds2, p1 - lam * p2


def _dkdv_kernel(r, cfg: Config, length: int, nq: int) -> None:
  j, step_id = pl.program_id(2), pl.program_id(3)
  i = step_id % nq
  accs = [a for a in ("dk1", "dk2", "dv") if a + "_acc" in r]

  @pl.when(step_id == 0)
  def _init():
    for a in accs:
      r[a + "_acc"][...] = jnp.zeros(r[a + "_acc"].shape, jnp.float32)

  def step():
    ds1, ds2, pv = _tile_grads(r, cfg, _tile_mask(r, cfg, i, j, length))
    q1 = r["q1"][...]
    r["dk1_acc"][...] += _math.dot(ds1.astype(q1.dtype), q1, trans_a=True)
    if ds2 is not None:  # shared keys (V2) fold both maps into dk1
      q2 = r["q2"][...]
      acc = "dk2_acc" if "dk2_acc" in r else "dk1_acc"
      r[acc][...] += _math.dot(ds2.astype(q2.dtype), q2, trans_a=True)
    do = r["do"][...]
    r["dv_acc"][...] += _math.dot(pv.astype(do.dtype), do, trans_a=True)

  _when_visible(cfg, i, j, step)

  @pl.when(step_id == pl.num_programs(3) - 1)
  def _finish():
    for a in accs:
      r[a][...] = r[a + "_acc"][...].astype(r[a].dtype)


def _dq_kernel(r, cfg: Config, length: int) -> None:
  i, j = pl.program_id(2), pl.program_id(3)
  accs = [a for a in ("dq1", "dq2") if a + "_acc" in r]

  @pl.when(j == 0)
  def _init():
    for a in accs:
      r[a + "_acc"][...] = jnp.zeros(r[a + "_acc"].shape, jnp.float32)

  def step():
    ds1, ds2, _ = _tile_grads(r, cfg, _tile_mask(r, cfg, i, j, length))
    k1 = r["k1"][...]
    r["dq1_acc"][...] += _math.dot(ds1.astype(k1.dtype), k1)
    if ds2 is not None:
      k2 = r["k2"][...] if "k2" in r else k1
      r["dq2_acc"][...] += _math.dot(ds2.astype(k2.dtype), k2)

  _when_visible(cfg, i, j, step)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    for a in accs:
      r[a][...] = r[a + "_acc"][...].astype(r[a].dtype)


def backward(cfg: Config, q1, k1, v, q2, k2, lam, q_seg, kv_seg, do, lse1, lse2, delta1, delta2):
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

  specs = {"q": pl.BlockSpec((_SQ, _SQ, bq, dim), q_map),
           "do": pl.BlockSpec((_SQ, _SQ, bq, dim_v), q_map),
           "row": pl.BlockSpec((_SQ, _SQ, 1, bq), lambda b, h, j, s: (*q_map(b, h, j, s)[:2], 0,
                                                                     q_block(j, s))),
           "k": pl.BlockSpec((_SQ, _SQ, bk, dim), kv_map),
           "v": pl.BlockSpec((_SQ, _SQ, bk, dim_v), kv_map)}
  inputs = {"q1": (q1, specs["q"]), "q2": (q2, specs["q"]), "k1": (k1, specs["k"]),
            "k2": (k2, specs["k"]), "v": (v, specs["v"]), "do": (do, specs["do"])}
  inputs.update({n: (_row(x), specs["row"]) for n, x in per_row.items()})
  inputs.update(_seg_specs(q_seg, kv_seg, bq, bk, lambda b, h, j, s: (b, 0, q_block(j, s)),
                           lambda b, h, j, s: (b, 0, j)))
  outs = {"dk1": (jax.ShapeDtypeStruct(k1.shape, k1.dtype), specs["k"]),
          "dv": (jax.ShapeDtypeStruct(v.shape, v.dtype), specs["v"])}
  scratch = {"dk1_acc": (bk, dim), "dv_acc": (bk, dim_v)}
  if k2 is not None:
    outs["dk2"] = (jax.ShapeDtypeStruct(k2.shape, k2.dtype), specs["k"])
    scratch["dk2_acc"] = (bk, dim)
  kernel = functools.partial(_dkdv_kernel, cfg=cfg, length=length, nq=nq)
  kv_grads = _call(kernel, cfg, (batch, kv_heads, nk, group * nq), inputs, outs, scratch)

  # dQ: grid (B, N, q block, kv block), same clamping of skipped causal tiles as the forward.
  def kv_block(i, j):
    return jnp.minimum(j, (i * bq + bq - 1) // bk) if cfg.causal else j

  def row_map(b, n, i, j):
    return (b, n, i, 0)

  def k_map(b, n, i, j):
    return (b, n // group, kv_block(i, j), 0)

  q_spec = pl.BlockSpec((_SQ, _SQ, bq, dim), row_map)
  inputs = {"q1": (q1, q_spec), "q2": (q2, q_spec),
            "k1": (k1, pl.BlockSpec((_SQ, _SQ, bk, dim), k_map)),
            "k2": (k2, pl.BlockSpec((_SQ, _SQ, bk, dim), k_map)),
            "v": (v, pl.BlockSpec((_SQ, _SQ, bk, dim_v), k_map)),
            "do": (do, pl.BlockSpec((_SQ, _SQ, bq, dim_v), row_map))}
  row_vec = pl.BlockSpec((_SQ, _SQ, 1, bq), lambda b, n, i, j: (b, n, 0, i))
  inputs.update({n: (_row(x), row_vec) for n, x in per_row.items()})
  inputs.update(_seg_specs(q_seg, kv_seg, bq, bk, lambda b, n, i, j: (b, 0, i),
                           lambda b, n, i, j: (b, 0, kv_block(i, j))))
  outs = {"dq1": (jax.ShapeDtypeStruct(q1.shape, q1.dtype), q_spec)}
  scratch = {"dq1_acc": (bq, dim)}
  if q2 is not None:
    outs["dq2"] = (jax.ShapeDtypeStruct(q2.shape, q2.dtype), q_spec)
    scratch["dq2_acc"] = (bq, dim)
  kernel = functools.partial(_dq_kernel, cfg=cfg, length=length)
  q_grads = _call(kernel, cfg, (batch, heads, nq, nk), inputs, outs, scratch)
  return (q_grads["dq1"], kv_grads["dk1"], kv_grads["dv"], q_grads.get("dq2"),
          kv_grads.get("dk2"))
