"""Every size of the papers' scaling tables, one preset per (variant, size).

Select with `--config=configs/scaling.py:<variant>-<size>`, e.g. `diff-830m`, `transformer-13.1b`,
`shared_diff-2.8b`, `diff_v2-3b`, `diff-3b-64k`. Overrides as usual: `--config.model.num_layers=4`.

Sources (the papers' scaling tables; README 'Configs and presets'):
- DIFF / Transformer rows: DIFF paper Table 10 (Ye et al., Differential Transformer). Transformer
  rows keep D, L, d and use 2h heads (parameter-matched). FFN = 8/3 D rounded to the nearest
  multiple of 128 (the table gives no widths). Learning rate 1.5e-4 (830M-2.8B) and 7.5e-5
  (6.8B-13.1B) as in the seed slides; one secondary transcription of the paper reads ten times
  higher, so treat lr as uncertain. Schedule: 40K steps, 0.25M-token batches of 2048, warmup 375
  then linear decay (to 0: the paper states no floor), AdamW (0.9, 0.98), weight decay 0.05.
- Shared DIFF rows: Shared DIFF paper Table 3 (Cang et al.) with its ranks. Where D / 2h is not an
  integer (1.4B: 2048 / 20, 2.8B: 2880 / 28, 6.8B: 4096 / 40, 13.1B: 5120 / 60) we keep D, L, h and
  r, take d = D // 2h (rounded down to even for RoPE: 13.1B gets 84) and size W_O from 2h*d (a
  deviation from the table). The paper's §2.3 parameter formula counts two low-rank terms; the code
  has four (Q1, Q2, K1, K2) and reports what it has. Optimiser as the DIFF rows. Note: Table 3's
  2.8B/6.8B/13.1B rows are wider or deeper than the DIFF rows of the same name (2880 x 32, 4096 x
  35, 5120 x 44), so by the formulas those Shared DIFF presets count MORE parameters than DIFF's
  (3.3B, 7.1B, 13.8B paper count); at equal D, L, h, d Shared DIFF always has fewer
  (tests/test_params.py).
- DIFF V2 rows mirror the Transformer rows (same D, L, h, h_kv, d); V2 adds D*h*d query and D*h
  lambda parameters per layer.
- 3B rows (the DIFF paper's 3B setup and Shared DIFF Table 1): DIFF-3B L 28, D 3072, FFN 8192, 12
  heads of 128; Transformer-3B 24 heads; Shared-DIFF-3B L 30, D 2880, FFN 7680, 14 heads, rank 256.
  AdamW (0.9, 0.95), lr 3.2e-4, 1000 warmup steps, linear decay to 1.28e-5, weight decay 0.1,
  4M-token batches of 4096 (1T tokens = 250K steps).
- Long context (`<variant>-3b-64k`): the 3B rows with RoPE theta 640,000, lr 8e-5, sequence 64K.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from diff_transformer.config import base_config, ffn_width
from diff_transformer.model.attention import PAPER_VARIANTS, variant_names
from diff_transformer.params import heads_for

VOCAB = 100_288  # the papers' tokenizer size: cl100k_base's 100,277 ids rounded up to 64
# A run pads its tokenizer's ids to this multiple (model.vocab_multiple): VOCAB is then only the
# shape of data-free uses (aot_compile.py, parameter counts); 64 reproduces the papers' count.
VOCAB_MULTIPLE = 128


@dataclasses.dataclass(frozen=True)
class Row:
  d_model: int
  num_layers: int
  diff_heads: int  # h of DIFF (the table's heads); other variants take params.heads_for
  head_dim: int
  ffn_dim: int = 0  # 0 = ffn_width(d_model)
  lr: float = 1.5e-4


# DIFF paper Table 10 (sizes named by the paper's nominal parameter counts).
DIFF_ROWS = {
    "830m": Row(1536, 24, 8, 96),
    "1.4b": Row(2048, 24, 8, 128),
    "2.8b": Row(2560, 32, 10, 128),
    "6.8b": Row(4096, 32, 16, 128, lr=7.5e-5),
    "13.1b": Row(5120, 40, 20, 128, lr=7.5e-5),
    "3b": Row(3072, 28, 12, 128, ffn_dim=8192, lr=3.2e-4),
}

# Shared DIFF paper Table 3 (+ Table 1 for 3B): D, L, h, rank.
SHARED_ROWS = {
    "830m": (1536, 24, 8, 96),
    "1.4b": (2048, 24, 10, 128),
    "2.8b": (2880, 32, 14, 256),
    "6.8b": (4096, 35, 20, 320),
    "13.1b": (5120, 44, 30, 448),
    "3b": (2880, 30, 14, 256),
}
SHARED_FFN = {"2.8b": 7680, "3b": 7680}

# Nominal sizes of Table 10 (paper_params must land within 3%). The 3B rows are named by the
# paper's "3B" but count 3.5B by the paper rule (the 3B text says "about 2.8B"); no check.
NOMINAL = {"830m": 830e6, "1.4b": 1.4e9, "2.8b": 2.8e9, "6.8b": 6.8e9, "13.1b": 13.1e9}


def preset_names() -> list[str]:
  names = [f"{v}-{s}" for s in DIFF_ROWS for v in PAPER_VARIANTS]  # any registered one builds
  return names + [f"{v}-3b-64k" for v in PAPER_VARIANTS]


def get_config(preset: str = "diff-830m"):
  variant, _, size = preset.partition("-")
  long_context = size.endswith("-64k")
  size = size.removesuffix("-64k")
  if variant not in variant_names() or size not in DIFF_ROWS or (long_context and size != "3b"):
    raise ValueError(f"--config: unknown preset '{preset}'; choose one of "
                     f"{', '.join(preset_names())}")
  c = base_config()
  m = c.model
  m.variant, m.vocab_size, m.tie_embeddings = variant, VOCAB, False
  m.vocab_multiple = VOCAB_MULTIPLE  # a run's rows: its tokenizer's ids, padded
  row = DIFF_ROWS[size]
  if variant == "shared_diff":
    d_model, layers, heads, rank = SHARED_ROWS[size]
    m.d_model, m.num_layers, m.num_heads, m.shared_diff.rank = d_model, layers, heads, rank
    m.head_dim = d_model // (2 * heads) // 2 * 2  # even, for RoPE pairs
    m.ffn_dim = SHARED_FFN.get(size, ffn_width(d_model))
    source = f"Shared DIFF paper Table {'1' if size == '3b' else '3'} ({size})"
    if 2 * heads * m.head_dim != d_model:
      source += (f"; deviation: d = D // 2h (even) = {m.head_dim}, W_O sized 2h*d = "
                 f"{2 * heads * m.head_dim}")
  else:
    heads = heads_for(variant, row.d_model, row.head_dim)
    m.d_model, m.num_layers = row.d_model, row.num_layers
    m.num_heads, m.head_dim = heads, row.head_dim
    m.ffn_dim = row.ffn_dim or ffn_width(row.d_model)
    source = f"DIFF paper {'3B setup' if size == '3b' else 'Table 10'} ({size})"
    if heads != row.diff_heads:
      source += f"; {variant}: {heads} heads of d = {row.head_dim} (parameter-matched baseline)"
  if (not row.ffn_dim and variant != "shared_diff"
      or (variant == "shared_diff" and size not in SHARED_FFN)):
    source += f"; FFN {m.ffn_dim} = 8/3 D rounded to a multiple of 128"
  t = c.train
  if size == "3b":
    t.lr, t.final_lr, t.warmup_steps = 3.2e-4, 1.28e-5, 1000
    t.b1, t.b2, t.weight_decay = 0.9, 0.95, 0.1
    c.data.seq_len, t.global_batch_size, t.steps = 4096, 1024, 250_000
  else:
    t.lr, t.final_lr, t.warmup_steps, t.b1, t.b2, t.weight_decay = row.lr, 0.0, 375, 0.9, 0.98, 0.05
    c.data.seq_len, t.global_batch_size, t.steps = 2048, 128, 40_000
  if long_context:
    m.rope_theta, t.lr = 640_000.0, 8e-5
    c.data.seq_len = 65_536
    source += "; long-context: RoPE theta 640,000, lr 8e-5, sequence 64K"
  m.max_seq_len = c.data.seq_len
  c.data.tokenizer, c.data.name = "bpe", "prepared"
  c.data.bpe_vocab_size = VOCAB  # prepare the data with --bpe_vocab_size 100288
  c.train.eval_every, c.train.checkpoint_every = 1000, 1000
  c.source = source
  return c


def preset_size(preset_size: str) -> Callable[[str], ml_collections.ConfigDict]:
  """A sweep size (diff_transformer/sweeps) backed by these presets: '<variant>-<preset_size>'."""
  def make(variant: str) -> ml_collections.ConfigDict:
    return get_config(f"{variant}-{preset_size}")
  return make
