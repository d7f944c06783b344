"""Start a run from a Hugging Face folder (`--config.init_from_hf=DIR`): the inverse of export.

The folder must hold the model the run's config builds (LlamaForCausalLM for transformer,
DiffLlamaForCausalLM for diff, an export of this codebase for shared_diff / diff_v2): every shape
field is compared first and a mismatch is one line naming the config field. Weights are read with
safetensors only (float32, float16 or bfloat16 files; sharded folders with an index too).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from diff_transformer.files import read_json, read_safetensors, safetensors_names
from diff_transformer.interop import InteropError, require, weights
from diff_transformer.model.spec import ModelSpec

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older exports saved


def read_hf_config(folder: str | Path) -> dict:
  """config.json of an HF model folder, or one line saying why the folder is not one."""
  folder = Path(folder)
  if not folder.is_dir():
    raise InteropError(f"init_from_hf: {folder} is not a folder")
  path = folder / "config.json"
  if not path.is_file():
    raise InteropError(f"init_from_hf: {folder} has no config.json; not a Hugging Face model "
                       "folder")
  return read_json(path, InteropError, "HF config")


def check_folder(spec: ModelSpec, folder: str | Path) -> dict:
  """Cheap checks (config fields, weight files present) before any training work starts."""
  cfg = read_hf_config(folder)
  if not cfg.get("architectures"):
    raise InteropError(f"init_from_hf: {folder}/config.json names no architectures; not a "
                       "Hugging Face model folder (a training workdir? use --workdir to resume)")
  weights.check_hf_config(spec, cfg, folder)
  folder = Path(folder)
  if not (folder / SINGLE_FILE).is_file() and not (folder / INDEX_FILE).is_file():
    raise InteropError(f"init_from_hf: {folder} has no {SINGLE_FILE} or {INDEX_FILE} "
                       "(only safetensors weights are read)")
  require("safetensors")
  for path in weight_files(folder):  # every header, before any work
    safetensors_names(path, InteropError)
  return cfg


def weight_files(folder: Path) -> list[Path]:
  """The folder's safetensors files: the single file or the index's shards, and a sidecar."""
  if (folder / SINGLE_FILE).is_file():
    files = [folder / SINGLE_FILE]
  else:
    index = read_json(folder / INDEX_FILE, InteropError, "HF index")
    shards = index["weight_map"].values()
    files = [folder / shard for shard in sorted(set(shards))]
    for path in files:
      if not path.is_file():
        raise InteropError(f"init_from_hf: {path} (listed in {INDEX_FILE}) is missing")
  sidecar = folder / weights.SIDECAR
  return files + ([sidecar] if sidecar.is_file() else [])


def read_tensors(folder: str | Path) -> dict[str, np.ndarray]:
  tensors = {}
  for path in weight_files(Path(folder)):
    if path.name != weights.SIDECAR:
      tensors.update(read_safetensors(path, InteropError))
  return {k: v for k, v in tensors.items() if not k.endswith(IGNORED_SUFFIXES)}


def import_params(spec: ModelSpec, folder: str | Path) -> dict[str, np.ndarray]:
  """Our flat float32 parameters ("blocks.attn.wq.kernel", ...) from an HF folder."""
  check_folder(spec, folder)
  folder = Path(folder)
  hf = read_tensors(folder)
  sidecar_path = folder / weights.SIDECAR
  sidecar = read_safetensors(sidecar_path, InteropError) if sidecar_path.is_file() else None
  params = weights.from_hf(spec, hf, sidecar, folder=str(folder))
  used = set(weights.to_hf(spec, params, weights.constants(spec))[0])
  if spec.tie_embeddings and "lm_head.weight" in hf:  # some writers save the tied copy
    if not np.array_equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"]):
      raise InteropError(f"model.tie_embeddings: {folder} has an lm_head.weight of its own; "
                         "set model.tie_embeddings=False")
    used.add("lm_head.weight")
  extra = sorted(set(hf) - used)
  if extra:
    raise InteropError(f"init_from_hf: {folder} has tensor {extra[0]} that this model has no "
                       f"place for ({len(extra)} such tensors; biases?)")
  return params
