"""Hugging Face interop (the optional `hf` extra): export a run as a transformers model folder and
start a run from one.

- `weights`: which HF architecture a variant maps to (its class's `hf_target`) and the shared
  checks; one module per target holds its config and its exact parameter maps (numpy only) in
  both directions: `hf_llama` (LlamaForCausalLM), `hf_diff_llama` (DiffLlamaForCausalLM),
  `hf_diff_v2` (the bundled modelling files in `remote/`); `hf_common` what they share,
  `hf_tokenizer` the tokenizer conversion.
- `export`: `check_export` refuses what cannot be exported exactly; `write_folder` writes a
  restored model's config.json, model.safetensors, generation config and tokenizer files
  `export_run` restores a run (runs/restore.py) and writes it (`python export.py`).
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
