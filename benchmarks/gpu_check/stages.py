"""The GPU check's stages: one table of name, module, time caps and part, read by the driver
(__main__.py) and by tools/gpu_check.sh (`python benchmarks/gpu_check/stages.py --plan`), so a
stage is named in one place. Plain Python: the shell asks it before jax starts.

Caps in seconds. Compiling dominates on the GPU (measured on an H200: 12 attention programs
42-56 s, 16 train steps 38-61 s, 16 decode programs 34-40 s), so the GPU stages split into two
jobs of about 5.5 minutes (`part` 1 and 2). env: 12 s warm, over 20 s on a cold machine.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import NamedTuple


class Stage(NamedTuple):
  name: str
  module: str  # benchmarks/gpu_check/<module>.py holds stage_<name>(out, cpu, seconds)
  gpu_cap: int
  cpu_cap: int
  part: int  # 1 or 2 on the GPU; 0: run only when named (GPU_CHECK_STAGES)
  what: str


STAGES = (
    Stage("env", "env", 40, 120, 1, "versions, device, driver, cuDNN, the measured bf16 matmul "
          "and copy ceilings, every module of the package imported"),
    Stage("decode", "decode", 120, 240, 1, "KV-cache generation: prefill 2K then 256 tokens, "
          "batch 1 and 32"),
    Stage("correctness", "correctness", 170, 240, 1, "every kernel path of every variant "
          "against the float64 oracle, forward and gradients"),
    Stage("kernels", "kernels", 150, 240, 2, "forward+backward time and compiled temp memory "
          "per path, with the train step's segment ids"),
    Stage("train", "train", 150, 240, 2, "train tokens/s and MFU per variant, kernel=auto and "
          "the other fused path; one orbax save/restore that must reproduce the next losses"),
    Stage("profile", "profile", 80, 240, 2, "where a train step's time goes: device kernels "
          "per variant by name and class"),
    Stage("tests", "env", 60, 60, 2, "the CPU test suite's fast subset on this stack"),
    Stage("train_orbax", "train", 60, 120, 0, "the orbax check alone (a short rerun)"),
)
BY_NAME = {s.name: s for s in STAGES}
ENTRY = re.compile(r"^([a-z_]+):([1-9][0-9]*)(:.*)?$")


def plan(cpu: bool, part: int = 0) -> list[str]:
  """`stage:cap` entries of a whole check (or of one GPU part) in the table's order."""
  return [f"{s.name}:{s.cpu_cap if cpu else s.gpu_cap}" for s in STAGES
          if s.part and (not part or s.part == part)]


def check(entries: list[str]) -> str:
  """'' when every `stage:seconds[:ARG+ARG...]` entry names a stage and a cap, else why not."""
  for entry in entries:
    m = ENTRY.match(entry)
    if not m or m.group(1) not in BY_NAME:
      return (f"GPU_CHECK_STAGES entry '{entry}' is not stage:seconds[:ARG+ARG...] with a stage "
              f"among {' '.join(BY_NAME)} and a positive number of seconds")
  return ""


def main() -> None:
  p = argparse.ArgumentParser(description="The GPU check's plan for tools/gpu_check.sh.")
  p.add_argument("--plan", action="store_true", help="print the stage:cap entries to run")
  p.add_argument("--cpu", action="store_true")
  p.add_argument("--part", type=int, default=0, choices=(0, 1, 2))
  p.add_argument("--check", nargs="*", help="entries to check; exit 2 naming a bad one")
  args = p.parse_args()
  if args.check is not None:
    why = check(args.check)
    if why:
      print(f"error: {why}", file=sys.stderr)
      sys.exit(2)
  if args.plan:
    print(" ".join(plan(args.cpu, args.part)))


if __name__ == "__main__":
  main()
