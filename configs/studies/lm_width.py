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
  64), which separates "differential" from "half the heads" at every width.

Primary, named before any run, for DIFF V1 and for DIFF V2: the per-seed gap to the Transformer
in whole-split validation loss at D=512 minus the gap at D=128 (`loss@512-128`: negative when
the variant gains on the Transformer with width), 8 seeds, Holm over the two. The D=128 cells
repeat the committed CPU LM study's setting and seeds, so the two can be set side by side.

Not yet run: it is sized for a GPU, where `--population` trains each cell's seeds in one
program (8 seeds x 4 cells x 3 widths = 96 compared runs plus the grids).
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
    variants=("transformer", "diff", "diff_v2", "transformer@v1heads"),
    derived=(Cell("transformer@v1heads", "transformer", V1_HEADS, own_lr=True),),
    comparisons=(("diff", "transformer"), ("diff_v2", "transformer")),
    size_contrasts=(("512", "128"),),
    primary="loss@512-128",
    **lm.SETTING_OPTIONS,
    scope=("the papers compare 830M-13B-parameter models on billions of tokens; this study "
           "trains 0.5-6M-parameter models on 4.1M bytes, so it can say whether the variants' "
           "gaps move with width at this data size, not what they are at the papers' sizes."),
    description=(
        "The LM study's setting (bytes, 2 layers, head width 32, 1000 steps = 4.1M bytes) at "
        "D = 128, 256, 512: Transformer, DIFF V1, DIFF V2 and the Transformer at DIFF V1's head "
        "count, parameter-matched at each width, each at its own grid lr per width. Primary: "
        "the gap to the Transformer at D=512 minus the gap at D=128, per seed, for DIFF V1 and "
        "DIFF V2 (Holm over 2)."),
)
get_config = STUDY.get_config
