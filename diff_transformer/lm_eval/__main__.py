"""`python -m diff_transformer.lm_eval [lm_eval flags]`: lm-eval's command line with the
`diff_transformer` model registered (and chosen when --model is not given)."""
from __future__ import annotations

import sys
from pathlib import Path

from diff_transformer import cli
from diff_transformer.interop import InteropError, require


def _check_workdir(argv: list[str]) -> None:
  """One line for a --model_args workdir that is not a run, before lm-eval starts its work."""
  args = [a.split("=", 1)[1] for a in argv if a.startswith("--model_args=")]
  args += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model_args"]
  for text in args:
    fields = dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)
    if "workdir" in fields:
      workdir = Path(fields["workdir"])
      if not (workdir / "config.json").is_file() or not (workdir / "checkpoints").is_dir():
        raise ValueError(f"--model_args workdir={workdir}: not a training workdir (no config.json "
                         "or checkpoints/)")


def main() -> None:
  cli.default_platform()
  try:
    require("lm_eval")
  except InteropError as e:
    sys.exit(f"error: {e}")
  try:
    _check_workdir(sys.argv[1:])
  except ValueError as e:
    sys.exit(f"error: {e}")
  import diff_transformer.lm_eval.model  # noqa: F401  (registers "diff_transformer")
  from lm_eval.__main__ import cli_evaluate
  argv = sys.argv[1:]
  if not argv or argv[0] not in ("run", "ls", "validate"):
    argv = ["run", *argv]
  if argv[0] == "run" and not any(a == "--model" or a.startswith("--model=") for a in argv):
    argv = ["run", "--model", "diff_transformer", *argv[1:]]
  sys.argv = [sys.argv[0], *argv]
  cli_evaluate()


if __name__ == "__main__":
  main()
