"""Train a model: `python train.py --config=configs/default.py --workdir=runs/default`.

Resumes automatically from the newest checkpoint in --workdir; SIGTERM/SIGINT save and exit.
Multi-host: TPU pods and SLURM are detected; elsewhere pass --coordinator_address,
--num_processes and --process_id to every process (docs/training.md).
`--dry_run` builds the model abstractly and prints its parameter table; the last line is JSON.
`--population=FILE` trains the members a members file lists (each one train.py command line, as
study.py --population writes them) as one program on one device (docs/training.md).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from diff_transformer import cli

cli.default_platform()

from absl import flags, logging  # noqa: E402

from diff_transformer import params  # noqa: E402
from diff_transformer.children import die_with_driver  # noqa: E402
from diff_transformer.errors import ConfigError, TrainError  # noqa: E402
from diff_transformer.files import read_json  # noqa: E402
from diff_transformer.mesh import request_determinism  # noqa: E402
from diff_transformer.paths import output_dir  # noqa: E402
from diff_transformer.model.attention import spec_from_config  # noqa: E402

cli.define_config()
flags.DEFINE_string("workdir", "runs/default", "Run directory: checkpoints, logs, config.")
flags.DEFINE_bool("dry_run", False, "Build the model abstractly, print parameter counts, exit.")
flags.DEFINE_string("coordinator_address", "", "host:port of process 0 (multi-process runs "
                    "outside TPU pods / SLURM).")
flags.DEFINE_integer("num_processes", 0, "Number of processes (with --coordinator_address).")
flags.DEFINE_integer("process_id", -1, "This process's index (with --coordinator_address).")
flags.DEFINE_string("population", "", "A members file (JSON: name, members[].args, each "
                    "member's train.py arguments): train them as one program on one device.")
FLAGS = flags.FLAGS


def dry_run(config) -> dict:
  spec = spec_from_config(config.model)
  counts = params.count(spec)
  print(f"# {config.model.variant}: {config.source}")
  print(params.format_table(counts, spec.num_layers))
  summary = {k: counts[k] for k in ("params", "non_embedding_params", "paper_params")}
  summary["variant"] = spec.variant
  print(json.dumps(summary))
  return summary


def population(path: str) -> None:
  """The members of a members file trained as one program; exit status 1 names the members
  that failed (each one's log says why), the others are finished runs."""
  listing = read_json(Path(path), ConfigError, "members file")
  members = [cli.config_from_args(m["args"]) for m in listing["members"]]
  request_determinism(any(c.train.deterministic for c, _ in members))
  from diff_transformer.data import ensure_prepared  # grain loads only to train
  for config, _ in members:
    ensure_prepared(config.data)
  # orbax, grain and the trainer load only to train (as in main)
  from diff_transformer.training.population_loop import train_population
  summaries = train_population([c for c, _ in members], [w for _, w in members],
                               name=listing.get("name", Path(path).stem))
  failed = [Path(w).name for (_, w), s in zip(members, summaries) if s.get("failed")]
  stopped = next((s["stopped_by"] for s in summaries if s.get("stopped_by")), None)
  if stopped:
    print(f"Stopped by {stopped}; run the same command to resume.", flush=True)
  if failed:
    cli.exit_with(f"error: population: members {', '.join(failed)} failed; each one's log "
                  "says why", 1)


def main(argv):
  del argv
  die_with_driver()  # a study's or sweep's child stops (and saves) when its driver dies
  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  if FLAGS.population:
    population(FLAGS.population)
    return
  config = cli.load_config()
  if FLAGS.dry_run:
    dry_run(config)
    return
  request_determinism(config.train.deterministic)
  # orbax, grain and the trainer load only to train (a --dry_run counts without them)
  from diff_transformer.training import initialize_distributed, train
  from diff_transformer.data import ensure_prepared  # grain, as above
  initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  output_dir(FLAGS.workdir, "--workdir", TrainError)  # before preparing any data
  ensure_prepared(config.data)  # the built-in corpus on first use; training only opens it
  start_params = None
  if config.init_from_hf:
    # the hf extra loads only to convert a folder; training itself never imports interop
    from diff_transformer.interop import hf_import
    start_params = functools.partial(hf_import.import_params, folder=config.init_from_hf)
  summary = train(config, FLAGS.workdir, start_params=start_params)
  if summary.get("imported"):
    print(f"Imported {summary['imported']} as checkpoint step 0 (train.steps=0: no training)")
  if summary.get("stopped_by"):
    print(f"Stopped by {summary['stopped_by']} at step {summary['step']}; run the same command "
          "to resume.", flush=True)


if __name__ == "__main__":
  cli.run(main)
