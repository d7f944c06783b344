"""What makes DIFF V1 lose on bytes: a pre-registered 2 x 2 factorial on the multiplier after its
sub-layer norm (the output scale) and on lambda_init, every cell at its own lr.

    python study.py --study=configs/studies/lm_scale.py --results=docs/results/study_lm_scale

The setting is the LM study's (configs/studies/lm.py: bytes, D=128, 2 layers, 1000 steps), 10
seeds. The Table 6 study (configs/studies/lm_table6.py) found DIFF V1 gaining 0.09-0.10 nats/byte
without its sub-layer norm or with lambda_init 0.8, and both change the multiplier after the norm
(model.norm_out_scale): by the rule it is 1 - lambda_init, 0.8 and 0.64 in the two layers, while
lambda_init 0.8 makes it 0.2. Here scale and lambda are crossed. Cells (name: scale, lambda_init):

- diff: the rule (1 - lambda_init, 0.8 / 0.64), the rule (0.2 / 0.36);
- diff@scale0.2: 0.2 in both layers, the rule;
- diff@lambda0.8: 0.2 (= 1 - 0.8, by the rule), 0.8 in both layers;
- diff@lambda0.8scalerule: the default model's 0.8 / 0.64 (model.norm_out_scale=layer_rule),
  0.8 in both layers;
- transformer@2x64: 2 heads of 64 (DIFF V1's head count and value width);
- transformer@2x64norm: the same with a per-head RMSNorm (model.head_norm; multiplier 1);
- transformer@2x64norm@scale0.2: that norm times 0.2.

Every cell has its own lr grid (2.67e-3, 4e-3, 6e-3, ratio 1.5, 2 grid seeds, grown at an end),
judged by the primary: each grid run is evaluated on the whole validation split as a compared
run is (grid_by_primary). The primary family is the six pre-named pairs below, Holm over 6 (10
seeds: smallest Holm p 6 x 2/1024 = 0.012), each a - b in whole-split validation loss (nats per
byte). Compared records of the Table 6 study (diff, diff@lambda0.8, transformer@2x64,
transformer@2x64norm) are reused where this study's grid picks the lr they trained at; the rest
retrain. About 30-45 grid runs and 40-70 compared runs at a median 12.6 minutes each with two
children on 2 Intel Xeon cores: 8-10 hours, run in parts (a study resumes from its records).
"""
from configs.studies import lm
from configs.studies.lm_table6 import TWO_BY_64
from diff_transformer.study import Cell, Study

STUDY = Study(
    name="lm_scale",
    make=lm.make,
    seeds=tuple(range(10)),
    variants=("diff", "diff@scale0.2", "diff@lambda0.8", "diff@lambda0.8scalerule",
              "transformer@2x64", "transformer@2x64norm", "transformer@2x64norm@scale0.2"),
    derived=(
        Cell("diff@scale0.2", "diff", (("model.norm_out_scale", "0.2"),), own_lr=True),
        Cell("diff@lambda0.8", "diff", (("model.lambda_init", 0.8),), own_lr=True),
        Cell("diff@lambda0.8scalerule", "diff@lambda0.8",
             (("model.norm_out_scale", "layer_rule"),), own_lr=True),
        Cell("transformer@2x64", "transformer", TWO_BY_64, own_lr=True),
        Cell("transformer@2x64norm", "transformer@2x64", (("model.head_norm", True),),
             own_lr=True),
        Cell("transformer@2x64norm@scale0.2", "transformer@2x64norm",
             (("model.norm_out_scale", "0.2"),), own_lr=True),
    ),
    comparisons=(
        ("diff@scale0.2", "diff"),  # (1) the scale, at the rule's lambda
        ("diff@lambda0.8", "diff@lambda0.8scalerule"),  # (2) the scale, at lambda_init 0.8
        ("diff@lambda0.8scalerule", "diff"),  # (3) lambda, at the rule's scale
        ("diff@lambda0.8", "diff@scale0.2"),  # (4) lambda, at scale 0.2
        ("transformer@2x64norm@scale0.2", "transformer@2x64norm"),  # (5) the scale, Transformer
        ("diff@scale0.2", "transformer@2x64"),  # (6) differential attention, scale fixed
    ),
    # The 2 x 2 on DIFF V1: its factors, and its cells in the order (neither, the first only,
    # the second only, both).
    factorial=(("output scale 0.2", "lambda_init 0.8"),
               ("diff", "diff@scale0.2", "diff@lambda0.8scalerule", "diff@lambda0.8")),
    primary="loss",
    grid_by_primary=True,
    **lm.SETTING_OPTIONS,
    scope=("the DIFF paper's Table 6 compares 1.4B-parameter models after 10B tokens; this study "
           "trains 0.5M-parameter models on 4.1M bytes, where no run of the Table 6 study or "
           "of this one beats the context-free 4-gram model (1.549 nats/byte; 2 of the LM "
           "study's 32 runs do, both DIFF V2). It can say what moves DIFF V1's "
           "loss at this scale, not whether the paper's sizes behave alike."),
    description=(
        "The LM study's setting (bytes, D=128, 2 layers, 1000 steps = 4.1M tokens). A 2 x 2 on "
        "DIFF V1: the multiplier after the sub-layer norm (the rule's 1 - lambda_init, or 0.2 "
        "in every layer) crossed with lambda_init (the layer rule, or 0.8 in every layer); the "
        "Transformer at 2 heads of 64, with a per-head RMSNorm, and with that norm times 0.2. "
        "Every cell at its own grid's lr (ratio 1.5, 2 grid seeds), judged by the primary on "
        "the whole validation split. Primary: whole-split validation loss, six pre-named "
        "pairs, Holm over 6."),
)
get_config = STUDY.get_config
