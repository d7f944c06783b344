"""Does differential attention beat the Transformer when both are tuned on lr and on the attention
branch's output scale? A pre-registered study at 2 and 4 layers.

    python study.py --study=configs/studies/lm_tuned.py --results=docs/results/study_lm_tuned

The setting is the LM study's (configs/studies/lm.py: bytes, D=128, head width 32, 1000 steps),
at 2 layers and at 4 (`@L4`: model.num_layers=4). Variants: the parameter-matched Transformer
(4 heads of 32), DIFF V1 (2 differential heads), and at 2 layers Shared DIFF.

The tuned knob is the multiplier on the attention branch before W_O (model.norm_out_scale; every
variant takes it, docs/semantics.md: under Adam it is W_O's initial scale and learning rate).
Each variant's compared cell (`<variant>@tuned`) is the (scale, lr) pair that is best on the grid
seeds by the primary, each scale its own candidate cell with its own bracketed lr grid
(study/tuning.py):
- DIFF V1 and Shared DIFF: 0.1, 0.2, 0.4 and the rule (1 - lambda_init after the sub-layer norm);
- the Transformer: 0.5, 1 (its rule) and 2;
- a scale grid grows by x2 at a numeric end that wins (one value per side), as the lr grids grow;
  ties go to the value named first.
At 4 layers the scales searched are the 2-layer choice /2, x1, x2 (`around`), named here before
any run, because the full design would take over 16 hours on 2 cores (below). Where the 2-layer
choice is DIFF's rule (not one number), the 4-layer search is the full list.

Compared runs: 10 seeds at 2 layers, 8 at 4 layers. The pre-named pairs (each a - b in
whole-split validation loss, nats per byte), Holm over 4 (smallest Holm p at 8 seeds: 0.031):
  1. DIFF V1 at its best - the Transformer at its best, 2 layers;
  2. the same at 4 layers;
  3. the Transformer at its best - the Transformer at 1 (its rule, at its own best lr);
  4. Shared DIFF at its best - the Transformer at its best, 2 layers.
Descriptive: each variant's loss against the scale at its own best lr (the grid's table).

Reuse: the output-scale study's grid records for DIFF V1 at the rule and at 0.2 (judged by the
primary, grid_by_primary, the same lr grid and grid seeds) are this study's `diff@scalerule` and
`diff@scale0.2` grid records (copied under those names; a record is taken only for exactly the
setting a point would train with). Its compared records are reused where the choice and lr match
(`reuse_from`: a point takes a record of that study trained under exactly its setting).

Cost, estimated before any run from the output-scale study's 9.9-minute median 2-layer run (two
children on 2 cores; a 4-layer run taken as 1.9x, 18.8 minutes):
- 2 layers: 11 candidates x 3 lrs x 2 grid seeds = 66 grid runs, 14 of them reused, about 12
  more where grids grow: ~64 to train; 40 compared runs. (64 + 40) x 9.9 = 1030 minutes.
- 4 layers: 6 candidates (7 if DIFF's 2-layer choice is its rule) x 6 = 36-42 grid runs, ~6 more
  where grids grow; 16 compared runs. (42 + 16) x 18.8 = 1090 minutes.
- About 35 hours of one core: about 18 hours with two children, run in parts (the full 4-layer
  search: about 19).
"""
from configs.studies import lm
from diff_transformer.study import Cell, Study, Tuned

SCALE = "model.norm_out_scale"
DIFF_SCALES = ("0.1", "0.2", "0.4", "rule")
TRANSFORMER_SCALES = ("0.5", "rule", "2")
FOUR_LAYERS = (("model.num_layers", 4),)
COMPARED_4L_SEEDS = tuple(range(8))

STUDY = Study(
    name="lm_tuned",
    make=lm.make,
    seeds=tuple(range(10)),
    cell_seeds=(("diff@L4@tuned", COMPARED_4L_SEEDS), ("transformer@L4@tuned", COMPARED_4L_SEEDS)),
    variants=("transformer@tuned", "diff@tuned", "shared_diff@tuned", "transformer@1",
              "transformer@L4@tuned", "diff@L4@tuned"),
    derived=(
        Cell("transformer@L4", "transformer", FOUR_LAYERS),
        Cell("diff@L4", "diff", FOUR_LAYERS),
        # the Transformer at its rule's scale (1), at that candidate's own grid lr
        Cell("transformer@1", "transformer@scalerule"),
    ),
    tuned=(
        Tuned("transformer@tuned", "transformer", SCALE, TRANSFORMER_SCALES, rule_at=1.0),
        Tuned("diff@tuned", "diff", SCALE, DIFF_SCALES),
        Tuned("shared_diff@tuned", "shared_diff", SCALE, DIFF_SCALES),
        Tuned("transformer@L4@tuned", "transformer@L4", SCALE, TRANSFORMER_SCALES, rule_at=1.0,
              around="transformer@tuned"),
        Tuned("diff@L4@tuned", "diff@L4", SCALE, DIFF_SCALES, around="diff@tuned"),
    ),
    comparisons=(
        ("diff@tuned", "transformer@tuned"),  # (1) differential attention, both tuned, 2 layers
        ("diff@L4@tuned", "transformer@L4@tuned"),  # (2) the same at 4 layers
        ("transformer@tuned", "transformer@1"),  # (3) what tuning the scale gives the Transformer
        ("shared_diff@tuned", "transformer@tuned"),  # (4) Shared DIFF, both tuned, 2 layers
    ),
    primary="loss",
    grid_by_primary=True,
    reuse_from=("docs/results/study_lm_scale",),
    **{**lm.SETTING_OPTIONS, "quick_lr_grid": (4e-3,)},  # --quick: one lr to choose scales on
    scope=("0.5M-parameter models (0.9M at 4 layers) on 4.1M bytes, where the context-free "
           "4-gram model scores 1.549 nats/byte; the DIFF paper tunes neither multiplier and "
           "trains 830M-13B-parameter models. This study can say whether, at this scale, "
           "differential attention is ahead once the output scale is tuned on both sides, not "
           "whether the paper's sizes behave alike."),
    description=(
        "The LM study's setting (bytes, D=128, 1000 steps = 4.1M tokens) at 2 and 4 layers. "
        "Each variant at its best (output scale, lr) pair on 2 grid seeds, judged by the primary "
        "on the whole validation split: DIFF V1 and Shared DIFF over scales 0.1, 0.2, 0.4 and "
        "the rule, the Transformer over 0.5, 1 and 2 (x2 growth at a winning end; at 4 layers "
        "the 2-layer choice /2, x1, x2). Primary: whole-split validation loss, four pre-named "
        "pairs, Holm over 4; 10 seeds at 2 layers, 8 at 4."),
)
get_config = STUDY.get_config
