"""Small models on the built-in synthetic retrieval tasks (data/synthetic.py): minutes on 2 CPU
cores, parameter-matched per variant as the scaling presets are.

Select with `--config=configs/synthetic.py:<variant>-<task>`, task one of:
  mqar_plain   plain MQAR (8 single-token keys, 4 asked, T=64, BLANK query-region filler): the
               sanity task plain attention solves (a Transformer reaches >= 0.9 answer accuracy
               in ~250 steps)
  mqar         compositional MQAR (4 x 4 two-token keys, 8 asked, T=96, key-pool filler): every
               asked pair has 6 partial-match distractors; the study task
               (configs/studies/retrieval.py)
  needle       multi-needle retrieval (4 needles, 2 asked, 2 key-grid distractors, T=128)

All variants: D=64, 2 layers, head width 16 (Transformer 4 heads, DIFF/Shared DIFF 2 differential
heads, DIFF V2 4 heads / 8 query heads; Shared DIFF rank 8), a width-4 short convolution on every
attention input (model.short_conv: the associative-recall recipe; without it such small models
sit at the 1/keys plateau for thousands of steps), SwiGLU width matched to the Transformer's
parameter count (params.matched_variant). Only the answer positions count in the loss.
"""
from __future__ import annotations

from typing import Any

from diff_transformer.config import base_config, validate
from diff_transformer.model.attention import PAPER_VARIANTS, variant_names
from diff_transformer.params import heads_for, matched_variant

TASKS: dict[str, tuple[str, dict[str, Any], int, int]] = {
    # task: (data.name, data.task overrides, seq_len, steps)
    "mqar_plain": ("mqar", dict(compositional=False, num_keys=8, num_queries=4, vocab_size=128,
                                filler="blank"), 64, 300),
    "mqar": ("mqar", dict(compositional=True, num_keys=4, num_queries=8, vocab_size=256), 96,
             800),
    "needle": ("needle", dict(needles=4, asked=2, distractors=2, vocab_size=256), 128, 800),
}
SHARED_RANK = 8


def preset_names() -> list[str]:
  return [f"{v}-{t}" for t in TASKS for v in PAPER_VARIANTS]  # any registered variant builds


def get_config(preset: str = "transformer-mqar"):
  variant, _, task = preset.partition("-")
  if variant not in variant_names() or task not in TASKS:
    raise ValueError(f"--config: unknown preset '{preset}'; choose one of "
                     f"{', '.join(preset_names())}")
  name, fields, seq_len, steps = TASKS[task]
  c = base_config()
  m = c.model
  m.variant, m.d_model, m.num_layers, m.head_dim = "transformer", 64, 2, 16
  m.num_heads = heads_for("transformer", 64, 16)
  m.ffn_dim, m.short_conv, m.max_seq_len = 128, 4, 512
  m.vocab_size = fields["vocab_size"]
  c.data.name, c.data.seq_len = name, seq_len
  c.data.task.update(fields)
  t = c.train
  t.steps, t.global_batch_size, t.lr, t.final_lr, t.warmup_steps = steps, 64, 3e-3, 3e-4, 20
  t.log_every, t.eval_every, t.eval_batches, t.checkpoint_every = 25, 50, 4, steps
  c = matched_variant(c, variant, rank=SHARED_RANK)
  c.source = (f"synthetic preset {preset}: D=64, L=2, d=16, short_conv 4, FFN "
              f"{c.model.ffn_dim} (parameter-matched to the Transformer)")
  return validate(c)
