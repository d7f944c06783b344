"""The GPU check's stages: one table of name, module, time caps and part, read by the driver
(__main__.py) and by tools/gpu_check.sh (`python benchmarks/gpu_check/stages.py --plan`), so a
stage is named in one place. Plain Python: the shell asks it before jax starts.

Caps in seconds. Compiling dominates on the GPU (measured on an H200: 12 attention programs
42-56 s, 16 train steps 38-61 s, 16 decode programs 34-40 s). `JOBS` are the two commands a
time-limited GPU job runs (`gpu_check.sh --job 1|2`), each with caps adding up to at most
JOB_SECONDS, so that with the machine's start (1-4 minutes) a job fits a 15-minute allocation.
env: 12 s warm, over 20 s on a cold machine.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import NamedTuple


class Stage(NamedTuple):
  name: str
  module: str  # benchmarks/gpu_check/<module>.py holds stage_<name>(StageRun)
  gpu_cap: int
  cpu_cap: int
  in_all: bool  # part of the whole check (gpu_check.sh without --job); else only when named
  what: str


STAGES = (
    Stage("env", "env", 40, 120, True, "versions, device, driver, cuDNN, the measured bf16 matmul "
          "and copy ceilings, every module of the package imported"),
    Stage("decode", "decode", 120, 240, True, "KV-cache generation: prefill 2K then 256 tokens, "
          "batch 1 and 32"),
    Stage("correctness", "correctness", 170, 240, True, "every kernel path of every variant "
          "against the float64 oracle, forward and gradients"),
    Stage("kernels", "kernels", 150, 240, True, "forward+backward time and compiled temp memory "
          "per path, with the train step's segment ids"),
    Stage("train", "train", 150, 240, True, "train tokens/s and MFU per variant, kernel=auto and "
          "the other fused path; one orbax save/restore that must reproduce the next losses"),
    Stage("profile", "profile", 80, 240, True, "where a train step's time goes: device kernels "
          "per variant by name and class"),
    Stage("tests", "env", 60, 60, True, "the CPU test suite's fast subset on this stack"),
    Stage("train_orbax", "train", 60, 120, False, "the orbax check alone (a short rerun)"),
)
BY_NAME = {s.name: s for s in STAGES}
ENTRY = re.compile(r"^([a-z_]+):([1-9][0-9]*)(:.*)?$")
JOB_SECONDS = 480  # a job's caps add up to at most this (8 minutes)

# The two GPU jobs: (stage, GPU cap, arguments joined by '+'), with each cap's budget from the
# H200 records (benchmarks/results/gpu_check_*.json): compile seconds per program as measured
# there, plus the timed work. A cap cuts its stage short, never the job: each stage writes its
# JSON cell by cell.
JOBS = {
    1: (
        # 12 s warm, 20+ cold.
        ("env", 30, ""),
        # The exact call at the 830M and 3B widths (96/192, 128/256), bf16, T = 2048, unpacked
        # and packed, against float64: 16 groups, about 2.5 programs each (cudnn, padded, as-is
        # when packed; Shared DIFF 830M shares DIFF V1's programs, its 3B widths are refused and
        # named): ~35 programs at ~2.7 s (32 programs took 87 s) plus the oracles.
        ("correctness", 130, "--lengths=2048+--dtypes=bfloat16+--paths=cudnn,cudnn_padded,"
         "cudnn_packed_as_is+--cases=830m:2048,830m:2048:packed,3b:2048,3b:2048:packed"),
        # 4 variants x 4 paths at 2K, causal rows (no segment ids: the unpacked call) and
        # packed documents: 32 programs (the H200 compiled 16 such in 46 s), 7 rounds. Two
        # calls sharing v against the one call over [q1; q2] (whose concatenations the compiled
        # step copies: docs/performance.md), for DIFF V1 and Shared DIFF.
        ("kernels", 140, "--lengths=2048+--paths=cudnn,cudnn_two_calls,cudnn_padded,pallas"
         "+--masks=causal,document+--tag=_exact"),
        # The 830M step at full depth, 2K, kernel=auto: four variants causal (the paper's rows),
        # DIFF V1 and the Transformer masked by document; 6 programs (16 took 61 s), 4 states;
        # a cell over the memory compiled again micro-batched (none on an H100 by the
        # deviceless compile, benchmarks/results/step_memory.json).
        ("train", 180, "--train_layers=0+--lengths=2048+--labels=auto+--masks=causal,document"
         "+--tag=_830m_full"),
    ),
    2: (
        # The 3B rows at full depth, 2K and 4K, causal, one state at a time (38-45 GiB each):
        # 8 programs (~60 s), then per turn a fresh state and its warm-up.
        ("train", 250, "--size=3b+--train_layers=0+--remat=full+--train_tokens=8192"
         "+--lengths=2048,4096+--labels=auto+--rounds=3+--tag=_3b_full"),
        # DIFF V1 against the Transformer at 2K, 830M, 12 layers (14 s on the H200).
        ("profile", 80, "--tag=_exact"),
        # Decoding with the step's command buffers at batch 1 (16 programs took 34 s).
        ("decode", 150, "--command_buffers=default,loops,off+--batches=1+--tag=_command_buffers"),
    ),
}


def plan(cpu: bool, job: int = 0) -> list[str]:
  """`stage:cap[:ARGS]` entries of the whole check, or of one GPU job, in order (on CPU the job's
  entries with the stages' CPU caps: a rehearsal)."""
  if not job:
    return [f"{s.name}:{s.cpu_cap if cpu else s.gpu_cap}" for s in STAGES if s.in_all]
  return [f"{name}:{BY_NAME[name].cpu_cap if cpu else cap}" + (f":{args}" if args else "")
          for name, cap, args in JOBS[job]]


def check(entries: list[str]) -> str:
  """'' when every `stage:seconds[:ARG+ARG...]` entry names a stage and a cap (and there is at
  least one), else why not."""
  if not entries:
    return "GPU_CHECK_STAGES names no stage: give stage:seconds entries, or leave it unset"
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
  p.add_argument("--job", type=int, default=0, choices=(0, *JOBS))
  p.add_argument("--check", nargs="*", help="entries to check; exit 2 naming a bad one")
  args = p.parse_args()
  if args.check is not None:
    why = check(args.check)
    if why:
      print(f"error: {why}", file=sys.stderr)
      sys.exit(2)
  if args.plan:
    print(" ".join(plan(args.cpu, args.job)))


if __name__ == "__main__":
  main()
