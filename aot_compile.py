"""Compile a preset's full sharded train step for a TPU slice or NVIDIA GPU nodes on this (CPU)
machine: nothing runs, no accelerator is needed.

    python aot_compile.py --config=configs/scaling.py:diff-830m --topology=v5e:2x2
    python aot_compile.py --all_presets --topology=v5p:4x4x4 --out=benchmarks/results/aot_v5p.json
    python aot_compile.py --config=configs/scaling.py:diff-830m --topology=h100:8   # gpu-aot extra
    python aot_compile.py --all_presets --topology=h200:8 --out=benchmarks/results/aot_h200_8.json

Per-device memory (arguments, outputs, temporaries, total against the device's), the mesh, and
whether it compiled. TPU: a configuration that does not fit is reported with the largest
per-device batch that does. GPU (`h100:8`, `h200:8`, `h100:2x8`: <gpu>:[<nodes>x]<gpus per
node>): the usable memory is the GPU's times jax's memory fraction (XLA_PYTHON_CLIENT_MEM_FRACTION
or --memory_fraction; jax's default 0.75), a fit keeps a margin for cuDNN's workspace, and the
row holds the optimised HLO's kernels (cuDNN attention calls with their widths and mask, GEMMs,
XLA attention if any, collectives with their bytes). With --all_presets on GPU nodes each preset
gets its launch plan (aot/plan.py: per-GPU batch and remat chosen by the compiled peak, two
nodes where one does not suffice).
"""
from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # the CUDA plugin's "no driver" notes

from diff_transformer import cli, paths  # noqa: E402

from absl import flags  # noqa: E402

from configs import scaling  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.aot import plan  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS  # noqa: E402

cli.define_config(default="configs/scaling.py:diff-830m")
flags.DEFINE_string("topology", "v5e:2x2", "TPU topology (v5e:2x2, v5p:4x4x4) or GPU nodes "
                    "(h100:8, h200:8, h100:2x8).")
flags.DEFINE_integer("per_device_batch", 0, "Sequences per data-parallel device (0 = keep config).")
flags.DEFINE_bool("all_presets", False, "TPU: compile every Table 10 preset (x 4 variants). GPU: "
                  "the launch plan of every scaling preset but the 64K rows.")
flags.DEFINE_float("memory_fraction", 0.0, "GPU: the fraction of each GPU's memory jax may take "
                   "(0 = XLA_PYTHON_CLIENT_MEM_FRACTION, else jax's default 0.75).")
flags.DEFINE_string("out", "", "JSON file for the results.")
FLAGS = flags.FLAGS
# GPU presets: every scaling row but the 64K ones (a 64K sequence needs the sequence split over
# devices, which the (data, fsdp, tensor) mesh does not do).
GPU_PRESETS = tuple(p for p in scaling.preset_names() if not p.endswith("-64k"))


def run_one(config, where: aot.Target, per_device_batch: int) -> dict:
  if per_device_batch:
    config.train.global_batch_size = per_device_batch * aot.data_parallel_size_on(config, where)
  result = aot.compile_train_step(config, where)
  row = dataclasses.asdict(result)
  if where.platform == "tpu" and not (result.compiled and result.fits):
    best = aot.largest_fitting_batch(config, where, max(1, result.per_device_batch // 2))
    row["largest_fitting_per_device_batch"] = best
  return row


def main(argv):
  del argv
  config = cli.load_config()
  if FLAGS.out:
    paths.creatable(os.path.dirname(FLAGS.out) or ".", "--out")
  if FLAGS.memory_fraction and not 0 < FLAGS.memory_fraction <= 1:
    raise aot.AotError(f"--memory_fraction: {FLAGS.memory_fraction} is not in (0, 1]")
  where = aot.target(FLAGS.topology, FLAGS.memory_fraction or None)  # a bad name: one line
  rows = []
  if FLAGS.all_presets and where.platform == "gpu":
    for preset in GPU_PRESETS:
      rows.append(dict(preset=preset, **plan.plan_on_nodes(scaling.get_config(preset),
                                                           FLAGS.topology)))
      launch = rows[-1].get("launch")
      print(json.dumps(dict(preset=preset, launch=launch or "nothing fits")), flush=True)
  elif FLAGS.all_presets:
    for size in scaling.NOMINAL:  # the Table 10 rows
      for variant in PAPER_VARIANTS:
        c = scaling.get_config(f"{variant}-{size}")
        c.mesh.update(config.mesh.to_dict())
        c.model.remat = config.model.remat
        c.train.micro_batches = 1
        rows.append(dict(preset=f"{variant}-{size}",
                         **run_one(c, where, FLAGS.per_device_batch or 1)))
        print(json.dumps(rows[-1]), flush=True)
  else:
    rows.append(run_one(config, where, FLAGS.per_device_batch))
    print(json.dumps(rows[-1]))
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out) or ".", exist_ok=True)
    with open(FLAGS.out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main)
