"""The default variant study: compositional MQAR (configs/synthetic.py:<variant>-mqar), every
variant parameter-matched, 3 seeds, 800 steps; --quick: plain MQAR (8 keys, 4 asked, 128 task
ids, T=64), 2 seeds, 250 steps.

    python study.py --study=configs/studies/retrieval.py --root=runs/studies/retrieval
"""
from configs import synthetic
from diff_transformer.study import Study

STUDY = Study(
    name="retrieval",
    make=lambda variant: synthetic.get_config(f"{variant}-mqar"),
    seeds=(0, 1, 2),
    eval_rows=512,
    quick_seeds=(0, 1),
    quick_overrides=(("train.steps", 250), ("train.checkpoint_every", 250),
                     ("data.task.compositional", False), ("data.task.num_keys", 8),
                     ("data.task.num_queries", 4), ("data.task.vocab_size", 128),
                     ("data.seq_len", 64)),
    description=(
        "Compositional multi-query associative recall: 4 x 4 two-token keys stored as 16 "
        "`k1 k2 v` triples, 8 of them asked; every asked pair has 6 partial-match distractors. "
        "D=64, 2 layers, head width 16, short_conv 4, SwiGLU widths matched to the "
        "Transformer's parameter count. Slices vary the number of keys and the context length "
        "(up to 4x the trained length)."),
)
get_config = STUDY.get_config
