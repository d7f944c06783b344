"""The LM study's width axis: does DIFF V1's deficit on bytes (and DIFF V2's advantage) change
from D=128 to D=512, at a fixed amount of data?

    python study.py --study=configs/studies/lm_width.py --population=8    # on a GPU

The setting is the LM study's (configs/studies/lm.py: bytes, 2 layers, head width 32, 1000
steps of 16 x 256 bytes = 4.1M bytes, under one pass) at D = 128, 256 and 512. Cells, each
parameter-matched to the Transformer at its width and each with its own lr grid at every width
(the LM study's grid, grown until bracketed, on the grid seeds):

- transformer: D/32 heads of 32;
- diff: D/64 differential heads of 32 (values 64 wide);
- diff_v2: D/32 query-head pairs;
- transformer@v1heads: the Transformer with DIFF V1's head count and value width (D/64 heads of
  64), which separates "differential" from "half the heads" at every width;
- diff@nosubln: DIFF V1 without its sub-layer norm (model.subln=False: neither the per-head
  RMSNorm nor its (1 - lambda_init) scale). At D=128 the Table 6 study found them costing DIFF
  0.091 nats/byte, where the paper finds them helping at 1.4B; the width axis is where the two
  can meet.
- diff@scale0.2: DIFF V1 with the branch's multiplier before W_O fixed at 0.2 in every layer
  (model.norm_out_scale=0.2) in place of the rule's 1 - lambda_init. At D=128 the output-scale
  study (configs/studies/lm_scale.py) found 0.2 gaining 0.101 nats/byte on 10/10 seeds, which
  left DIFF V1 level with the parameter-matched Transformer; the paper finds the rule fine at
  830M-13B. 0.2 is that study's value, and also the value the tuned study
  (configs/studies/lm_tuned.py) chose for DIFF V1 on its grid seeds at D=128 and 2 layers, this
  study's setting (0.1 and 0.2 within 0.001 there; at 4 layers it chose 0.1).

Primary, named before any run, four pairs: DIFF V1, DIFF V2 and DIFF V1 at scale 0.2 against the
Transformer, and DIFF without its norm against DIFF; each the per-seed gap in whole-split validation
loss at D=512 minus the gap at D=128 (`loss@512-128`: negative when a gains on b with width), 8
seeds, Holm over the four (smallest Holm p 4 x 2/256 = 0.031). Each grid is judged by that same
whole-split loss (grid_by_primary). The D=128 cells repeat the committed CPU LM study's setting and
seeds, so the two can be set side by side.

Not yet run: it is sized for a GPU, where `--population` trains each cell's seeds in one
program: 8 seeds x 6 cells x 3 widths = 144 compared runs plus 108 grid runs (3 lrs x 2 grid
seeds per cell and width, more where a grid grows), 252 in all. No GPU has timed a run of it
yet; the scale cell adds 42 runs to the 210 before it (1.2x), so whatever the first
deadline-bounded commands measure per run, the study takes 1.2x the commands it would have.
"""
from configs.studies import lm
from diff_transformer.study import BySize, Cell, Study

SIZES = ("128", "256", "512")
V1_HEADS = (("model.num_heads", BySize(tuple((z, int(z) // 64) for z in SIZES))),
            ("model.head_dim", 64))


def make(variant: str, size: str):
  return lm.make(variant, d_model=int(size))


STUDY = Study(
    name="lm_width",
    make=make,
    sizes=SIZES,
    seeds=tuple(range(8)),
    variants=("transformer", "diff", "diff_v2", "transformer@v1heads", "diff@nosubln",
              "diff@scale0.2"),
    derived=(Cell("transformer@v1heads", "transformer", V1_HEADS, own_lr=True),
             Cell("diff@nosubln", "diff", (("model.subln", False),), own_lr=True),
             Cell("diff@scale0.2", "diff", (("model.norm_out_scale", "0.2"),), own_lr=True)),
    comparisons=(("diff", "transformer"), ("diff_v2", "transformer"), ("diff@nosubln", "diff"),
                 ("diff@scale0.2", "transformer")),
    size_contrasts=(("512", "128"),),
    primary="loss@512-128",
    grid_by_primary=True,
    **lm.SETTING_OPTIONS,
    scope=("the papers compare 830M-13B-parameter models on billions of tokens; this study "
           "trains 0.5-6M-parameter models on 4.1M bytes, so it can say whether the variants' "
           "gaps move with width at this data size, not what they are at the papers' sizes."),
    description=(
        "The LM study's setting (bytes, 2 layers, head width 32, 1000 steps = 4.1M bytes) at "
        "D = 128, 256, 512: Transformer, DIFF V1, DIFF V2 and the Transformer at DIFF V1's head "
        "count, DIFF V1 without its sub-layer norm and DIFF V1 with its output multiplier fixed "
        "at 0.2, parameter-matched at each width, each at its own grid lr per width (judged by "
        "the whole-split loss). Primary: the gap at D=512 minus the gap at D=128, per seed, for "
        "DIFF V1, DIFF V2 and DIFF V1 at scale 0.2 against the Transformer and for DIFF without "
        "its norm against DIFF (Holm over 4)."),
)
get_config = STUDY.get_config
