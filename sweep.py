"""Scaling sweeps: run (or print) every point, skip finished ones, then fit and report.

    python sweep.py --sweep=configs/sweeps/cpu.py --root=runs/sweeps/cpu            # run + report
    python sweep.py --sweep=configs/sweeps/table10.py --root=/ckpt/sweeps --mode=print \
        --launcher="sbatch --nodes=4 --wrap"                                         # cluster
    python sweep.py --sweep=configs/sweeps/cpu.py --root=runs/sweeps/cpu --collect_only
"""
from __future__ import annotations

import contextlib
import json
import os

from diff_transformer import cli, paths

cli.default_platform()

from absl import flags  # noqa: E402

from diff_transformer import launch  # noqa: E402
from diff_transformer.runs.record import setting  # noqa: E402
from diff_transformer.sweeps import report  # noqa: E402
from diff_transformer.sweeps.definition import SweepError  # noqa: E402

flags.DEFINE_string("sweep", "configs/sweeps/cpu.py", "Sweep definition file (defines SWEEP).")
flags.DEFINE_string("root", "",
                    "Directory holding one workdir per point (default runs/sweeps/<name>).")
flags.DEFINE_enum("mode", "local", ["local", "print"],
                  "Run here one after another, or print commands.")
flags.DEFINE_string("launcher", "", "Prefix for printed commands, e.g. 'sbatch --wrap'.")
flags.DEFINE_bool("retrain_changed", False, "Train anew the points whose workdir was trained "
                  "under another setting (the old workdir is moved aside, never deleted).")
flags.DEFINE_bool("collect_only", False, "Only collect finished points, fit and report.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  launch.stop_on_sigterm()
  sweep = cli.load_definition(FLAGS.sweep, "sweep", "SWEEP", SweepError)
  root = FLAGS.root or os.path.join("runs", "sweeps", sweep.name)
  sweep.validate()
  local = FLAGS.mode == "local" and not FLAGS.collect_only  # printed commands run elsewhere
  if local:
    root = str(paths.output_dir(root, "--root"))
  if not FLAGS.collect_only:
    with launch.holding(root, "sweep.py") if local else contextlib.nullcontext():
      settings = {p: setting(sweep.get_config(p)) for p in sweep.points()}
      status = launch.run(sweep, FLAGS.sweep, root, mode=FLAGS.mode, launcher=FLAGS.launcher,
                          settings=settings, retrain=FLAGS.retrain_changed)
    counts = {k: sum(v == k for v in status.values()) for k in ("skipped", "ran", "printed")}
    print(json.dumps(counts))
    if FLAGS.mode == "print":
      return
  result = report.write_report(sweep, root)
  print("\n".join(result["headlines"]))
  print(f"report: {os.path.join(root, 'report.md')}")


if __name__ == "__main__":
  cli.run(main)
