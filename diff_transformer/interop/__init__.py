"""Hugging Face interop (the optional `hf` extra): export a run as a transformers model folder and
start a run from one.

- `weights`: the exact parameter maps (numpy only) between this codebase and HF Llama/DiffLlama
  (plus the bundled DIFF V2 modelling file), in both directions.
- `export`: `check_export` refuses what cannot be exported exactly; `write_folder` writes a
  restored model's config.json, model.safetensors, generation config and tokenizer files
  (`python export.py` runs training/restore.py `export_run`, which restores and hands over).
- `hf_import`: reads an HF folder into this codebase's parameters (`--config.init_from_hf=DIR`).
"""
from __future__ import annotations

import importlib.util

from diff_transformer.errors import UserError


class InteropError(UserError, ValueError):
  """Bad export/import input; the message is one line naming the folder, field or constraint."""


def require(*modules: str) -> None:
  """One line naming the missing packages of the hf extra, before any expensive work."""
  missing = [m for m in modules if importlib.util.find_spec(m) is None]
  if missing:
    raise InteropError(f"missing {', '.join(missing)}: install the hf extra "
                       "(pip install -e \".[hf]\")")
