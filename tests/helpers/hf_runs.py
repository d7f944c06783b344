"""Tiny training workdirs for the Hugging Face interop tests, written without training: a fresh
state with every parameter perturbed (norm gains and lambda vectors far from their init, so a
wrong fold or pairing shows), saved as a real checkpoint with its run record."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from a hub

VOCAB = 264  # the byte tokenizer's 257 ids, rounded up


def run_config(variant: str, *, gqa: bool = True, tie: bool = False, **model):
  """D = 32, d = 8, heads and rank of the variant's tiny spec (tests/helpers/variant_table.py)."""
  from diff_transformer.config import base_config, validate
  from tests.helpers.variant_table import tiny
  shape = tiny(variant)
  config = base_config()
  fields = dict(variant=variant, vocab_size=VOCAB, d_model=32, num_layers=3,
                num_heads=shape.num_heads, num_kv_heads=shape.kv_heads if gqa else shape.num_heads,
                head_dim=8, ffn_dim=64, max_seq_len=64, tie_embeddings=tie,
                **dataclasses.asdict(shape.options))
  from diff_transformer.model.attention import set_model
  set_model(config.model, **{**fields, **model})
  config.data.update(dict(name="prepared", tokenizer="byte", seq_len=32))
  config.train.update(dict(steps=10, global_batch_size=2))
  return validate(config)


def make_run(workdir: Path, config, seed: int = 0, step: int = 1) -> Path:
  """A workdir holding one checkpoint of perturbed parameters; returns it."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  from diff_transformer.data import describe
  from diff_transformer.data.tokenizer import ByteTokenizer
  from diff_transformer.runs.checkpoint import Checkpointer
  from diff_transformer.mesh import make_mesh
  from diff_transformer.training.step import Trainer
  mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)),
                   devices=jax.devices()[:1])
  trainer = Trainer(config, mesh)
  state = trainer.init(seed)
  rng = np.random.default_rng(seed + 1)

  def perturb(path, x):
    name = jax.tree_util.keystr(path)
    std = 0.3 if ("scale" in name or "lambda" in name) else 0.05
    return (x + jnp.asarray(rng.normal(0, std, x.shape), x.dtype)).astype(x.dtype)

  state["params"] = jax.tree_util.tree_map_with_path(perturb, state["params"])
  workdir.mkdir(parents=True)
  (workdir / "config.json").write_text(config.to_json_best_effort(indent=2))
  (workdir / "tokenizer_record.json").write_text(json.dumps(describe(ByteTokenizer())))
  checkpointer = Checkpointer(workdir, config.train)
  checkpointer.save(step, state, None)
  checkpointer.close()
  return workdir


def restored(workdir: Path):
  from diff_transformer.runs.restore import restore_model
  return restore_model(workdir)[0]


def flat_params(model) -> dict[str, np.ndarray]:
  """The model's parameters by their dotted names (what export and import map)."""
  from flax import nnx
  from diff_transformer.tree import flatten
  params = nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1])
  return {k: np.asarray(v) for k, v in flatten(params).items()}


def random_tokens(batch: int, length: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 257, (batch, length)).astype(np.int64)
