"""The language-modelling study (DIFF paper Fig. 3 and Table 6 analogs at CPU scale): the four
parameter-matched variants on the built-in Shakespeare corpus (BPE 8192, the tokenizer and
split `python train.py` uses), two sizes x 5 seeds, each variant at its own best lr of a 4-point
grid; validation loss against training tokens and against parameters, and the loss split into
AR-hit tokens (the bigram they complete occurred earlier in the document) and the rest.

    python study.py --study=configs/studies/lm.py

Sized to under an hour on 2 idle CPU cores: 200 steps, the lr grid (4 points, 200-step runs) at
D=64 only, its lr used at both sizes (the time taken is in docs/results/study_lm/report.md).
Models this small need not show the papers' effect: a null result is a result.
"""
from configs import default
from diff_transformer.config import ffn_width
from diff_transformer.params import heads_for, matched_variant
from diff_transformer.study import Study

SIZES = {"d64": (64, 2), "d128": (128, 2)}  # D, layers; head width 32
SHARED_RANK = 16


def make(variant: str, size: str):
  d_model, layers = SIZES[size]
  c = default.get_config()
  m = c.model
  m.variant, m.d_model, m.num_layers, m.head_dim = "transformer", d_model, layers, 32
  m.num_heads = heads_for("transformer", d_model, 32)
  m.ffn_dim = ffn_width(d_model, 64, up=True)
  m.max_seq_len = c.data.seq_len = 128
  t = c.train
  t.steps, t.global_batch_size, t.warmup_steps = 200, 16, 20
  t.eval_every, t.eval_batches, t.checkpoint_every, t.log_every = 50, 8, 200, 25
  c = matched_variant(c, variant, rank=SHARED_RANK)
  c.source = f"LM study size {size}: D={d_model}, L={layers}, d=32, parameter-matched"
  return c


STUDY = Study(
    name="lm",
    make=make,
    sizes=tuple(SIZES),
    seeds=(0, 1, 2, 3, 4),
    primary="loss@d128",
    # 5 seeds cannot resolve 3 Holm-corrected comparisons (smallest p 0.19): run as exploratory
    # until the study is redesigned past early descent with 8 or more seeds.
    exploratory=True,
    lr_grid_seeds=(1000,),
    # (1e-3, 2e-3, 4e-3) chose its top for every variant, and (2e-3, 4e-3, 8e-3) its top for DIFF
    # V2; the grid runs the full 200 steps, since a shorter one favours the larger lr.
    lr_grid=(2e-3, 4e-3, 8e-3, 1.6e-2),
    lr_grid_steps=200,
    lr_grid_size="d64",
    quick_seeds=(0, 1),
    quick_overrides=(("train.steps", 40), ("train.checkpoint_every", 40),
                     ("train.eval_every", 20)),
    description=(
        "Language modelling on the built-in Shakespeare corpus (BPE 8192, sequences of 128 "
        "tokens, batch 16): D=64 and D=128, 2 layers, head width 32 (Transformer 2h heads, DIFF / "
        "Shared DIFF h = D/64 differential heads, DIFF V2 2h query heads; Shared DIFF rank 16), "
        "SwiGLU widths matched to the Transformer's parameter count; 200 steps (0.41M tokens). "
        "Each variant's lr is its best of a 4-point, 200-step grid at D=64, used at both sizes. "
        "Primary metric: final validation loss at D=128."),
)
get_config = STUDY.get_config
