"""Is DIFF V1 ahead of a tuned Transformer at 4 layers? A confirmatory study: one pre-named pair,
both searches finished, 16 seeds. Named in full before any of its runs.

    python study.py --study=configs/studies/lm_confirm4.py --results=docs/results/study_lm_confirm4

Why: the tuned study (docs/results/study_lm_tuned/) found DIFF V1 0.010 nats/byte lower than the
tuned Transformer at 4 layers on 7 of 8 seeds (exact p 0.031, Holm over 4: 0.125, unresolved),
with both 4-layer searches stopped at an end of their grids (the lowest lr tried, and the
Transformer's smallest scale). This study asks that one question again, on fresh seeds.

Setting: the LM study's (configs/studies/lm.py: bytes, D=128, head width 32, 1000 steps = 4.1M
tokens) at 4 layers. Compared: the parameter-matched Transformer (4 heads of 32) and DIFF V1
(2 differential heads), each at its own best (output scale, lr) on the grid seeds
(study/tuning.py; the tuned key is model.norm_out_scale, the attention branch's multiplier
before W_O):
- the Transformer over scales 0.0625, 0.125, 0.25; DIFF V1 over 0.05, 0.1, 0.2; a scale grid
  grows by x2 at a numeric end that wins (one value per side: 0.03125 if 0.0625 wins);
- lr 5.29e-4, 7.93e-4, 1.19e-3, 1.78e-3 for every candidate, grown at a winning end at the grid's
  ratio (1.5), up to 2 points a side;
- 4 grid seeds (1000-1003), judged by the primary on the whole validation split.
Where a chosen scale or lr still sits at an end after growth, the report flags it (not bracketed).

Primary, the only family: DIFF V1 at its best - the Transformer at its best, whole-split
validation loss (nats per byte), an exact paired test over 16 compared seeds (10-25: none a grid
seed, none a compared seed of the tuned study, so the runs that raised the question are not
counted again). The observed effect (1.15 SD) needs 9 seeds for 80% power; 16 keep that power
against an SD at its 80% upper bound, or a paper-sized 0.007 nats.

Descriptive, named now, read only after the primary: the gap over steps (200, 500, 1000), by
position, by byte frequency and on AR-hit bytes (4 bytes of context, where the paper's mechanism
would act), each run against the context-free 4-gram floor (1.549 nats/byte). If time allows
after every compared run here is recorded, a secondary study trains the same pair at 6 layers on
8 seeds at the 4-layer choices, as descriptive rows only.

Reuse: the tuned study's 4-layer grid records at lr 1.19e-3 and 1.78e-3, grid seeds 1000 and
1001 (the Transformer at 0.125; DIFF V1 at 0.05, 0.1, 0.2) hold exactly the setting a grid point
here trains with, and are taken (copied under this study's names; a record is taken only for the
very setting). Nothing else is reused.

Cost, estimated before any run from the tuned study's 4-layer medians (grid 14.7 min, compared
12.0 min, one child a core on 2 cores): 6 candidates x 4 lrs x 4 grid seeds = 96 grid runs, 16
of them reused, ~8 more where grids grow: ~88 to train; 32 compared runs. 88 x 14.7 + 32 x 12 =
1680 minutes, about 28 hours of one core, 14 hours with two children, run in parts.
"""
from configs.studies import lm
from diff_transformer.study import Cell, Study, Tuned

SCALE = "model.norm_out_scale"
FOUR_LAYERS = (("model.num_layers", 4),)

STUDY = Study(
    name="lm_confirm4",
    make=lm.make,
    seeds=tuple(range(10, 26)),
    variants=("transformer@L4@tuned", "diff@L4@tuned"),
    derived=(
        Cell("transformer@L4", "transformer", FOUR_LAYERS),
        Cell("diff@L4", "diff", FOUR_LAYERS),
    ),
    tuned=(
        Tuned("transformer@L4@tuned", "transformer@L4", SCALE, ("0.0625", "0.125", "0.25")),
        Tuned("diff@L4@tuned", "diff@L4", SCALE, ("0.05", "0.1", "0.2")),
    ),
    comparisons=(("diff@L4@tuned", "transformer@L4@tuned"),),
    primary="loss",
    grid_by_primary=True,
    reuse_from=("docs/results/study_lm_tuned",),
    **{**lm.SETTING_OPTIONS, "lr_grid": (5.29e-4, 7.93e-4, 1.19e-3, 1.78e-3),
       "quick_lr_grid": (1.19e-3,)},
    lr_grid_seeds=(1000, 1001, 1002, 1003),
    scope=("0.9M-parameter models on 4.1M bytes, where the context-free 4-gram model scores "
           "1.549 nats/byte; the DIFF paper trains 830M-13B-parameter models and tunes neither "
           "multiplier. This study can say whether, at 4 layers and this scale, DIFF V1 is ahead "
           "of the Transformer once both are tuned on output scale and lr, not whether the "
           "paper's sizes behave alike."),
    description=(
        "A confirmatory study at 4 layers of the LM study's setting (bytes, D=128, 1000 steps = "
        "4.1M tokens). One pre-named pair: DIFF V1 - the Transformer, each at its best (output "
        "scale, lr) on 4 grid seeds, judged by the primary on the whole validation split: the "
        "Transformer over scales 0.0625, 0.125, 0.25, DIFF V1 over 0.05, 0.1, 0.2 (x2 growth at "
        "a winning end), lr 5.29e-4 to 1.78e-3 (x1.5, grown at a winning end). Primary: "
        "whole-split validation loss, 16 compared seeds (10-25), none a grid seed or a tuned "
        "study seed."),
)
get_config = STUDY.get_config
