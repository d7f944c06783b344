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
