"""Compile a preset's full sharded train step for a TPU topology on this (CPU) machine.

    python aot_compile.py --config=configs/scaling.py:diff-830m --topology=v5e:2x2
    python aot_compile.py --all_presets --topology=v5p:4x4x4 --out=benchmarks/results/aot_v5p.json

Per-chip memory (arguments, outputs, temporaries, total vs HBM), the mesh, and whether it
compiled; a configuration that does not fit is reported with the largest per-device batch that does.
"""
from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from diff_transformer import cli, paths  # noqa: E402

from absl import flags  # noqa: E402

from configs import scaling  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS  # noqa: E402

cli.define_config(default="configs/scaling.py:diff-830m")
flags.DEFINE_string("topology", "v5e:2x2", "TPU topology name, e.g. v5e:2x2, v5p:4x4x4, v6e:16x16.")
flags.DEFINE_integer("per_device_batch", 0, "Sequences per data-parallel device (0 = keep config).")
flags.DEFINE_bool("all_presets", False, "Compile every Table 10 preset (x 4 variants).")
flags.DEFINE_string("out", "", "JSON file for the results.")
FLAGS = flags.FLAGS


def run_one(config, topology: str, per_device_batch: int) -> dict:
  if per_device_batch:
    config.train.global_batch_size = per_device_batch * aot.data_parallel_size_on(config, topology)
  result = aot.compile_train_step(config, topology)
  row = dataclasses.asdict(result)
  if not (result.compiled and result.fits):
    best = aot.largest_fitting_batch(config, topology, max(1, result.per_device_batch // 2))
    row["largest_fitting_per_device_batch"] = best
  return row


def main(argv):
  del argv
  config = cli.load_config()
  if FLAGS.out:
    paths.creatable(os.path.dirname(FLAGS.out) or ".", "--out")
  rows = []
  if FLAGS.all_presets:
    for size in scaling.NOMINAL:  # the Table 10 rows
      for variant in PAPER_VARIANTS:
        c = scaling.get_config(f"{variant}-{size}")
        c.mesh.update(config.mesh.to_dict())
        c.model.remat = config.model.remat
        c.train.micro_batches = 1
        rows.append(dict(preset=f"{variant}-{size}", **run_one(c, FLAGS.topology,
                                                               FLAGS.per_device_batch or 1)))
        print(json.dumps(rows[-1]), flush=True)
  else:
    rows.append(run_one(config, FLAGS.topology, FLAGS.per_device_batch))
    print(json.dumps(rows[-1]))
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
