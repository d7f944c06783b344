"""XLA flags for CPU work that compiles far more than it runs: the test suite sets them for its
whole session and every child process it starts (tests/conftest.py), and
benchmarks/compile_flags.py measures what each one saves."""
from __future__ import annotations

import importlib.metadata
import os

# Tests compile far more than they run, so tests/conftest.py sets these for the whole session (and
# so for every child process): LLVM left unoptimised, XLA:CPU's older loop emitters instead of its
# MLIR fusion emitters, and the generated code compiled as one module (for these small programs
# the parallel split costs more than it saves, on one busy core or two idle ones). Same HLO and
# XLA passes, but other generated code: float32 results can differ in the last bits from a
# default-flag run (tolerances allow it; bitwise tests compare runs made under the same flags).
# benchmarks/compile_flags.py measures the gain: on one core of a 2-core AMD
# EPYC host, four tiny train + eval steps compiled in 31.5 s with XLA's defaults, 12.8 s with the
# first flag, 4.2 s with two and 3.3 s with all three (median of 3 rounds).
# jaxlib 0.11 removed the emitter flag (its XLA stops at an unknown flag), so it is named only
# for older jaxlib.
FAST_COMPILE_FLAGS = {
    "--xla_backend_optimization_level": "0",
    "--xla_cpu_parallel_codegen_split_count": "1",
}
_JAXLIB = tuple(int(x) for x in importlib.metadata.version("jaxlib").split(".")[:2])
if _JAXLIB < (0, 11):
  FAST_COMPILE_FLAGS["--xla_cpu_use_fusion_emitters"] = "false"


def with_fast_compile(flags: str) -> str:
  """`flags` (an XLA_FLAGS value) plus each fast-compile flag it does not already set."""
  extra = [f"{name}={value}" for name, value in FAST_COMPILE_FLAGS.items() if name not in flags]
  return " ".join([flags, *extra]).strip()


def optimized_env(env: dict[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's) with XLA's default CPU compilation back: for children whose
  run time, not their compile time, dominates."""
  env = dict(os.environ if env is None else env)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if f.split("=")[0] not in FAST_COMPILE_FLAGS]
  env["XLA_FLAGS"] = " ".join(flags)
  return env
