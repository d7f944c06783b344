"""--config.init_from_hf: a stock Llama / DiffLlama built locally from a config imports with equal
logits; wrong folders and shapes are one line each (that every exported case imports back bit for
bit is checked on test_hf_export.py's exports)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from diff_transformer import tree  # noqa: E402
from tests.helpers import hf_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_diff_without_sidecar_keeps_logits(tmp_path):
  """DiffLlama's own weights (no sidecar: the gain stays folded into o_proj) give the same model."""
  import jax.numpy as jnp
  from flax import nnx
  from diff_transformer.interop import weights
  from diff_transformer.interop.export import export_run
  from diff_transformer.interop.hf_import import import_params
  from diff_transformer.model import build_model
  workdir = hf_runs.make_run(tmp_path / "run", hf_runs.run_config("diff"))
  export_run(workdir, tmp_path / "hf")
  (tmp_path / "hf" / weights.SIDECAR).unlink()
  model = hf_runs.restored(workdir)
  imported = import_params(model.spec, tmp_path / "hf")
  assert np.all(imported["blocks.attn.subln_scale"] == 1.0)
  fresh = build_model(model.spec, nnx.Rngs(1))
  _, params, _ = nnx.split(fresh, nnx.Param, ...)
  nnx.replace_by_pure_dict(params, tree.unflatten(imported))
  nnx.update(fresh, params)
  tokens = jnp.asarray(hf_runs.random_tokens(2, 40))
  assert float(jnp.abs(fresh(tokens) - model(tokens)).max()) <= 1e-4


@pytest.mark.parametrize("arch,variant,tie", [("Llama", "transformer", True),
                                              ("DiffLlama", "diff", False)])
def test_stock_random_model_imports_with_equal_logits(tmp_path, arch, variant, tie):
  """A randomly initialised stock model (built here from a config, nothing downloaded) saved
  with save_pretrained and imported gives transformers' logits."""
  import jax.numpy as jnp
  import torch
  import transformers
  from flax import nnx
  from diff_transformer.interop import weights
  from diff_transformer.interop.hf_import import import_params
  from diff_transformer.model import build_model
  from diff_transformer.model.attention import spec_from_config
  config = hf_runs.run_config(variant, tie=tie)
  spec = spec_from_config(config.model)
  fields = weights.hf_config(spec, 256)
  fields.pop("architectures")
  torch.manual_seed(0)
  hf = getattr(transformers, f"{arch}ForCausalLM")(getattr(transformers, f"{arch}Config")(**fields))
  with torch.no_grad():  # move norm gains and lambdas off their init so mistakes show
    for name, p in hf.named_parameters():
      if "norm" in name or "lambda" in name:
        p.add_(0.3 * torch.randn_like(p))
  hf.eval().save_pretrained(tmp_path / "hf")
  model = build_model(spec, nnx.Rngs(1))
  _, params, _ = nnx.split(model, nnx.Param, ...)
  nnx.replace_by_pure_dict(params, tree.unflatten(import_params(spec, tmp_path / "hf")))
  nnx.update(model, params)
  tokens = hf_runs.random_tokens(2, 40)
  with torch.no_grad():
    theirs = hf(torch.from_numpy(tokens)).logits.numpy()
  mine = np.asarray(model(jnp.asarray(tokens)))
  diff = float(np.abs(mine - theirs).max())
  print(f"{arch} stock import: max |logit diff| {diff:.2e}")
  assert diff <= 1e-4


def test_bad_folders_and_shapes_are_one_line(tmp_path):
  from diff_transformer.interop import InteropError
  from diff_transformer.interop.export import export_run
  from diff_transformer.interop.hf_import import import_params
  from diff_transformer.model.attention import spec_from_config
  workdir = hf_runs.make_run(tmp_path / "run", hf_runs.run_config("transformer"))
  export_run(workdir, tmp_path / "hf")
  spec = lambda variant, **kw: spec_from_config(hf_runs.run_config(variant, **kw).model)
  (tmp_path / "empty").mkdir()
  cases = [
      (spec("transformer"), tmp_path / "nowhere", "is not a folder"),
      (spec("transformer"), tmp_path / "empty", "no config.json"),
      (spec("diff"), tmp_path / "hf", "model.variant"),
      (spec("transformer", gqa=False), tmp_path / "hf", "model.num_kv_heads"),
      (spec("transformer", ffn_dim=96), tmp_path / "hf", "model.ffn_dim"),
      (spec("transformer", tie=True), tmp_path / "hf", "model.tie_embeddings"),
  ]
  for s, folder, needle in cases:
    with pytest.raises(InteropError, match=needle) as e:
      import_params(s, folder)
    assert "\n" not in str(e.value)
  # A tensor whose shape disagrees with its own config.json.
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  from safetensors.numpy import load_file, save_file
  tensors = load_file(tmp_path / "hf" / "model.safetensors")
  tensors["model.norm.weight"] = tensors["model.norm.weight"][:-1]
  save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(InteropError, match="model.norm.weight has shape"):
    import_params(spec("transformer"), tmp_path / "hf")
  del cfg


def test_train_starts_from_hf_folder(tmp_path):
  """Training with init_from_hf=DIR and train.steps=0 writes the imported weights as checkpoint
  step 0 (what eval.py then reads); a wrong folder is one line (in this process: train.py
  prints such a line alone, tests/test_damaged_files.py)."""
  from tests.helpers.runs import refused_here, train_here, write_corpus
  from diff_transformer.data import prepare_files
  from diff_transformer.interop.export import export_run
  write_corpus(tmp_path / "corpus", docs=6)
  prepare_files([tmp_path / "corpus"], tmp_path / "data", tokenizer="byte", progress=False)
  config = hf_runs.run_config("diff")
  workdir = hf_runs.make_run(tmp_path / "src", config)
  export_run(workdir, tmp_path / "hf")
  overrides = {"model.variant": "diff", "model.num_layers": 3, "model.num_heads": 2,
               "model.num_kv_heads": 1, "model.max_seq_len": 64,
               "model.vocab_size": hf_runs.VOCAB, "train.steps": 0}
  refused_here(tmp_path / "new", tmp_path / "data", ("init_from_hf",),
               init_from_hf=str(tmp_path / "run"), **overrides)
  train_here(tmp_path / "new", tmp_path / "data", init_from_hf=str(tmp_path / "hf"), **overrides)
  imported = hf_runs.flat_params(hf_runs.restored(tmp_path / "new"))
  original = hf_runs.flat_params(hf_runs.restored(workdir))
  assert all(np.array_equal(imported[k], original[k]) for k in original)
