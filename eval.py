"""Evaluate a training run: `python eval.py --workdir runs/default --suites loss,needle [--quick]`.

Restores the newest checkpoint (or --step) onto the devices at hand, whatever mesh trained it,
runs the suites and writes each suite's result, plots and report.md into the run folder.
`python eval.py --compare runs/a runs/b ...` puts finished evaluations side by side
(<parent>/compare/compare.md, or --compare_dir). See docs/evaluation.md.
"""
from __future__ import annotations

from diff_transformer import cli, paths

cli.default_platform()


import ml_collections  # noqa: E402
from absl import flags, logging  # noqa: E402

from diff_transformer.evaluation import (SUITES, EvalError, Settings, evaluate,  # noqa: E402
                                         parse_suites, report)
from diff_transformer.mesh import make_mesh  # noqa: E402
from diff_transformer.runs.folder import RunFolder  # noqa: E402

flags.DEFINE_string("workdir", "runs/default", "Training run directory (config + checkpoints).")
flags.DEFINE_string("suites", "all", f"Comma-separated suites: {', '.join(SUITES)} (or all).")
flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest readable one).")
flags.DEFINE_bool("quick", False, "Small suite sizes: all suites in a few CPU minutes.")
flags.DEFINE_string("mesh", "", "data,fsdp,tensor sizes to restore onto (-1 = the rest); "
                    "default one device.")
flags.DEFINE_bool("compare", False, "Compare the evaluated runs given as arguments.")
flags.DEFINE_string("compare_dir", "", "Where --compare writes (default <parent>/compare).")
flags.DEFINE_integer("seed", None, "Seed for needles, demos and sampling.")
flags.DEFINE_integer("batch_size", None, "Rows per forward pass.")
flags.DEFINE_integer("val_batches", None, "Validation batches for loss (0 = all).")
flags.DEFINE_integer("context_len", None, "Context for loss/long_context (<= max_seq_len).")
flags.DEFINE_integer("ar_hit_context", None, "loss: tokens before a target in its AR-hit n-gram "
                     "and the n-gram baseline's context (default 1: the bigram).")
flags.DEFINE_list("needle_lengths", None, "Needle context lengths (default max/2, max).")
flags.DEFINE_list("needle_configs", None, "N x R pairs, e.g. 1x1,2x2,4x2,6x2.")
flags.DEFINE_integer("needle_samples", None, "Samples per (length, depth).")
flags.DEFINE_string("icl_data", None, "JSONL of {text, label} for icl (default built-in).")
flags.DEFINE_string("prompt", None, "Prompt for generate (default held-out openings).")
flags.DEFINE_integer("max_new_tokens", None, "Tokens to generate.")
flags.DEFINE_float("temperature", None, "Sampling temperature for generate.")
flags.DEFINE_integer("top_k", None, "Top-k for sampling (0 = off).")
FLAGS = flags.FLAGS
# Flags passed to Settings under their own names (None keeps the mode's default).
_SETTINGS_FLAGS = ("seed", "batch_size", "val_batches", "context_len", "ar_hit_context",
                   "needle_samples", "icl_data", "prompt", "max_new_tokens", "temperature", "top_k")


def _ints(values, flag: str) -> tuple[int, ...] | None:
  if values is None:
    return None
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    raise EvalError(f"--{flag}: expected integers, got {','.join(values)}") from None


def _pairs(values) -> tuple[tuple[int, int], ...] | None:
  if values is None:
    return None
  try:
    return tuple((int(n), int(r)) for n, r in (v.lower().split("x") for v in values))
  except ValueError:
    raise EvalError(f"--needle_configs: expected NxR pairs like 4x2, got {','.join(values)}"
                    ) from None


def _mesh():
  if not FLAGS.mesh:
    return None
  sizes = _ints(FLAGS.mesh.split(","), "mesh") or ()
  if len(sizes) != 3:
    raise EvalError(f"--mesh: expected data,fsdp,tensor, got {FLAGS.mesh}")
  # A bad mesh is a TrainError: a UserError, printed as one line by cli.run like any other.
  return make_mesh(ml_collections.ConfigDict(dict(zip(("data", "fsdp", "tensor"), sizes))))


def main(argv):
  logging.set_verbosity(logging.WARNING)  # orbax logs every restore detail at INFO
  if FLAGS.compare:
    out = paths.output_dir(FLAGS.compare_dir, "--compare_dir") if FLAGS.compare_dir else None
    path = report.compare(argv[1:], out)
    print(f"Comparison written to {path}")
    return
  if len(argv) > 1:
    raise EvalError(f"unexpected arguments {' '.join(argv[1:])} (runs to compare need "
                    "--compare)")
  suites = parse_suites(FLAGS.suites, task=None)  # which apply: known once it is restored
  settings = Settings.for_mode(
      FLAGS.quick, **{name: FLAGS[name].value for name in _SETTINGS_FLAGS},
      needle_lengths=_ints(FLAGS.needle_lengths, "needle_lengths"),
      needle_configs=_pairs(FLAGS.needle_configs))
  if settings.max_new_tokens <= 0:
    raise EvalError(f"--max_new_tokens: must be a positive number of tokens, got "
                    f"{settings.max_new_tokens}")
  evaluate(FLAGS.workdir, suites, step=FLAGS.step, mesh=_mesh(), settings=settings)
  print(f"Report: {RunFolder(FLAGS.workdir).eval_report}")


if __name__ == "__main__":
  cli.run(main)
