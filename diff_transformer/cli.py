"""Command-line plumbing shared by train.py, eval.py and the other programs."""
from __future__ import annotations

import importlib.util
import os
import sys

from absl import flags

from diff_transformer.config import ConfigError, validate
from diff_transformer.errors import last_line


def _one_line(e: Exception) -> str:
  message = last_line(e)
  if isinstance(e, (AttributeError, KeyError)):
    message = f"unknown config key {message} (known keys: diff_transformer/config.py)"
  return message


def define_config(name: str = "config", default: str = "configs/default.py") -> None:
  """--config=FILE[:preset] plus --config.x.y=v overrides (typos in keys are rejected)."""
  from ml_collections import config_flags
  try:
    config_flags.DEFINE_config_file(name, default, "Config file, optionally FILE:preset.",
                                    lock_config=True)
  except (AttributeError, KeyError, ValueError, TypeError) as e:  # overrides parse at definition
    sys.exit(f"error: {_one_line(e)}")


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing where a bad flag or config key is one clear line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as e:
    sys.exit(f"error: {_one_line(e)}")


def load_config(name: str = "config"):
  """The validated config flag (overrides are applied on first access, so errors surface here)."""
  try:
    return validate(getattr(flags.FLAGS, name))
  except (ConfigError, AttributeError, KeyError, ValueError, TypeError) as e:
    sys.exit(f"error: {_one_line(e)}")


def default_platform() -> None:
  """Keep jax on CPU where libtpu is installed (for AOT compiles) but no TPU is attached."""
  if "JAX_PLATFORMS" in os.environ or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio"):
    return
  if importlib.util.find_spec("libtpu") is None:
    return
  if os.path.exists("/dev/nvidia0"):
    return
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax  # already imported by flax: set the config too (read when backends start)
  jax.config.update("jax_platforms", "cpu")
