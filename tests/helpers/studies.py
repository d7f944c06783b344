"""A tiny study file (synthetic MQAR, a few steps) the study and driver-fault tests write out."""

TINY_STUDY = """
from configs import synthetic
from diff_transformer.study import Study

def make(variant):
  c = synthetic.get_config(f"{variant}-mqar_plain")
  c.train.steps = c.train.checkpoint_every = 6
  c.train.eval_every, c.train.eval_batches, c.train.global_batch_size = 3, 1, 8
  return c

STUDY = Study(name="tiny", make=make, seeds=(0, 1, 2), variants=("transformer", "diff_v2"),
              exploratory=True, eval_rows=16, attention_rows=2, quick_seeds=(0, 1),
              quick_lr_grid=(1e-3, 3e-3),
              quick_overrides=(("train.steps", 4), ("train.checkpoint_every", 4)))
get_config = STUDY.get_config
"""

# The same with derived cells (an ablation at its parent's lr, a cell with its own grid) and a
# primary family of pre-named pairs, one with a published figure. One variant: the study's
# variants themselves are the quick study's (tests/test_study.py).
CELLS_STUDY = TINY_STUDY.replace("from diff_transformer.study import Study",
                                 "from diff_transformer.study import Cell, Study").replace(
    'variants=("transformer", "diff_v2"),',
    '''variants=("transformer", "transformer@wd0", "transformer@warm1"),
              derived=(Cell("transformer@wd0", "transformer", (("train.weight_decay", 0.0),)),
                       Cell("transformer@warm1", "transformer@wd0",
                            (("train.warmup_steps", 1),), own_lr=True)),
              comparisons=(("transformer@wd0", "transformer"),
                           ("transformer@warm1", "transformer@wd0")),
              published=(("transformer@wd0", "transformer", -0.5),),
              published_source="a test figure",
              published_cells=(("transformer@wd0", 7.25),),''').replace(
    "quick_lr_grid=(1e-3, 3e-3)", 'quick_lr_grid=(1e-3,), primary="final_loss"').replace(
    "quick_seeds=(0, 1)", "quick_seeds=(0,)")  # 5 tiny runs: 2 grid cells, 3 compared
