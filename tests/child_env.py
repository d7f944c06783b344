"""Environments for the child processes tests start (train.py, eval.py, ...)."""
from __future__ import annotations

import os

# conftest.py sets this to 0 for the whole session (tests compile far more than they run).
OPT_LEVEL_FLAG = "--xla_backend_optimization_level"


def optimized_env(env: dict[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's) with the CPU backend's optimisation level back at XLA's
  default: for children whose run time, not their compile time, dominates."""
  env = dict(os.environ if env is None else env)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(OPT_LEVEL_FLAG)]
  env["XLA_FLAGS"] = " ".join(flags)
  return env


def fake_devices_env(count: int, env: dict[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's) with `count` host CPU devices added to XLA_FLAGS; the
  session's other flags (unoptimised CPU code) stay, since these children compile far more than
  they run."""
  env = dict(os.environ if env is None else env)
  env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} "
                      f"--xla_force_host_platform_device_count={count}").strip()
  return env
