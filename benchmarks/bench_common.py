"""What the benchmarks share: synthetic token batches and the configs they build."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs.scaling import get_config  # noqa: E402
from diff_transformer.config import base_config, validate  # noqa: E402
from diff_transformer.params import heads_for  # noqa: E402

PAPER_SIZE = "830m"


def spread(values) -> dict:
  """Median, min, max and count of repeated measurements."""
  return dict(median=float(np.median(values)), min=float(min(values)), max=float(max(values)),
              n=len(values))


def synthetic_batch(batch: int, seq_len: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
  """One batch of uniformly random tokens (full rows, one document each)."""
  tokens = np.random.default_rng(seed).integers(0, vocab, (batch, seq_len + 1), dtype=np.int32)
  return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:],
              segment_ids=np.ones((batch, seq_len), np.int32),
              positions=np.broadcast_to(np.arange(seq_len, dtype=np.int32),
                                        (batch, seq_len)).copy(),
              weights=np.ones((batch, seq_len), np.float32))


def small_config(variant: str, *, seq_len: int, batch: int, kernel: str = "auto",
                 dtype: str = "float32", d_model: int = 64, head_dim: int = 16, layers: int = 2,
                 vocab: int = 256):
  """A small validated config of `variant` (heads by the papers' rule at this D and d)."""
  c = base_config()
  m = c.model
  m.variant, m.d_model, m.num_layers, m.head_dim = variant, d_model, layers, head_dim
  m.num_heads = heads_for(variant, d_model, head_dim)
  m.rank = 4 if variant == "shared_diff" else 0
  m.ffn_dim, m.vocab_size, m.max_seq_len, m.kernel, m.dtype = 2 * d_model, vocab, seq_len, kernel, dtype
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
