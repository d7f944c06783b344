"""A fifth variant defined outside the package (tests/helpers/toy_variant.py): registering it is all
it takes to build its presets, check its config, train, checkpoint and resume, evaluate, and count
its parameters and FLOPs. The run records it as module:Class, so a fresh process restores it; what
it cannot do (export) is refused in one line; the test table, the sweeps and the studies do not take
it silently."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import variant_table
from configs import scaling, synthetic
from diff_transformer import params
from diff_transformer.config import ConfigError, validate
from diff_transformer.evaluation import Settings, evaluate
from diff_transformer.interop import InteropError
from diff_transformer.model.attention import (PAPER_VARIANTS, VARIANTS, Attention,
                                              register_variant, unregister_variant, variant_class)
from diff_transformer.model.attention import spec_from_config
from diff_transformer.study import Study
from diff_transformer.sweeps.definition import Sweep
from diff_transformer.interop.export import export_run
from diff_transformer.training import train
from diff_transformer.training.metrics import attention_flops_per_token
from tests.helpers.toy_variant import FIXED_LAMBDA, TOY_PATH, FixedLambdaAttention

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy_variant():
  register_variant("fixed_lambda", FixedLambdaAttention)
  yield "fixed_lambda"
  unregister_variant("fixed_lambda")
  unregister_variant(TOY_PATH)


def test_a_registered_variant_runs_everywhere(toy_variant, tmp_path):
  config = synthetic.get_config(f"{toy_variant}-mqar_plain")  # the presets ask the registry
  t = config.train
  t.steps, t.global_batch_size, t.checkpoint_every, t.eval_every = 4, 8, 2, 4
  t.log_every, t.eval_batches = 1, 1
  config.model.fixed_lambda.fixed_lambda = 0.5  # its own knob: its section, once registered
  spec = spec_from_config(validate(config).model)
  assert spec.options.fixed_lambda == 0.5
  assert spec.num_heads == spec.d_model // spec.head_dim  # the base class's head rule

  counts = params.count(spec)
  D, N, K, H = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
  assert counts["modules"]["blocks.attn"] == spec.num_layers * (
      D * (2 * N * H + 3 * K * H + N * H) + N * H)  # + the gain on the merged heads
  T = config.data.seq_len
  assert attention_flops_per_token(spec, T) == 0.5 * spec.num_layers * 2 * (2 * T * N * H * 2)

  workdir = tmp_path / "run"
  before = config.to_json()
  first = train(config, workdir)
  assert first["step"] == 4 and first["stopped_by"] is None
  assert config.to_json() == before  # the run records module:Class in its own copy
  t.steps = 6
  resumed = train(config, workdir)  # restores checkpoint step 4 and trains on
  assert resumed["step"] == 6
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  train_steps = [r["step"] for r in rows if r["kind"] == "train"]
  assert train_steps == [1, 2, 3, 4, 5, 6]  # the resumed run started at step 5
  lambdas = [r["lambda/l0"] for r in rows if r["kind"] == "train"]
  assert lambdas == [0.5] * 6  # the variant's metrics hook, logged per layer

  # The run is recorded as module:Class, so it restores where nothing was registered.
  recorded = json.loads((workdir / "config.json").read_text())["model"]["variant"]
  assert recorded == TOY_PATH
  unregister_variant(toy_variant)
  unregister_variant(TOY_PATH)
  results = evaluate(workdir, ["task", "attention"], settings=Settings.for_mode(quick=True))
  assert results["attention"]["map"] == "A1 - fixed lambda A2"
  assert results["task"]["step"] == 6 and 0.0 <= results["task"]["accuracy"] <= 1.0
  shutil.rmtree(workdir / "eval")
  proc = subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", "--suites=task",
                         "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                            [str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")])))
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads((workdir / "eval" / "task.json").read_text())["step"] == 6

  # What has no Hugging Face class is refused in one line before any checkpoint is read.
  with pytest.raises(InteropError, match=rf"^model.variant: '{TOY_PATH}' has no Hugging Face"):
    export_run(workdir, tmp_path / "hf")
  assert not (tmp_path / "hf").exists()


def test_an_unregistered_variant_is_one_config_error(toy_variant):
  config = synthetic.get_config(f"{toy_variant}-mqar_plain")
  unregister_variant(toy_variant)
  with pytest.raises(ConfigError, match="model.variant: unknown variant 'fixed_lambda'"):
    validate(config)


def test_a_variants_own_option_is_a_model_key_while_it_is_registered(toy_variant):
  """Its Options are the variant's own keys, its section model.<variant>.*: in the model section
  with their default, checked in one line, and gone when the variant is."""
  from diff_transformer.config import base_config
  config = synthetic.get_config(f"{toy_variant}-mqar_plain")
  assert config.model.fixed_lambda.fixed_lambda == FIXED_LAMBDA
  config.model.fixed_lambda.fixed_lambda = 1.5
  with pytest.raises(ConfigError,
                     match=r"^model.fixed_lambda.fixed_lambda: must be in \[0, 1\), got 1.5$"):
    validate(config)
  diff = synthetic.get_config("diff-mqar_plain")
  diff.model.fixed_lambda.fixed_lambda = 0.5
  with pytest.raises(ConfigError, match="^model.fixed_lambda.fixed_lambda: an option of "
                                        "fixed_lambda, not of diff"):
    validate(diff)
  unregister_variant(toy_variant)
  assert "fixed_lambda" not in base_config().model


def test_a_variant_name_is_registered_once(toy_variant):
  with pytest.raises(ValueError, match="already registered"):
    register_variant(toy_variant, Attention)


def test_a_variant_named_as_module_class_needs_no_registering():
  assert TOY_PATH not in VARIANTS
  try:
    assert variant_class(TOY_PATH) is FixedLambdaAttention
  finally:
    unregister_variant(TOY_PATH)
  for name, needle in (("tests.helpers.toy_variant:Nope",
                        "cannot import 'tests.helpers.toy_variant:Nope'"),
                       ("no_such_module:X", "cannot import 'no_such_module:X'"),
                       ("os.path:join", "'os.path:join' is not an Attention subclass")):
    with pytest.raises(ConfigError, match=f"^model.variant: {needle}"):
      variant_class(name)


def test_the_test_table_asks_for_the_new_variant(toy_variant):
  with pytest.raises(pytest.fail.Exception,
                     match="add variant fixed_lambda to tests/helpers/variant_table.py TABLE"):
    variant_table.entry(toy_variant)


def test_presets_sweeps_and_studies_list_the_papers_variants_only(toy_variant):
  presets = scaling.preset_names() + synthetic.preset_names()
  assert not any(n.startswith(toy_variant) for n in presets)
  make = lambda v: synthetic.get_config(f"{v}-mqar_plain")
  sweep, study = Sweep("s", sizes={"x": make}, budgets={"1": 1}), Study(name="s", make=make)
  assert sweep.variants == study.variants == PAPER_VARIANTS
  # Listed by name, it is taken; an unknown name is refused before anything runs.
  assert Sweep("s", sizes=sweep.sizes, budgets={"1": 1}, variants=(toy_variant,)).validate()
  with pytest.raises(ConfigError, match="unknown variant"):
    Sweep("s", sizes=sweep.sizes, budgets={"1": 1}, variants=("fixed_lambdaa",)).validate()


def test_the_lm_eval_adapter_restores_a_module_class_run(tmp_path):
  pytest.importorskip("lm_eval")
  from diff_transformer.lm_eval.model import DiffTransformerLM
  from tests.helpers import hf_runs
  config = hf_runs.run_config("transformer")  # its 4 heads over 2 kv heads fit the toy too
  config.model.variant = TOY_PATH
  validate(config)
  workdir = hf_runs.make_run(tmp_path / "run", config)
  unregister_variant(TOY_PATH)
  lm = DiffTransformerLM(str(workdir), batch_size=2)
  assert type(lm.fns.model.blocks.attn).__name__ == "FixedLambdaAttention"


def test_a_variants_keys_never_clash_with_anothers():
  """Each variant's own keys sit in its own section: a variant may name its options as another
  variant does, with other defaults, and each run reads its own; only a name that is a key every
  variant has is refused as a variant's name."""
  import dataclasses
  from tests.helpers.toy_variant import FixedLambdaOptions
  options = dataclasses.make_dataclass("OwnOptions", [("subln", bool, False)],
                                       bases=(FixedLambdaOptions,), frozen=True)
  own = type("OwnAttention", (FixedLambdaAttention,), {"Options": options})
  with pytest.raises(ValueError, match="model.d_model is a key every variant has"):
    register_variant("d_model", own)
  register_variant("own", own)
  try:
    config = synthetic.get_config("own-mqar_plain")
    assert config.model.own.subln is False and config.model.diff.subln is True
    assert spec_from_config(validate(config).model).options.subln is False
  finally:
    unregister_variant("own")


def test_a_misspelled_knob_is_a_type_error(tmp_path):
  """A variant's own options are typed (Attention[DiffOptions], ModelSpec[DiffOptions]): reading
  a knob the Options lack is a mypy error naming the knob, before anything runs."""
  source = tmp_path / "tempered.py"
  source.write_text(
      "from diff_transformer.model.attention.diff_v1 import DiffAttention, DiffOptions\n\n\n"
      "class Tempered(DiffAttention[DiffOptions]):\n"
      "  def scale(self) -> float:\n"
      "    return self.spec.options.lambda_inti or self.spec.options.lambda_std\n")
  root = Path(__file__).resolve().parents[1]
  proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(root / "mypy.ini"),
                         str(source)], cwd=root, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1, proc.stdout
  assert '"DiffOptions" has no attribute "lambda_inti"' in proc.stdout
  assert proc.stdout.count("error:") == 1  # lambda_std, a real knob, passes
