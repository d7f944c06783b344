"""The grid-loop kernels' shared pieces (tpu.py forward, tpu_backward.py backward): the
pallas_call wrapper with Mosaic's dimension semantics, per-row vectors as lane-dense rows, the
causal / segment mask of a tile, and the skipping of tiles above the diagonal."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from diff_transformer.kernels.pallas import _math
from diff_transformer.kernels.pallas._math import KernelConfig

Array = jax.Array
SQ = pl.squeezed


def row(x: Array | None) -> Array | None:
  """[B, N, T] -> lane-dense [B, N, 1, T]."""
  return None if x is None else x[:, :, None, :]


def col(ref) -> Array:
  """A (1, rows) row block as a (rows, 1) column."""
  return ref[...].reshape(-1, 1)


def call(kernel, cfg: KernelConfig, grid, inputs, out_shapes, scratch, num_arbitrary: int = 1):
  """pallas_call over named (array, BlockSpec) inputs; the kernel gets a name -> ref dict."""
  names = [n for n, (a, _) in inputs.items() if a is not None]
  out_names = list(out_shapes)
  sem = (pltpu.PARALLEL,) * (len(grid) - num_arbitrary) + (pltpu.ARBITRARY,) * num_arbitrary

  def body(*refs):
    kernel(dict(zip(names + out_names + list(scratch), refs)))

  outs = pl.pallas_call(
      body, name=_math.kernel_name(kernel),
      grid=grid,
      in_specs=[inputs[n][1] for n in names],
      out_specs=[out_shapes[n][1] for n in out_names],
      out_shape=[out_shapes[n][0] for n in out_names],
      scratch_shapes=[pltpu.VMEM(shape, jnp.float32) for shape in scratch.values()],
      compiler_params=pltpu.CompilerParams(dimension_semantics=sem),
      interpret=cfg.interpret,
  )(*[inputs[n][0] for n in names])
  return dict(zip(out_names, outs))


def tile_mask(r, cfg: KernelConfig, i, j, length: int):
  bq, bk = cfg.block_q, cfg.block_k
  padded = cfg.padded(length)
  if not (cfg.causal or padded or "qs" in r):
    return None
  rows = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  cols = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  q_seg = col(r["qs"]) if "qs" in r else None
  kv_seg = r["ks"][...] if "ks" in r else None
  return _math.tile_mask(rows, cols, cfg, padded, q_seg, kv_seg)


def when_visible(cfg: KernelConfig, i, j, fn) -> None:
  """Run fn unless the (i, j) tile lies entirely above the causal diagonal."""
  if cfg.causal:
    pl.when(j * cfg.block_k <= i * cfg.block_q + cfg.block_q - 1)(fn)
  else:
    fn()


def seg_specs(q_seg, kv_seg, bq: int, bk: int, q_map, k_map):
  """Segment ids as [B, 1, T] rows: (1, bq) blocks for queries, (1, bk) for keys."""
  if q_seg is None:
    return {"qs": (None, None), "ks": (None, None)}
  return {"qs": (q_seg[:, None, :], pl.BlockSpec((SQ, 1, bq), q_map)),
          "ks": (kv_seg[:, None, :], pl.BlockSpec((SQ, 1, bk), k_map))}


# ----------------------------------------------------------------------------------- forward
