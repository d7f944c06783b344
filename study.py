"""Variant studies: every variant x several seeds on a synthetic task, evaluated, with statistics.

    python study.py --study=configs/studies/retrieval.py --root=runs/studies/retrieval
    python study.py --study=configs/studies/retrieval.py --root=runs/studies/quick --quick

Writes <root>/study.json (runs, per-variant mean/std/n, paired differences vs the Transformer
with 95% t intervals), <root>/report.md and plots. Finished runs are skipped and interrupted
ones resume, so rerunning the same command continues a study.
"""
from __future__ import annotations

import shlex
import time
from pathlib import Path

from diff_transformer import cli

cli.default_platform()

from absl import flags, logging  # noqa: E402

from diff_transformer.study import report, runner  # noqa: E402

flags.DEFINE_string("study", "configs/studies/retrieval.py", "Study file (defines STUDY).")
flags.DEFINE_string("root", "", "Directory of the study's runs (default runs/studies/<name>).")
flags.DEFINE_bool("quick", False, "The study's quick form: fewer seeds and steps (minutes).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.perf_counter()
  study = cli.load_definition(FLAGS.study, "study", "STUDY").validate()  # the whole file, also when running --quick
  if FLAGS.quick:
    study = study.quick().validate()
  root = Path(FLAGS.root or Path("runs") / "studies" / study.name)
  status = runner.run(study, FLAGS.study, root)
  runs = runner.collect(study, root)
  command = shlex.join(["python", "study.py", f"--study={FLAGS.study}", f"--root={root}"] +
                       (["--quick"] if FLAGS.quick else []))
  result = report.build(study, runs, time.perf_counter() - start, command)
  path = report.write(result, root)
  ran = sum(s.startswith("ran") for s in status.values())
  print(f"{len(runs)} runs ({ran} trained now); report: {path}")


if __name__ == "__main__":
  cli.run(main)
