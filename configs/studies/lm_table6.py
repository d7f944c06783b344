"""The DIFF paper's Table 6 (ablations at 1.4B parameters) at the LM study's scale: is DIFF V1's
deficit on bytes differential attention, or its halved head count?

    python study.py --study=configs/studies/lm_table6.py

The setting is the LM study's (configs/studies/lm.py: bytes, D=128, 2 layers, 1000 steps), 10
seeds. At head width 32 the Transformer has 4 heads and DIFF V1 2 differential heads (values 64
wide), so "DIFF against the Transformer" also halves the head count. Cells (name: what changes):

- transformer: 4 heads of 32 (the LM study's; seeds 0-7 and its lr grid are its records);
- diff: 2 differential heads of 32, values 64 wide (likewise);
- transformer@2x64: 2 heads of 64, DIFF's head count and value width (its own lr grid);
- transformer@2x64norm: the same with a per-head RMSNorm on each head's output (model.head_norm,
  the Transformer's analog of DIFF's sub-layer norm), at transformer@2x64's lr;
- diff@nosubln: DIFF without its sub-layer norm (model.subln=False: neither the per-head RMSNorm
  nor the (1 - lambda_init) scale), at diff's lr;
- diff@lambda0.8, diff@lambda0.5: lambda_init fixed at 0.8 / 0.5 in every layer instead of
  0.8 - 0.6 exp(-0.3 l), at diff's lr.

The ablations train at their parent's lr, as the paper's do. Parameters (`train.py --dry_run`
per point): 508,544 for transformer and transformer@2x64, 508,672 with the per-head norm's gains,
508,928 for diff and its lambda cells (lambda vectors and sub-layer norm gains), 508,800 for
diff@nosubln: within 0.08% of each other. The primary family is the six pre-named pairs below, Holm
over 6; 10 seeds can resolve it (smallest Holm p 6 x 2/1024 = 0.012). Each pair is a - b in
whole-split validation loss (nats per byte).

6 grid runs and 54 compared runs are new (the transformer and diff records of seeds 0-7 and
their grid are the LM study's, reused where the setting matches). With two children on 2 Intel
Xeon cores a run took a median 12.6 minutes (the records' train_seconds), so about 6 h in all,
run in parts; results: docs/results/study_lm_table6/.
"""
from configs.studies import lm
from diff_transformer.study import Cell, Study

TWO_BY_64 = (("model.num_heads", 2), ("model.head_dim", 64))

STUDY = Study(
    name="lm_table6",
    make=lm.make,
    seeds=tuple(range(10)),
    variants=("transformer", "diff", "transformer@2x64", "transformer@2x64norm", "diff@nosubln",
              "diff@lambda0.8", "diff@lambda0.5"),
    derived=(
        Cell("transformer@2x64", "transformer", TWO_BY_64, own_lr=True),
        Cell("transformer@2x64norm", "transformer@2x64", (("model.head_norm", True),)),
        Cell("diff@nosubln", "diff", (("model.subln", False),)),
        Cell("diff@lambda0.8", "diff", (("model.lambda_init", 0.8),)),
        Cell("diff@lambda0.5", "diff", (("model.lambda_init", 0.5),)),
    ),
    comparisons=(
        ("transformer@2x64", "transformer"),  # (1) 2 heads of 64 against 4 of 32
        ("transformer@2x64norm", "transformer@2x64"),  # (2) a per-head norm, no differential
        ("diff", "transformer@2x64"),  # (3) differential attention at equal heads and width
        ("diff@nosubln", "diff"),  # (4) DIFF without its sub-layer norm
        ("diff@lambda0.8", "diff"),  # (5) lambda_init 0.8 everywhere
        ("diff@lambda0.5", "diff"),  # (6) lambda_init 0.5 everywhere
    ),
    # Table 6's rows (published_cells, below) and each pair's a - b from them:
    published=(("transformer@2x64", "transformer", round(3.088 - 3.087, 3)),
               ("transformer@2x64norm", "transformer@2x64", round(3.086 - 3.088, 3)),
               ("diff", "transformer@2x64", round(3.062 - 3.088, 3)),
               ("diff@nosubln", "diff", round(3.122 - 3.062, 3)),
               ("diff@lambda0.8", "diff", round(3.065 - 3.062, 3)),
               ("diff@lambda0.5", "diff", round(3.066 - 3.062, 3))),
    published_cells=(("transformer", 3.087), ("transformer@2x64", 3.088),
                     ("transformer@2x64norm", 3.086), ("diff", 3.062), ("diff@nosubln", 3.122),
                     ("diff@lambda0.8", 3.065), ("diff@lambda0.5", 3.066)),
    # Table 6's rows are single runs without error bars: a difference of 0.005 or less (four of
    # the six, 0.001-0.004) is read as within their noise and given no sign.
    published_noise=0.005,
    published_source=("the DIFF paper's Table 6: 1.4B-parameter models after 10B tokens, one "
                      "validation loss per row, in nats per BPE token (ours: nats per byte); "
                      "its rows 16x128 / 8x256 / 8x256 + GroupNorm / DIFF 8 heads / DIFF "
                      "without GroupNorm / lambda_init 0.8 / 0.5 are 3.087 / 3.088 / 3.086 / "
                      "3.062 / 3.122 / 3.065 / 3.066"),
    primary="loss",
    **lm.SETTING_OPTIONS,
    scope=("Table 6 compares 1.4B-parameter models after 10B tokens, in nats per BPE token; "
           "this study trains 0.5M-parameter models on 4.1M bytes, in nats per byte, so it can "
           "say which of its own differences agree in sign with the paper's, not whether the "
           "paper's sizes hold."),
    description=(
        "The LM study's setting (bytes, D=128, 2 layers, 1000 steps = 4.1M tokens) with Table "
        "6's cells: the Transformer at 4 heads of 32 and at 2 heads of 64 (DIFF V1's head count "
        "and value width), the latter with a per-head RMSNorm; DIFF V1, without its sub-layer "
        "norm, and with lambda_init fixed at 0.8 or 0.5. transformer, diff and transformer@2x64 "
        "train at their own grid's lr (ratio 1.5, by the training-time evaluation loss on 2 "
        "grid seeds); the ablations at their parent's. Primary: validation loss on the whole "
        "validation split, six pre-named pairs, Holm over 6."),
)
get_config = STUDY.get_config
