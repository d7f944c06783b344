"""Variant studies: every variant x several seeds (x sizes) of one setting, trained at each
variant's own best grid learning rate, evaluated, with statistics that survive a careful reader.

    python study.py --study=configs/studies/retrieval.py
    python study.py --study=configs/studies/lm.py
    python study.py --study=configs/studies/retrieval.py --quick \\
        --set data.task.num_keys=5 --variants=transformer,diff --seeds=0,1 --name=keys5

Writes study.json (runs; floors per slice; per-variant summaries with n and censoring; the
design; the primary and pre-named secondary comparisons with exact p and Holm, the rest
descriptive; the lr grid), report.md, plots and one record per run into --results (default: the
root). Points with a record for their setting are skipped and interrupted runs resume, so
rerunning the same command continues a study, also from committed records on another machine.
A run that fails is reported by name with its log; the others go on, and the study then exits
with status 1.
"""
from __future__ import annotations

import contextlib
import shlex
import sys
import time
from pathlib import Path

from diff_transformer import cli, paths

cli.default_platform()

from absl import flags, logging  # noqa: E402

from diff_transformer.errors import ConfigError, Stopped  # noqa: E402
from diff_transformer.study import invocations, records, runner  # noqa: E402
from diff_transformer import launch  # noqa: E402

flags.DEFINE_string("study", "configs/studies/retrieval.py", "Study file (defines STUDY).")
flags.DEFINE_string("root", "", "Directory of the study's runs (default runs/studies/<name>).")
flags.DEFINE_bool("quick", False, "The study's quick form: fewer seeds and steps (minutes).")
flags.DEFINE_multi_string("set", [], "key=value config override for every run (repeatable), "
                          "e.g. --set data.task.num_keys=5.")
flags.DEFINE_string("variants", "", "Comma-separated variants (default: the study's).")
flags.DEFINE_string("seeds", "", "Comma-separated seeds (default: the study's).")
flags.DEFINE_string("name", "", "The study's name (default: the study file's; names the root).")
flags.DEFINE_string("results", "", "Directory of study.json, report.md, plots and the run "
                    "records (default: the root). Records there let a study continue elsewhere.")
flags.DEFINE_integer("jobs", 2, "Training children at once, each on its own CPU core (1: one "
                     "child on every core; benchmarks/study_children.py measured 2 faster on 2 "
                     "cores for the studies' tiny models).")
flags.DEFINE_string("population", "auto", "Members per training program: N trains a cell's "
                    "seeds (a grid cell's lrs on one grid seed) in programs of up to N members "
                    "(train.py --population); 1: one train.py per run; auto: "
                    "study/runner.py AUTO_POPULATION, by platform.")
flags.DEFINE_bool("report_only", False, "Train nothing: write study.json and the report from "
                  "the run records in --results (e.g. committed ones).")
flags.DEFINE_bool("retrain_changed", False, "Train anew the points whose workdir was trained "
                  "under another setting (the old workdir is moved aside, never deleted).")
flags.DEFINE_bool("exploratory", False, "Run a design whose primary family cannot reach p < 0.05 "
                  "(the report says so in its first line).")
FLAGS = flags.FLAGS


def command() -> str:
  """This invocation's command line; an absolute --root / --results is shown as <root> /
  <results> (no machine paths in results that get committed)."""
  args = [f"--study={FLAGS.study}"] + (["--quick"] if FLAGS.quick else [])
  args += [f"--{k}" for k in ("exploratory", "report_only", "retrain_changed")
           if getattr(FLAGS, k)]
  args += [f"--set={s}" for s in FLAGS.set]
  args += [f"--{k}={getattr(FLAGS, k)}" for k in ("variants", "seeds", "name") if getattr(FLAGS, k)]
  args += [f"--population={FLAGS.population}"] if FLAGS.population != "auto" else []
  args += [f"--{k}={v if not Path(v).is_absolute() else f'<{k}>'}"
           for k in ("root", "results") if (v := getattr(FLAGS, k))]
  return shlex.join(["python", "study.py"] + args + [f"--jobs={FLAGS.jobs}"])


def main(argv):
  del argv
  launch.stop_on_sigterm()
  logging.set_verbosity(logging.WARNING)
  start, started = time.perf_counter(), time.time()
  # The whole file's points, also when running --quick; the design of what runs, below.
  study = cli.load_definition(FLAGS.study, "study", "STUDY").validate(design=False)
  if FLAGS.quick:
    study = study.quick()
  study = study.with_options(sets=tuple(FLAGS.set), variants=FLAGS.variants, seeds=FLAGS.seeds,
                             name=FLAGS.name, exploratory=FLAGS.exploratory).validate()
  if FLAGS.jobs < 1:
    raise ConfigError(f"--jobs: must be a positive number of children, got {FLAGS.jobs}")
  population = runner.population_size(FLAGS.population)
  root = paths.output_dir(FLAGS.root or Path("runs") / "studies" / study.name, "--root")
  results = paths.output_dir(FLAGS.results, "--results") if FLAGS.results else root
  with contextlib.ExitStack() as held:  # one driver per root (and per results directory)
    held_flags = {root: "--root"} | ({results: "--results"} if results != root else {})
    for folder, flag in held_flags.items():
      held.enter_context(launch.holding(folder, "study.py", flag))
    try:
      status, grid = runner.run(study, FLAGS.study, root, results, jobs=FLAGS.jobs,
                                train=not FLAGS.report_only, retrain=FLAGS.retrain_changed,
                                population=population)
    except Stopped:  # a part of a study run in parts: its time and runs are counted too
      if not FLAGS.report_only:
        invocations.record_invocation(results, command(), time.perf_counter() - start,
                                      records.trained_since(results, started), "SIGTERM")
      raise
    ran = sum(s.startswith("ran") for s in status.values())
    origin = invocations.provenance(results, command(), time.perf_counter() - start, ran,
                                    rebuild=FLAGS.report_only)
    study, runs, path = runner.write_results(study, results, grid, origin)
  print(f"{len(runs)} runs ({ran} trained now); report: {path}")
  if FLAGS.report_only:
    recorded = records.pool([results], grid=False) + records.pool([results], grid=True)
    print(runner.left_to_train(study, status, recorded, FLAGS.jobs))
  failed = {p: s for p, s in status.items()
            if s.startswith(("failed", "not run")) and not FLAGS.report_only}
  for point, why in failed.items():
    print(f"{point}: {why}", file=sys.stderr)
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
