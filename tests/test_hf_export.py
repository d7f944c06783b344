"""export.py: every variant (MHA and GQA, tied and untied) loads in transformers with equal logits
(<= 1e-4, float32) and equal greedy generations, and imports back bit for bit; what a target
cannot hold is refused in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tests.helpers import hf_runs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = [  # (variant, gqa, tie, extra model fields)
    ("transformer", True, False, {}),
    ("transformer", False, True, {}),
    ("transformer", True, False, {"rope_pairs": "half"}),
    ("diff", True, True, {}),
    ("diff", False, False, {"dtype": "bfloat16"}),
    ("shared_diff", True, False, {}),
    ("shared_diff", False, True, {"norm_out_scale": "0.3"}),  # folded into o_proj per layer
    ("diff_v2", True, False, {}),
    ("diff_v2", False, True, {}),
    # a fixed multiplier before W_O on heads without a norm: folded into o_proj
    ("transformer", False, False, {"norm_out_scale": "0.7"}),
    ("diff_v2", True, False, {"norm_out_scale": "0.6"}),
]
MAX_DIFF: dict[str, float] = {}


def _id(case) -> str:
  variant, gqa, tie, extra = case
  return "-".join([variant, "gqa" if gqa else "mha", "tied" if tie else "untied",
                   *map(str, extra.values())])


@pytest.fixture(scope="module", params=CASES, ids=_id)
def exported(request, tmp_path_factory):
  """(case, HF folder, the run's restored model)."""
  from diff_transformer.interop.export import export_run
  variant, gqa, tie, extra = request.param
  tmp = tmp_path_factory.mktemp(_id(request.param))
  workdir = hf_runs.make_run(tmp / "run", hf_runs.run_config(variant, gqa=gqa, tie=tie, **extra))
  export_run(workdir, tmp / "hf")
  return request.param, tmp / "hf", hf_runs.restored(workdir)


def _float32(model):
  """The model computing in float32 (a bfloat16 run's float32 master weights): its state merged
  into the float32 spec's graph (abstract: nothing is initialised twice)."""
  import dataclasses
  from flax import nnx
  from diff_transformer.params import abstract_model
  graphdef, _ = nnx.split(abstract_model(dataclasses.replace(model.spec, dtype="float32")))
  return nnx.merge(graphdef, nnx.state(model))


def test_logits_and_greedy_generation_match(exported):
  import jax.numpy as jnp
  import torch
  import transformers
  from diff_transformer.data.tokenizer import ByteTokenizer
  from diff_transformer.evaluation import decoding
  from diff_transformer.evaluation.common import Fns
  (variant, _, tie, _), out, model = exported
  hf = transformers.AutoModelForCausalLM.from_pretrained(
      out, dtype=torch.float32, trust_remote_code=variant == "diff_v2").eval()
  expected = {"transformer": "LlamaForCausalLM", "diff_v2": "DiffV2ForCausalLM"}.get(
      variant, "DiffLlamaForCausalLM")
  assert type(hf).__name__ == expected
  assert hf.config.tie_word_embeddings == tie
  ours = _float32(model)
  tokens = hf_runs.random_tokens(3, 48)
  with torch.no_grad():
    theirs = hf(torch.from_numpy(tokens)).logits.numpy()
  mine = np.asarray(ours(jnp.asarray(tokens)))
  diff = float(np.abs(mine - theirs).max())
  MAX_DIFF[_id(exported[0])] = diff
  print(f"{_id(exported[0])}: max |logit diff| {diff:.2e}")
  assert diff <= 1e-4
  prompts = hf_runs.random_tokens(2, 8, seed=1)
  with torch.no_grad():
    gen = hf.generate(torch.from_numpy(prompts), max_new_tokens=32, do_sample=False,
                      min_new_tokens=32, output_logits=True, return_dict_in_generate=True)
    # generate's logits come one token at a time off the KV cache: they must be the full
    # forward's over the same tokens (a cache left unfilled or misplaced fails here, by name).
    cached = torch.stack(gen.logits, 1).numpy()
    full = hf(gen.sequences).logits[:, prompts.shape[1] - 1:-1].numpy()
  cache_diff = float(np.abs(cached - full).max())
  assert cache_diff <= 1e-4, f"cached decoding is off the full forward by {cache_diff:.2e}"
  hf_out = gen.sequences[:, prompts.shape[1]:].numpy()
  mine = decoding.generate(Fns(ours), prompts.tolist(), 32, num_ids=ByteTokenizer.vocab_size)
  assert hf_out.tolist() == mine  # neither picks the padded rows 257..263


def test_tokenizer_and_generation_config(exported):
  import transformers
  from diff_transformer.data.tokenizer import ByteTokenizer
  (variant, _, _, _), out, _ = exported
  tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=variant == "diff_v2")
  text = "Exported: héllo wörld\n\t🙂"
  assert tok(text)["input_ids"] == ByteTokenizer().encode(text)
  assert tok.decode(tok(text)["input_ids"]) == text
  gen = transformers.GenerationConfig.from_pretrained(out)
  assert gen.eos_token_id == ByteTokenizer.eot_id == tok.eos_token_id
  padded = list(range(ByteTokenizer.vocab_size, hf_runs.VOCAB))  # rows no byte id reaches
  assert gen.suppress_tokens == padded and len(padded) == 7


