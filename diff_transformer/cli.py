"""Command-line plumbing shared by train.py, eval.py and the other programs.

Every program ends with

    if __name__ == "__main__":
      cli.run(main)                      # absl flags (parsed by parse_flags)
      cli.run(main, absl_flags=False)    # argparse programs: main(sys.argv[1:]) -> exit code

so that any user-facing error (a `UserError`: bad flag, config value, file, workdir) is printed
as one line `error: <message>` on stderr with exit status 2 and no traceback, Ctrl-C is one line
with status 130, and what library background threads print after that is dropped.
"""
from __future__ import annotations

import ast
import importlib.util
import logging
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn

from absl import flags

from diff_transformer.config import validate
from diff_transformer.errors import ConfigError, UserError, first_line, last_line, message_lines

PROJECT_ROOT = Path(__file__).resolve().parents[1]
USER_ERROR_EXIT = 2
INTERRUPT_EXIT = 130
_CONFIG_FLAGS: list[str] = []  # names defined by define_config (their file paths get resolved)
_LIBRARY_ERRORS = (flags.Error, AttributeError, KeyError, ValueError, TypeError, OSError)


def quiet_leftovers() -> None:
  """Drop what background threads and interpreter shutdown print after the one line (orbax and
  tensorstore callbacks, 'Exception ignored' coroutines, asyncio 'Task exception' logs)."""
  sys.unraisablehook = lambda unraisable: None
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  sys.stderr = open(os.devnull, "w")


def exit_with(line: str, code: int = USER_ERROR_EXIT) -> NoReturn:
  """Prints `line` (made one line) to stderr, quiets the rest and exits with `code`."""
  print(" ".join(line.split("\n")).strip(), file=sys.stderr, flush=True)
  quiet_leftovers()
  sys.exit(code)


def fail(message: str) -> NoReturn:
  exit_with(f"error: {message}")


def _guarded(main: Callable[..., Any], *args) -> Any:
  try:
    return main(*args)
  except UserError as e:
    fail("; ".join(message_lines(e)) or type(e).__name__)
  except OSError as e:  # a file system refusal no earlier check foresaw: still one line
    if e.filename is None:
      raise
    fail(f"{e.filename}: {e.strerror or type(e).__name__}")
  except KeyboardInterrupt:
    exit_with("interrupted", INTERRUPT_EXIT)


def run(main: Callable[..., Any], *, absl_flags: bool = True) -> NoReturn:
  """The entry point of every program (see the module docstring).

  absl_flags=True: `main(argv)` under absl's app.run with flags parsed by parse_flags.
  absl_flags=False: `main(sys.argv[1:])` (argparse programs); its return value is the exit code.
  """
  if absl_flags:
    from absl import app
    app.run(lambda argv: _guarded(main, argv), flags_parser=parse_flags)
  sys.exit(_guarded(main, sys.argv[1:]))


def _unknown_key_text(e: Exception) -> str:
  """ml_collections reports an unknown key as KeyError("'key'\nDid you mean ...") and may wrap
  its str() (a quoted, escaped repr) in an AttributeError: undo both."""
  text = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
  if text[:1] in "'\"" and "\\n" in text:
    try:
      text = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      pass
  return text


def _one_line(e: Exception) -> str:
  if isinstance(e, (AttributeError, KeyError)):
    key, *hint = [l.strip() for l in _unknown_key_text(e).splitlines() if l.strip()] or ["?"]
    hint.append("known keys: diff_transformer/config.py (data, train, mesh) and "
                "diff_transformer/model/spec.py (model)")
    return f"unknown config key {key} ({'; '.join(hint)})"
  return last_line(e)


def load_definition(path: str, flag: str, name: str, error: type[UserError] = ConfigError):
  """The object `name` (e.g. SWEEP, STUDY) a definition file defines; a missing file or one that
  fails to run is one `error` naming the file (and line)."""
  path = resolve_config_path(path, flag)
  spec = importlib.util.spec_from_file_location(f"{flag}_definition", path)
  if spec is None or spec.loader is None:
    raise error(f"--{flag}: {path} cannot be loaded as a Python file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise error(f"--{flag}: {e.filename or path}:{e.lineno}: {e.msg}") from None
  except UserError:  # already one line naming the file and field
    raise
  except Exception as e:  # noqa: BLE001 - any error the file's own code raises
    line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__))
                 if os.path.abspath(f.filename) == os.path.abspath(path)), "?")
    raise error(f"--{flag}: {path}:{line}: {type(e).__name__}: {first_line(e)}") from None
  if not hasattr(module, name):
    raise error(f"--{flag}: {path} defines no {name}")
  return getattr(module, name)


