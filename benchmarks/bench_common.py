"""What the benchmarks share: synthetic token batches, the configs they build, each variant's
kernel inputs, and one way to time calls (interleaved) and read a program's compiled memory."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs.scaling import get_config  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.aot import inventory  # noqa: E402
from diff_transformer.aot.hlo import Hlo  # noqa: E402
from diff_transformer.config import base_config, validate  # noqa: E402
from diff_transformer.model.attention import make_spec  # noqa: E402
from diff_transformer.params import heads_for, set_rank  # noqa: E402
from diff_transformer.model.attention import kernel_inputs  # noqa: E402

PAPER_SIZE = "830m"


def spread(values) -> dict:
  """Median, min, max and count of repeated measurements."""
  return dict(median=float(np.median(values)), min=float(min(values)), max=float(max(values)),
              n=len(values))


def synthetic_batch(batch: int, seq_len: int, vocab: int, seed: int = 0,
                    documents: float = 1.0) -> dict[str, np.ndarray]:
  """One batch of uniformly random tokens in full rows: one document each, or packed documents
  of random lengths, about `documents` a row (positions restarting at each)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (batch, seq_len + 1), dtype=np.int32)
  segment_ids = np.ones((batch, seq_len), np.int32)
  if documents > 1:
    segment_ids += np.cumsum(rng.random((batch, seq_len)) < (documents - 1) / seq_len,
                             axis=1).astype(np.int32)
  starts = np.concatenate([np.ones((batch, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
                          axis=1)
  pos = np.arange(seq_len, dtype=np.int32)
  positions = pos - np.maximum.accumulate(np.where(starts, pos, 0), axis=1)
  return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=segment_ids,
              positions=positions.astype(np.int32), weights=np.ones((batch, seq_len), np.float32))


def small_config(variant: str, *, seq_len: int, batch: int, kernel: str = "auto",
                 dtype: str = "float32", d_model: int = 64, head_dim: int = 16, layers: int = 2,
                 vocab: int = 256):
  """A small validated config of `variant` (heads by the papers' rule at this D and d)."""
  c = base_config()
  m = c.model
  m.variant, m.d_model, m.num_layers, m.head_dim = variant, d_model, layers, head_dim
  m.num_heads = heads_for(variant, d_model, head_dim)
  set_rank(m, 4)
  m.ffn_dim, m.vocab_size, m.max_seq_len = 2 * d_model, vocab, seq_len
  m.kernel, m.dtype = kernel, dtype
  c.data.seq_len, c.train.global_batch_size = seq_len, batch
  return validate(c)


def paper_config(variant: str, *, seq_len: int, batch: int, layers: int, kernel: str = "auto",
                 dtype: str = "bfloat16", size: str = PAPER_SIZE):
  """A preset of configs/scaling.py (the papers' row for `variant` at `size`, 830M unless
  told) with its depth cut to `layers` (0: its full depth), sized for `batch` rows of
  `seq_len`."""
  c = get_config(f"{variant}-{size}")
  m = c.model
  m.num_layers, m.kernel, m.dtype, m.max_seq_len = layers or m.num_layers, kernel, dtype, seq_len
  c.data.seq_len, c.train.global_batch_size = seq_len, batch
  return validate(c)


def interleaved_times(calls: dict, rounds: int, inner: int = 1, deadline=None,
                      after_round=None, before_call=None, warm: bool = True) -> dict:
  """{key: [seconds per call, one per round]}: each call warmed once (unless `warm` is False),
  then A B C, A B C, ... so a change in the device's state hits every call alike. `deadline`
  (with .left()) ends the rounds early once every call has one; `after_round(r)` runs between
  rounds, untimed; `before_call(key)` runs before each call's timed steps, untimed."""
  for call in calls.values() if warm else ():
    jax.block_until_ready(call())
  times: dict[Any, list[float]] = {k: [] for k in calls}
  for r in range(rounds):
    if deadline is not None and deadline.left() < 0 and all(times.values()):
      break
    for k, call in calls.items():
      if before_call is not None:
        before_call(k)
      start = time.perf_counter()
      for _ in range(inner):
        out = call()
      jax.block_until_ready(out)
      times[k].append((time.perf_counter() - start) / inner)
    if after_round is not None:
      after_round(r)
  return times


class Stepper:
  """A train step as one of interleaved_times' calls: each call steps `states[key]` on `batch`
  and puts the new state back (steps that donate their state thread it through; calls that share
  a key share one state); `metrics` holds the last step's."""

  def __init__(self, step, batch, states: dict, key):
    self.step, self.batch, self.states, self.key = step, batch, states, key
    self.metrics: dict = {}  # none until the first call

  def __call__(self):
    self.states[self.key], self.metrics = self.step(self.states[self.key], self.batch)
    return self.metrics


def temp_bytes(compiled) -> int | None:
  try:
    return int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # not every backend reports it
    return None


def compiled_figures(compiled, text: str | None = None) -> dict:
  """A compiled step's peak and temporaries per device (GiB) and the bytes its GEMMs and its
  other kernels move per step (GB; aot/inventory.py). `text`: its HLO text, if already read."""
  memory = compiled.memory_analysis()
  classes = inventory.inventory(Hlo(text or compiled.as_text()))["classes"]
  return dict(peak_gib=round(aot.peak_bytes(memory) / aot.GIB, 3),
              temp_gib=round(memory.temp_size_in_bytes / aot.GIB, 3),
              gemm_gb=round(classes["gemm"]["bytes"] / 1e9, 2),
              other_gb=round(classes["other"]["bytes"] / 1e9, 2))


def kernel_spec(variant: str, *, heads: int = 4, kv_heads: int = 2, d: int = 64,
                dtype: str = "float32"):
  """A one-layer spec whose kernel call has `heads` query heads (DIFF V1: differential heads,
  each two maps; DIFF V2: output heads, 2x as many query heads in pairs) of width d over
  `kv_heads` kv heads; DIFF V1's values are 2d wide."""
  width = {"transformer": heads * d, "diff": 2 * heads * d, "diff_v2": heads * d}[variant]
  return make_spec(variant=variant, d_model=width, num_layers=1, num_heads=heads,
                   num_kv_heads=kv_heads, head_dim=d, ffn_dim=width, dtype=dtype)


def random_kernel_inputs(spec, seq_len: int, batch: int = 1, seed: int = 0) -> list:
  """[q1, k1, v, q2, k2, lam] as the kernels take them, traced from the variant's own projection
  (kernel_inputs) and filled with standard normals (None where the variant has none)."""
  p = kernel_inputs(spec, seq_len, batch)
  fields = [p.q1, p.k1, p.v, p.q2, p.k2, p.lam]
  keys = jax.random.split(jax.random.key(seed), len(fields))
  return [None if f is None else jax.random.normal(k, f.shape, f.dtype)
          for f, k in zip(fields, keys)]


def fwd_and_bwd(fn, args, lead: tuple[str, ...] = (), **fixed):
  """(forward, forward+backward, present arguments) of a kernel call `fn(*args, **fixed)` over
  its non-None arguments: the forward takes the `lead` keyword values first (e.g. segment ids,
  traced like the rest), then the present arguments; the backward is the gradient of the sum of
  its float32 output with respect to every present argument."""
  idx = [i for i, a in enumerate(args) if a is not None]

  def fwd(*values):
    full = [None] * len(args)
    for i, x in zip(idx, values[len(lead):]):
      full[i] = x
    return fn(*full, **dict(zip(lead, values[:len(lead)])), **fixed)

  bwd = jax.grad(lambda *values: jnp.sum(fwd(*values).astype(jnp.float32)),
                 argnums=tuple(range(len(lead), len(lead) + len(idx))))
  return fwd, bwd, [args[i] for i in idx]
