"""Evaluation suites (definitions in docs/evaluation.md), one module each; `runner.evaluate` runs
them on a checkpoint and `report` writes report.md and the multi-run comparison. See
docs/evaluation.md."""
from diff_transformer.errors import EvalError
from diff_transformer.evaluation.common import Settings
from diff_transformer.evaluation.runner import SUITES, evaluate, parse_suites

__all__ = ["EvalError", "SUITES", "Settings", "evaluate", "parse_suites"]
