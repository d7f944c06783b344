"""`python -m diff_transformer.lm_eval [lm_eval flags]`: lm-eval's command line with the
`diff_transformer` model registered (and chosen when --model is not given)."""
from __future__ import annotations

import sys
from pathlib import Path

from diff_transformer import cli
from diff_transformer.data import synthetic
from diff_transformer.errors import UserError, first_line
from diff_transformer.files import read_json
from diff_transformer.interop import InteropError, require
from diff_transformer.runs.folder import RunFolder


MODEL_ARGS = ("workdir", "step", "batch_size", "max_gen_toks", "max_length", "seed")


def check_model_args(argv: list[str]) -> None:
  """One line (ValueError) for --model_args this adapter cannot serve, before lm-eval starts its
  work: an unknown key, a workdir that is not a run, a run trained on a synthetic task (no text
  tokenizer to score with), a step that has no checkpoint."""
  args = [a.split("=", 1)[1] for a in argv if a.startswith("--model_args=")]
  args += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model_args"]
  for text in args:
    fields = dict(kv.split("=", 1) for kv in text.split(",") if "=" in kv)
    unknown = sorted(set(fields) - set(MODEL_ARGS))
    if unknown:
      raise ValueError(f"--model_args: unknown key '{unknown[0]}'; the diff_transformer model "
                       f"takes {', '.join(MODEL_ARGS)}")
    if "workdir" not in fields:
      continue
    workdir = Path(fields["workdir"])
    folder = RunFolder(workdir)
    if not folder.config.is_file() or not folder.checkpoints.is_dir():
      raise ValueError(f"--model_args workdir={workdir}: not a training workdir (no "
                       f"{folder.config.name} or {folder.checkpoints.name}/)")
    data = read_json(folder.config, UserError, "run config")["data"]
    if data.get("name") in synthetic.TASKS:
      raise ValueError(f"--model_args workdir={workdir}: "
                       + synthetic.no_text_tokenizer(data["name"], workdir))
    step = fields.get("step", "")
    steps = folder.checkpoint_steps()
    if step and (not step.isdigit() or int(step) not in steps):
      raise ValueError(f"--model_args step={step}: {workdir} has checkpoints at steps {steps}")


def main() -> None:
  cli.default_platform()
  try:
    check_model_args(sys.argv[1:])
    require("lm_eval")
  except (ValueError, InteropError) as e:
    _fail(str(e))
  import diff_transformer.lm_eval.model  # noqa: F401  (registers "diff_transformer")
  from lm_eval.__main__ import cli_evaluate
  argv = sys.argv[1:]
  if not argv or argv[0] not in ("run", "ls", "validate"):
    argv = ["run", *argv]
  if argv[0] == "run" and not any(a == "--model" or a.startswith("--model=") for a in argv):
    argv = ["run", "--model", "diff_transformer", *argv[1:]]
  sys.argv = [sys.argv[0], *argv]
  try:
    cli_evaluate()
  except UserError as e:  # the project's own errors, as every other program prints them
    _fail(first_line(e))


def _fail(message: str) -> None:
  """One `error:` line and exit status 2, as cli.run ends every other program."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


if __name__ == "__main__":
  main()
