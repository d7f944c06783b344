"""Scaling sweeps: run (or print) every point, skip finished ones, then fit and report.

    python sweep.py --sweep=configs/sweeps/cpu.py --root=runs/sweeps/cpu            # run + report
    python sweep.py --sweep=configs/sweeps/table10.py --root=/ckpt/sweeps --mode=print \
        --launcher="sbatch --nodes=4 --wrap"                                         # cluster
    python sweep.py --sweep=configs/sweeps/cpu.py --root=runs/sweeps/cpu --collect_only
"""
from __future__ import annotations

import importlib.util
import json
import os
import traceback

from diff_transformer import cli

cli.default_platform()

from absl import flags  # noqa: E402

from diff_transformer.errors import UserError, first_line  # noqa: E402
from diff_transformer.sweeps import report, runner  # noqa: E402
from diff_transformer.sweeps.definition import SweepError  # noqa: E402

flags.DEFINE_string("sweep", "configs/sweeps/cpu.py", "Sweep definition file (defines SWEEP).")
flags.DEFINE_string("root", "", "Directory holding one workdir per point (default runs/sweeps/<name>).")
flags.DEFINE_enum("mode", "local", ["local", "print"], "Run here one after another, or print commands.")
flags.DEFINE_string("launcher", "", "Prefix for printed commands, e.g. 'sbatch --wrap'.")
flags.DEFINE_bool("collect_only", False, "Only collect finished points, fit and report.")
FLAGS = flags.FLAGS


def load_sweep(path: str):
  """The SWEEP a sweep file defines; a missing file or one that fails to run is one SweepError
  naming the file (and line)."""
  path = cli.resolve_config_path(path, "sweep")
  spec = importlib.util.spec_from_file_location("sweep_definition", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise SweepError(f"--sweep: {e.filename or path}:{e.lineno}: {e.msg}") from None
  except UserError:  # already one line naming the sweep and field
    raise
  except Exception as e:  # noqa: BLE001 - any error the file's own code raises
    line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__))
                 if os.path.abspath(f.filename) == os.path.abspath(path)), "?")
    raise SweepError(f"--sweep: {path}:{line}: {type(e).__name__}: {first_line(e)}") from None
  if not hasattr(module, "SWEEP"):
    raise SweepError(f"--sweep: {path} defines no SWEEP")
  return module.SWEEP


def main(argv):
  del argv
  sweep = load_sweep(FLAGS.sweep)
  root = FLAGS.root or os.path.join("runs", "sweeps", sweep.name)
  sweep.validate()
  if not FLAGS.collect_only:
    status = runner.run(sweep, FLAGS.sweep, root, mode=FLAGS.mode, launcher=FLAGS.launcher)
    print(json.dumps({k: sum(v == k for v in status.values()) for k in ("skipped", "ran", "printed")}))
    if FLAGS.mode == "print":
      return
  result = report.write_report(sweep, root)
  print("\n".join(result["headlines"]))
  print(f"report: {os.path.join(root, 'report.md')}")


if __name__ == "__main__":
  cli.run(main)
