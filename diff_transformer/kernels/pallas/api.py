"""Public entry points: layout/padding around the kernels, the custom VJP, shard_map wrapper.

Autodiff cannot go through pallas_call, so `_fused` carries a custom VJP whose residuals are the
inputs, the output, the second map's output O2 (float32) and one log-sum-exp per map and row:
O(T) memory. The backward computes per-row terms in XLA (O(T)):
  out = O1 - lam O2, dO1 = dO, dO2 = -lam dO
  delta1 = rowsum(dO . O1) = rowsum(dO . out) + lam rowsum(dO . O2)
  delta2 = rowsum(dO2 . O2) = -lam rowsum(dO . O2),   dlam = -rowsum(dO . O2)
and the two Pallas kernels (dK/dV, dQ) do the rest.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from diff_transformer.kernels import auto, common
from diff_transformer.kernels.pallas import tpu, triton
from diff_transformer.kernels.pallas._math import KernelConfig

Array = jax.Array
_BACKENDS = {"tpu": tpu, "triton": triton}
_DEFAULT_BLOCKS = {"tpu": (128, 128), "triton": (64, 64)}


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _blocks(length: int, block_q: int, block_k: int, backend: str) -> tuple[int, int, int]:
  """Clamp blocks to the sequence and pick the padded length (a multiple of both blocks)."""
  small, large = sorted((block_q, block_k))
  if large % small:
    raise ValueError(f"pallas attention: block sizes {block_q}, {block_k} must divide each other")
  if backend == "triton":  # Triton tiles must be powers of two (tl.dot: at least 16)
    fit = max(16, 1 << (length - 1).bit_length())
  else:
    fit = _round_up(length, 8)
  if length <= small:
    return fit, fit, fit
  if length <= large:  # the larger block shrinks to the padded length (power of two on Triton)
    padded = fit if backend == "triton" else _round_up(length, small)
    return (min(block_q, padded), min(block_k, padded), padded)
  return block_q, block_k, _round_up(length, large)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(cfg: KernelConfig, q1, k1, v, q2, k2, lam, q_seg, kv_seg):
  return _BACKENDS[cfg.backend].forward(cfg, q1, k1, v, q2, k2, lam, q_seg, kv_seg, False)


def _fused_fwd(cfg: KernelConfig, q1, k1, v, q2, k2, lam, q_seg, kv_seg):
  out, (o2, lse1, lse2) = _BACKENDS[cfg.backend].forward(
      cfg, q1, k1, v, q2, k2, lam, q_seg, kv_seg, True)
  return out, (q1, k1, v, q2, k2, lam, q_seg, kv_seg, out, o2, lse1, lse2)


def _fused_bwd(cfg: KernelConfig, res, do):
  q1, k1, v, q2, k2, lam, q_seg, kv_seg, out, o2, lse1, lse2 = res
  do_f32 = do.astype(jnp.float32)
  delta1 = jnp.sum(do_f32 * out.astype(jnp.float32), axis=-1)
  delta2 = dlam = None
  if q2 is not None:
    r2 = jnp.sum(do_f32 * o2, axis=-1)
    delta1, delta2, dlam = delta1 + lam * r2, -lam * r2, -r2
  dq1, dk1, dv, dq2, dk2 = _BACKENDS[cfg.backend].backward(
      cfg, q1, k1, v, q2, k2, lam, q_seg, kv_seg, do, lse1, lse2, delta1, delta2)
  return dq1, dk1, dv, dq2, dk2, dlam, None, None


_fused.defvjp(_fused_fwd, _fused_bwd)


def _to_kernel(x: Array | None, padded: int, width: int | None = None) -> Array | None:
  """[B, T, N, H] -> heads-major [B, N, T_pad, H_pad], zero padded."""
  if x is None:
    return None
  pad_h = 0 if width is None else width - x.shape[-1]
  x = jnp.pad(x, ((0, 0), (0, padded - x.shape[1]), (0, 0), (0, pad_h)))
  return x.transpose(0, 2, 1, 3)


def attention(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal: bool = True,
              scale: float | None = None, mask=None, block_q: int | None = None,
              block_k: int | None = None, backend: str | None = None, interpret=None,
              num_warps: int | None = None, num_stages: int = 2) -> Array:
  """Fused differential flash attention (contract: kernels/common.py).

  backend: "tpu" (Mosaic grid-loop kernels) or "triton" (GPU); default from the JAX backend.
  interpret: default True on CPU (plain interpreter); a pltpu.InterpretParams runs the strict
  TPU-semantics interpreter. Blocks default to 128x128 (tpu) / 64x64 (triton).
  num_warps (Triton): default 8 where the padded value width exceeds 128 (DIFF V1's 2d-wide
  values), else 4: on an H200 at the 830M heads, T = 2048, 8 warps took DIFF V1's forward+backward
  from 6.52 to 5.44 ms and the Transformer's from 2.39 to 4.43
  (benchmarks/results/gpu_check_kernels.json).
  """
  if mask is not None:
    raise NotImplementedError(
        "pallas attention: an explicit `mask` (KV-cache decode) is not supported; use "
        "implementation='xla' or 'reference' for decoding, or causal/segment_ids here")
  common.check_shapes(q1, k1, v, q2, k2, lam)
  batch, length, heads, dim = q1.shape
  if k1.shape[1] != length:
    raise NotImplementedError("pallas attention: needs T == S (self-attention); decode via xla")
  platform = auto.target()  # where the program runs (an AOT compile's target, not this host)
  backend = backend or ("triton" if platform == "gpu" else "tpu")
  if backend not in _BACKENDS:
    raise ValueError(f"pallas attention: backend must be one of {sorted(_BACKENDS)}, got {backend}")
  interpret = platform == "cpu" if interpret is None else interpret
  dq, dk = _DEFAULT_BLOCKS[backend]
  bq, bk, padded = _blocks(length, block_q or dq, block_k or dk, backend)
  if backend == "tpu" and interpret is False and any(x % 128 and x != padded for x in (bq, bk)):
    raise ValueError(f"pallas attention: TPU blocks must be multiples of 128 (got {bq}, {bk})")
  width = width_v = None
  if backend == "triton":  # power-of-two head widths; zero columns leave q.k and P V unchanged
    width = max(16, 1 << (dim - 1).bit_length())
    width_v = max(16, 1 << (v.shape[-1] - 1).bit_length())
  if num_warps is None:
    num_warps = 8 if width_v is not None and width_v > 128 else 4
  cfg = KernelConfig(seq_len=length, block_q=bq, block_k=bk,
                     scale=common.default_scale(q1, scale), causal=causal, backend=backend,
                     interpret=interpret, num_warps=num_warps, num_stages=num_stages)
  lam_BNT = q_seg = kv_seg = None
  if q2 is not None:
    lam_BNT = common.lam_per_query(lam, batch, length, heads).transpose(0, 2, 1)
    lam_BNT = jnp.pad(lam_BNT, ((0, 0), (0, 0), (0, padded - length)))
  if segment_ids is not None:
    q_seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, padded - length)),
                    constant_values=-1)
    kv_seg = q_seg
  out = _fused(cfg, _to_kernel(q1, padded, width), _to_kernel(k1, padded, width),
               _to_kernel(v, padded, width_v), _to_kernel(q2, padded, width),
               _to_kernel(k2, padded, width), lam_BNT, q_seg, kv_seg)
  return out[:, :, :length, :v.shape[-1]].transpose(0, 2, 1, 3)


def sharded_attention(mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh,
                      batch_axes: str | tuple[str, ...] | None,
                      head_axes: str | tuple[str, ...] | None, **kernel_kwargs) -> Callable:
  """attention() under jax.shard_map: batch over `batch_axes`, heads over `head_axes`.

  Query heads and kv heads are both split over `head_axes`; with contiguous GQA groups every
  shard then holds whole groups (kv heads must divide by the head-axis size). Usable inside a
  jit over `mesh`; no collectives are needed.
  """

  def fn(q1, k1, v, q2=None, k2=None, lam=None, *, segment_ids=None, causal: bool = True,
         scale: float | None = None) -> Array:
    act = P(batch_axes, None, head_axes, None)
    named = {"q1": (q1, act), "k1": (k1, act), "v": (v, act), "q2": (q2, act), "k2": (k2, act),
             "segment_ids": (segment_ids, P(batch_axes, None))}
    if lam is not None:
      lam = jnp.asarray(lam, jnp.float32)
      named["lam"] = (lam, P(batch_axes, None, head_axes) if lam.ndim == 3 else P())
    present = [n for n, (x, _) in named.items() if x is not None]

    def local(*args):
      kw = dict(zip(present, args))
      return attention(kw.pop("q1"), kw.pop("k1"), kw.pop("v"), kw.pop("q2", None),
                       kw.pop("k2", None), kw.pop("lam", None), causal=causal, scale=scale,
                       segment_ids=kw.pop("segment_ids", None), **kernel_kwargs)

    sharded = jax.shard_map(local, mesh=mesh, in_specs=tuple(named[n][1] for n in present),
                            out_specs=act, check_vma=False)
    return sharded(*[named[n][0] for n in present])

  return fn
