"""The environments of the child processes tests start (train.py, eval.py, ...): the session's
XLA flags (diff_transformer/xla_flags.py) plus fake host devices."""
from __future__ import annotations

import os


def fake_devices_env(count: int, env: dict[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's) with `count` host CPU devices added to XLA_FLAGS; the
  session's other flags (fast compilation) stay, since these children compile far more than they
  run."""
  env = dict(os.environ if env is None else env)
  env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} "
                      f"--xla_force_host_platform_device_count={count}").strip()
  return env
