"""The default variant study: compositional MQAR (configs/synthetic.py:<variant>-mqar, query-
region filler drawn from the key pools), every variant parameter-matched and trained at its own
best lr of a 3-point grid, 5 seeds, 600 steps; primary metric: steps to 0.9 held-out accuracy on
the trained slice, censored at the budget.

    python study.py --study=configs/studies/retrieval.py

Sized to finish within an hour on 2 CPU cores (57.4 min idle, 2026-11-25): 600 steps (the
preset's 800 cut), the grid at 400 steps, 256 eval rows per slice. The grid must run past the
plateau before recall forms: at 250 steps every variant's loss was still near its start, and the
lr picked on those differences left the Transformer at the floor after 600 steps
(docs/synthetic.md). --quick: plain MQAR (8 keys, 4 asked, 128 task ids, T=64), 2 seeds, 250
steps, one lr for all (minutes).
"""
from configs import synthetic
from diff_transformer.study import Study

STUDY = Study(
    name="retrieval",
    make=lambda variant: synthetic.get_config(f"{variant}-mqar"),
    seeds=(0, 1, 2, 3, 4),
    primary="steps_to_90",
    lr_grid=(1e-3, 3e-3, 1e-2),
    lr_grid_steps=400,
    eval_rows=256,
    attention_rows=16,
    overrides=(("train.steps", 600), ("train.checkpoint_every", 600), ("train.eval_every", 25)),
    quick_seeds=(0, 1),
    quick_overrides=(("train.steps", 250), ("train.checkpoint_every", 250),
                     ("data.task.compositional", False), ("data.task.num_keys", 8),
                     ("data.task.num_queries", 4), ("data.task.vocab_size", 128),
                     ("data.seq_len", 64)),
    description=(
        "Compositional multi-query associative recall: 4 x 4 two-token keys stored as 16 "
        "`k1 k2 v` triples, 8 of them asked, the query region filled with random key-pool ids; "
        "every asked pair has 6 partial-match distractors, so one key token alone scores 0.25 "
        "(0.33 with elimination). D=64, 2 layers, head width 16, short_conv 4, SwiGLU widths "
        "matched to the Transformer's parameter count. Slices vary the number of keys and the "
        "context length (2x and 4x the trained length, queries spread uniformly)."),
)
get_config = STUDY.get_config
