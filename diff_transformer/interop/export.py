"""A run as a Hugging Face model folder (`python export.py --workdir RUN --out DIR`):
`export_run` restores the run's model (runs/restore.py) and writes it with `write_folder`.

The folder holds config.json, model.safetensors (float32), generation_config.json, tokenizer files
and a sidecar of the tensors the HF layout folds (see weights.py); a target with bundled
modelling files (DIFF V2: `hf_diff_v2.py`) carries them too (loaded with trust_remote_code=True).
Anything the target class cannot hold exactly is refused in one line before any checkpoint is
read. A padded vocabulary keeps all its rows (config vocab_size = model.vocab_size); the
generation config suppresses the ids the tokenizer has no token for.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from diff_transformer.data import synthetic
from diff_transformer.files import read_json
from diff_transformer.interop import InteropError, require, weights
from diff_transformer.interop.hf_tokenizer import hf_tokenizer
from diff_transformer.model import split_params
from diff_transformer.model.spec import ModelSpec
from diff_transformer.model.attention import spec_from_config
from diff_transformer.runs.folder import CONFIG, TOKENIZER_RECORD
from diff_transformer.runs.record import read_config
from diff_transformer.runs.restore import restore_model
from diff_transformer.tree import flatten

REMOTE_DIR = Path(__file__).parent / "remote"
EXPORT_RECORD = "diff_transformer_export.json"


def check_export(spec: ModelSpec, record: dict, out: Path, workdir: Path, task: str = ""):
  """Everything that can refuse an export, in one line, before any checkpoint is read; returns
  the run's tokenizer as a transformers tokenizer (for write_folder). `task`: the run's
  data.name (a synthetic task has no text to export a tokenizer for)."""
  weights.check_exportable(spec)
  if task in synthetic.TASKS:
    raise InteropError(f"--workdir {workdir}: " + synthetic.no_text_tokenizer(task, workdir))
  require("transformers", "safetensors", "torch")
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise InteropError(f"--out: {out} exists and is not an empty folder")
  if record["name"] not in ("byte", "bpe", "file", "tiktoken"):
    raise InteropError(f"{workdir}/tokenizer_record.json: unknown tokenizer {record['name']!r}")
  if record.get("eot_id") is None:  # every text tokenizer records it; a synthetic task has none
    raise InteropError(f"{workdir}/tokenizer_record.json: missing key 'eot_id'")
  if record["vocab_size"] > spec.vocab_size:
    raise InteropError(f"{workdir}/tokenizer_record.json: the tokenizer's {record['vocab_size']} "
                       f"ids exceed model.vocab_size {spec.vocab_size}")
  return hf_tokenizer(record, workdir)  # a tokenizer it cannot convert exactly: refused now


def hf_config_object(spec: ModelSpec, eot_id: int):
  """The transformers config object of the variant's target class."""
  fields = weights.hf_config(spec, eot_id)
  fields.pop("architectures")
  return weights.target(spec).config_object(fields)


def write_folder(model, spec: ModelSpec, record: dict, tokenizer, workdir: Path, out: Path,
                 step: int) -> dict:
  """Writes the HF folder of `model` with check_export's tokenizer; returns the export record."""
  from flax import nnx
  from safetensors.numpy import save_file
  from transformers import GenerationConfig
  _, params, constants = split_params(model)
  as_numpy = lambda tree, dtype=None: {k: np.asarray(v, dtype) for k, v in flatten(tree).items()}
  hf, sidecar = weights.to_hf(spec, as_numpy(nnx.to_pure_dict(params), np.float32),
                              as_numpy(nnx.to_pure_dict(constants)))

  out.mkdir(parents=True, exist_ok=True)
  eot = int(record["eot_id"])
  hf_config_object(spec, eot).save_pretrained(str(out))
  tensors = {k: np.ascontiguousarray(v) for k, v in hf.items()}
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  if sidecar:
    save_file({k: np.ascontiguousarray(v) for k, v in sidecar.items()},
              str(out / weights.SIDECAR), metadata={"format": "np"})
  # Padded vocabulary rows (and any id the tokenizer has no token for) never come from the data;
  # transformers' generate must not pick them either.
  unused = sorted(set(range(spec.vocab_size)) - set(tokenizer.get_vocab().values()))
  GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot,
                   suppress_tokens=unused or None).save_pretrained(str(out))
  tokenizer.save_pretrained(str(out))
  for name in weights.target(spec).bundled_files:
    shutil.copyfile(REMOTE_DIR / name, out / name)
  summary = dict(run=str(workdir.resolve()), step=int(step), variant=spec.variant,
                 architecture=weights.architecture(spec), tokenizer=record,
                 model=spec.__dict__)
  (out / EXPORT_RECORD).write_text(json.dumps(summary, indent=2, default=str) + "\n")
  return summary


def export_run(workdir: str | Path, out: str | Path, step: int | None = None) -> dict:
  """The run's checkpoint (newest, or `step`) as a Hugging Face folder; returns its record.
  Every refusal comes in one line before the checkpoint is read."""
  workdir, out = Path(workdir), Path(out)
  config = read_config(workdir)
  if config is None or not (workdir / TOKENIZER_RECORD).is_file():
    raise InteropError(f"--workdir: {workdir} has no {CONFIG} or {TOKENIZER_RECORD}; not a "
                       "training workdir")
  spec = spec_from_config(config.model)
  record = read_json(workdir / TOKENIZER_RECORD, InteropError, "tokenizer record")
  tokenizer = check_export(spec, record, out, workdir, task=config.data.name)
  model, _, step = restore_model(workdir, step=step)
  return write_folder(model, spec, record, tokenizer, workdir, out, step)
