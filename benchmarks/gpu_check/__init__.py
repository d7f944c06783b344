"""The GPU check: the kernels, the training step and decoding on a GPU's own JAX, stage by stage.

  bash tools/gpu_check.sh [OUT]            # on the GPU machine: every stage, each its own process
  bash tools/gpu_check.sh --cpu [OUT]      # tiny shapes, Pallas interpreted, on any machine
  python -m benchmarks.gpu_check --stage kernels --out OUT [--cpu] [--seconds 80]
  python -m benchmarks.gpu_check --cpu --out OUT  # every stage in one process (the tests' way)

The stages, their caps and the order they run in are one table (stages.py), which
tools/gpu_check.sh asks for its plan; each stage is a module here (env, correctness, kernels,
train, profile, decode) with what they share in common.py (and the train stage's memory fit
in fit.py). Each stage writes OUT/gpu_check_<stage>.json after every cell, so a stage stopped by
its time cap keeps what it finished; a failing cell records its error and the stage goes on.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the project's packages, from any working directory
  sys.path.insert(0, str(ROOT))
