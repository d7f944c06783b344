"""Variant studies: variants x seeds (x sizes) of one setting, each at its own best grid lr,
evaluated, with statistics a careful reader can check (floors, censoring, exact paired tests,
Holm's correction). `study.py` runs one."""
from diff_transformer.study.definition import PAPER_VARIANTS, Cell, Study, Tuned
from diff_transformer.study.overrides import BySize
from diff_transformer.stats import holm, paired, sign_flip_p, summarize

__all__ = ["PAPER_VARIANTS", "BySize", "Cell", "Study", "Tuned", "holm", "paired", "sign_flip_p",
           "summarize"]
