"""Variant studies: every variant x several seeds on a synthetic task, evaluated, with statistics.

    python study.py --study=configs/studies/retrieval.py --root=runs/studies/retrieval
    python study.py --study=configs/studies/retrieval.py --root=runs/studies/quick --quick

Writes <root>/study.json (runs, per-variant mean/std/n, paired differences vs the Transformer
with 95% t intervals), <root>/report.md and plots. Finished runs are skipped and interrupted
ones resume, so rerunning the same command continues a study.
"""
from __future__ import annotations

import importlib.util
import shlex
import time
from pathlib import Path

from diff_transformer import cli

cli.default_platform()

from absl import flags, logging  # noqa: E402

from diff_transformer.config import ConfigError  # noqa: E402
from diff_transformer.study import report, runner  # noqa: E402

flags.DEFINE_string("study", "configs/studies/retrieval.py", "Study file (defines STUDY).")
flags.DEFINE_string("root", "", "Directory of the study's runs (default runs/studies/<name>).")
flags.DEFINE_bool("quick", False, "The study's quick form: fewer seeds and steps (minutes).")
FLAGS = flags.FLAGS


def load_study(path: str):
  """STUDY of a study file, or one line saying what is wrong with the file."""
  file = Path(path)
  if not file.is_file():
    raise ConfigError(f"--study: no such file {path}")
  spec = importlib.util.spec_from_file_location("study_definition", file)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ConfigError(f"--study: {path}:{e.lineno}: syntax error: {e.msg}") from None
  if not hasattr(module, "STUDY"):
    raise ConfigError(f"--study: {path} defines no STUDY")
  return module.STUDY


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  start = time.perf_counter()
  study = load_study(FLAGS.study).validate()  # the whole file, also when running --quick
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