def test_export_imports_back_bitwise(exported):
  """--config.init_from_hf of an export gives the run's parameters exactly (dtype included)."""
  from diff_transformer.interop.hf_import import import_params
  _, out, model = exported
  original = hf_runs.flat_params(model)
  imported = import_params(model.spec, out)
  assert set(imported) == set(original)
  for name, value in original.items():
    assert imported[name].dtype == value.dtype and np.array_equal(imported[name], value), name


@pytest.mark.parametrize("field,value,needle", [
    ("subln", False, "model.diff.subln"),
    ("lambda_init", 0.8, "model.diff.lambda_init"),
    ("norm_out_scale", "layer_rule", "model.diff.norm_out_scale"),
    ("v2_pairing", "halves", "model.diff_v2.v2_pairing"),
    ("v2_lambda", "none", "model.diff_v2.v2_lambda"),
    ("short_conv", 4, "model.short_conv"),
    ("head_norm", True, "model.transformer.head_norm"),
])
def test_refuses_what_the_target_cannot_hold(tmp_path, field, value, needle):
  from diff_transformer.interop import InteropError
  from diff_transformer.interop.export import export_run
  variant = ("diff_v2" if field.startswith("v2_")
             else "transformer" if field == "head_norm" else "diff")
  config = hf_runs.run_config(variant, **{field: value})
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(config.to_json_best_effort())
  (workdir / "tokenizer_record.json").write_text('{"name": "byte", "vocab_size": 257}')
  with pytest.raises(InteropError, match=needle) as e:
    export_run(workdir, tmp_path / "hf")
  assert "\n" not in str(e.value)
  assert not (tmp_path / "hf").exists()


def test_cli_exports_and_bad_inputs_are_one_line(tmp_path):
  import os
  from diff_transformer.errors import UserError, message_lines
  from diff_transformer.interop import InteropError
  from diff_transformer.interop.export import export_run
  workdir = hf_runs.make_run(tmp_path / "run", hf_runs.run_config("transformer"))
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
  export = lambda *args: subprocess.run([sys.executable, str(ROOT / "export.py"), *args],
                                        cwd=ROOT, env=env, capture_output=True, text=True,
                                        timeout=300)
  ok = export(f"--workdir={workdir}", f"--out={tmp_path / 'hf'}")
  assert ok.returncode == 0, ok.stderr
  assert (tmp_path / "hf" / "model.safetensors").is_file()
  # export_run's refusals (the checkpoint restore's among them) are one line naming the flag;
  # export.py prints such a line alone (tests/test_reliability.py starts it on bad input).
  with pytest.raises(UserError, match="no checkpoint for step 7") as e:
    export_run(workdir, tmp_path / "y", step=7)
  assert len(message_lines(e.value)) == 1
  for args, needle in [((tmp_path, tmp_path / "x"), "--workdir: .* not a training workdir"),
                       ((workdir, tmp_path / "hf"), "--out: .* is not an empty folder")]:
    with pytest.raises(InteropError, match=needle) as e:
      export_run(*args)
    assert "\n" not in str(e.value)


def test_users_tokenizer_file_is_exported(tmp_path):
  """A run on a user's tokenizers file (prepare_data.py --tokenizer_file) exports that file, with
  its own end-of-text token as EOS."""
  import json
  import transformers
  from diff_transformer.data import describe
  from diff_transformer.data.tokenizer import FileTokenizer
  from diff_transformer.interop import InteropError
  from diff_transformer.interop.export import export_run
  from tests.helpers.tokenizers import user_tokenizer  # needs `tokenizers` (the hf extra)
  workdir = hf_runs.make_run(tmp_path / "run", hf_runs.run_config("diff", vocab_size=384))
  user = user_tokenizer(workdir / "tokenizer.json", ["the king and the sea, a letter"] * 20)
  tok = FileTokenizer.from_file(user)
  (workdir / "tokenizer_record.json").write_text(json.dumps(describe(tok)))
  export_run(workdir, tmp_path / "hf")
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  text = "the sea king wrote a letter"
  assert hf_tok(text)["input_ids"] == tok.encode(text)
  assert hf_tok.eos_token == "</s>" and hf_tok.eos_token_id == tok.eot_id
  # A tokenizer with more ids than the model has rows cannot come from a run: refused.
  hf_runs.make_run(tmp_path / "small", hf_runs.run_config("diff"))
  (tmp_path / "small" / "tokenizer_record.json").write_text(json.dumps(describe(tok)))
  with pytest.raises(InteropError, match=r"277 ids exceed model.vocab_size 264"):
    export_run(tmp_path / "small", tmp_path / "hf2")
