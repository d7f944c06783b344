"""Export a run as a Hugging Face model folder:
`python export.py --workdir RUN [--step N] --out DIR`.

transformer -> LlamaForCausalLM, diff / shared_diff -> DiffLlamaForCausalLM (stock classes, no
custom code), diff_v2 -> a bundled modelling file (trust_remote_code=True). Needs the hf extra
(pip install -e ".[hf]"). See docs/interop.md.
"""
from __future__ import annotations

import json

from diff_transformer import cli, paths

cli.default_platform()

from absl import flags  # noqa: E402

from diff_transformer.interop.export import export_run  # noqa: E402

flags.DEFINE_string("workdir", None, "Training run directory (config.json + checkpoints/).")
flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest readable).")
flags.DEFINE_string("out", None, "Output folder (created; must not hold files).")
flags.mark_flags_as_required(["workdir", "out"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from absl import logging
  logging.set_verbosity(logging.ERROR)  # orbax warns about read-only restores
  paths.creatable(FLAGS.out, "--out")
  summary = export_run(FLAGS.workdir, FLAGS.out, FLAGS.step)
  print(f"Exported {summary['variant']} step {summary['step']} as {summary['architecture']} "
        f"to {FLAGS.out}")
  print(json.dumps(dict(step=summary["step"], architecture=summary["architecture"])))


if __name__ == "__main__":
  cli.run(main)
