"""Variant studies: every variant x several seeds (x sizes) of one setting, trained at each
variant's own best grid learning rate, evaluated, with statistics that survive a careful reader.

    python study.py --study=configs/studies/retrieval.py
    python study.py --study=configs/studies/lm.py
    python study.py --study=configs/studies/retrieval.py --quick \\
        --set data.task.num_keys=5 --variants=transformer,diff --seeds=0,1 --name=keys5

Writes <root>/study.json (runs; floors per slice; per-variant summaries with n and censoring;
the primary comparison and Holm-corrected secondary ones, each with an exact sign-flip p; the
lr grid), <root>/report.md and plots. Finished runs are skipped and interrupted ones resume,
so rerunning the same command continues a study. A run that fails is reported by name with its
log; the others go on, and the study then exits with status 1.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from diff_transformer import cli

cli.default_platform()

from absl import flags, logging  # noqa: E402

from diff_transformer.study import markdown, report, runner  # noqa: E402
from diff_transformer.sweeps import runner as sweep_runner  # noqa: E402

flags.DEFINE_string("study", "configs/studies/retrieval.py", "Study file (defines STUDY).")
flags.DEFINE_string("root", "", "Directory of the study's runs (default runs/studies/<name>).")
flags.DEFINE_bool("quick", False, "The study's quick form: fewer seeds and steps (minutes).")
flags.DEFINE_multi_string("set", [], "key=value config override for every run (repeatable), "
                          "e.g. --set data.task.num_keys=5.")
flags.DEFINE_string("variants", "", "Comma-separated variants (default: the study's).")
flags.DEFINE_string("seeds", "", "Comma-separated seeds (default: the study's).")
flags.DEFINE_string("name", "", "The study's name (default: the study file's; names the root).")
FLAGS = flags.FLAGS


def command() -> str:
  args = [f"--study={FLAGS.study}"] + (["--quick"] if FLAGS.quick else [])
  args += [f"--set={s}" for s in FLAGS.set]
  args += [f"--{k}={getattr(FLAGS, k)}" for k in ("variants", "seeds", "name", "root")
           if getattr(FLAGS, k)]
  return shlex.join(["python", "study.py"] + args)


def main(argv):
  del argv
  sweep_runner.stop_on_sigterm()
  logging.set_verbosity(logging.WARNING)
  start = time.perf_counter()
  study = cli.load_definition(FLAGS.study, "study", "STUDY").validate()  # the whole file, also when running --quick
  if FLAGS.quick:
    study = study.quick()
  study = study.with_options(sets=tuple(FLAGS.set), variants=FLAGS.variants, seeds=FLAGS.seeds,
                             name=FLAGS.name).validate()
  root = Path(FLAGS.root or Path("runs") / "studies" / study.name)
  status, grid = runner.run(study, FLAGS.study, root)
  runs = runner.collect(study, root)
  missing = [p for p in study.points() if p not in {r["point"] for r in runs}]
  ran = sum(s.startswith("ran") for s in status.values())
  invocations = report.record_invocation(root, command(), time.perf_counter() - start, ran)
  result = report.build(study, runs, grid, missing, invocations)
  report.write_json(result, root)
  path = markdown.write(result, root)
  print(f"{len(runs)} runs ({ran} trained now); report: {path}")
  failed = {p: s for p, s in status.items() if s.startswith(("failed", "not run"))}
  for point, why in failed.items():
    print(f"{point}: {why}", file=sys.stderr)
  if failed:
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