def resolve_config_path(value: str, flag: str = "config") -> str:
  """FILE[:preset] with FILE as given if it exists, else relative to the project (so train.py runs
  from any directory); a missing file is a UserError naming both places looked in."""
  path, sep, preset = value.partition(":")
  if Path(path).expanduser().is_file():
    return value
  in_project = PROJECT_ROOT / path
  if not Path(path).is_absolute() and in_project.is_file():
    return f"{in_project}{sep}{preset}"
  where = (path if Path(path).is_absolute()
           else f"{path} (looked in {Path.cwd()} and {PROJECT_ROOT})")
  raise ConfigError(f"--{flag}: no such file {where}")


def _resolve_config_args(argv: list[str]) -> list[str]:
  out = list(argv)
  for i, arg in enumerate(out):
    for name in _CONFIG_FLAGS:
      if arg.startswith(f"--{name}="):
        out[i] = f"--{name}=" + resolve_config_path(arg.split("=", 1)[1], name)
      elif arg == f"--{name}" and i + 1 < len(out):
        out[i + 1] = resolve_config_path(out[i + 1], name)
  return out


def define_config(name: str = "config", default: str = "configs/default.py") -> None:
  """--config=FILE[:preset] plus --config.x.y=v overrides (typos in keys are rejected)."""
  from ml_collections import config_flags
  default = resolve_config_path(default, name)
  _CONFIG_FLAGS.append(name)
  try:
    config_flags.DEFINE_config_file(name, default, "Config file, optionally FILE:preset.",
                                    lock_config=True)
  except _LIBRARY_ERRORS as e:  # overrides parse at definition
    fail(_one_line(e))


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing where a bad flag, config file or config key is one line, no traceback."""
  try:
    return flags.FLAGS(_resolve_config_args(argv))
  except UserError as e:
    fail(str(e))
  except _LIBRARY_ERRORS as e:
    fail(_one_line(e))


def load_config(name: str = "config"):
  """The validated config flag (overrides are applied on first access, so errors surface here)."""
  try:
    return validate(getattr(flags.FLAGS, name))
  except ConfigError as e:
    fail(str(e))
  except _LIBRARY_ERRORS as e:
    fail(_one_line(e))


def config_from_args(args: list[str]) -> tuple[Any, str]:
  """(validated config, workdir) of train.py's `--config=FILE[:preset]`, `--config.x=v` and
  `--workdir=DIR` arguments, parsed by the same flag machinery as train.py's own (a
  population's members are the train.py command lines they would run alone)."""
  from ml_collections import config_flags
  argv = ["train.py"] + [f"--config={resolve_config_path(a.split('=', 1)[1])}"
                         if a.startswith("--config=") else a for a in args]
  values = flags.FlagValues()
  try:
    # the override flags (--config.x=v) are defined from the argv given at definition
    config_flags.DEFINE_config_file("config", None, "Config file.", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "Run directory.", flag_values=values)
    values(argv)
    if values.config is None or values.workdir is None:
      raise ConfigError(f"member {shlex.join(args)}: needs --config and --workdir")
    return validate(values.config), values.workdir
  except UserError:
    raise
  except _LIBRARY_ERRORS as e:
    raise ConfigError(_one_line(e)) from None


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


def out_file(value: str) -> Path | None:
  """argparse `type=` of a program's --out file: its folder is made now, or the program is
  refused now (exit 2, before anything is measured), never after its work. '' is no file."""
  import argparse  # argparse programs only; absl programs never reach this
  if not value:
    return None
  path = Path(value)
  if path.is_dir():
    raise argparse.ArgumentTypeError(f"{value} is a folder; give the JSON file's path")
  if path.parent.exists() and not path.parent.is_dir():
    raise argparse.ArgumentTypeError(f"{value}: {path.parent} is a file, not a folder")
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise argparse.ArgumentTypeError(f"{value}: cannot make its folder "
                                     f"({e.strerror or type(e).__name__})") from None
  if not os.access(path.parent, os.W_OK):
    raise argparse.ArgumentTypeError(f"{value}: its folder {path.parent} is not writable")
  return path
