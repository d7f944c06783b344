"""The environment for a child process that needs several (fake) CPU devices."""
from __future__ import annotations

import os


def fake_devices_env(count: int, env: dict[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's) with `count` host CPU devices added to XLA_FLAGS: the
  session's other flags (conftest.py: unoptimised CPU code) stay, since the children that need
  several devices compile far more than they run."""
  env = dict(os.environ if env is None else env)
  env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
  return env
