"""Train a model: `python train.py --config=configs/default.py --workdir=runs/default`.

`--dry_run` builds the model abstractly and prints its parameter table; the last line is JSON.
"""
from __future__ import annotations

import json

from diff_transformer import cli

cli.default_platform()

from absl import app, flags  # noqa: E402

from diff_transformer import params  # noqa: E402
from diff_transformer.model.spec import ModelSpec  # noqa: E402

cli.define_config()
flags.DEFINE_string("workdir", "runs/default", "Run directory: checkpoints, logs, config.")
flags.DEFINE_bool("dry_run", False, "Build the model abstractly, print parameter counts, exit.")
FLAGS = flags.FLAGS


def dry_run(config) -> dict:
  spec = ModelSpec.from_config(config.model)
  counts = params.count(spec)
  print(f"# {config.model.variant}: {config.source}")
  print(params.format_table(counts, spec.num_layers))
  summary = {k: counts[k] for k in ("params", "non_embedding_params", "paper_params")}
  summary["variant"] = spec.variant
  print(json.dumps(summary))
  return summary


def main(argv):
  del argv
  config = cli.load_config()
  if FLAGS.dry_run:
    dry_run(config)
    return
  raise SystemExit("training lands with the training issue; use --dry_run")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
