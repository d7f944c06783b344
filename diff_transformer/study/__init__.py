"""Variant studies: every variant x several seeds on one task, evaluated, with honest statistics
(mean, std, paired differences against the Transformer with 95% t intervals). `study.py` runs one."""
from diff_transformer.study.definition import Study
from diff_transformer.study.stats import paired, summarize

__all__ = ["Study", "paired", "summarize"]
