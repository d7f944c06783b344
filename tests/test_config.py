"""Bad configs fail before any work, with one line naming the field and the constraint."""
import os
import subprocess
import sys

import pytest

from configs import default, scaling
from diff_transformer.config import ConfigError, validate


def cfg(**model):
  """The default config with model keys set; a variant's own options as <variant>__<option>."""
  c = default.get_config()
  for k, v in model.items():
    section, _, option = k.partition("__")
    if option:
      c.model[section][option] = v
    else:
      c.model[k] = v
  return c


@pytest.mark.parametrize("overrides,field,words", [
    (dict(num_heads=3), "model.head_dim", "must equal d_model"),
    (dict(head_dim=48), "model.head_dim", "must equal d_model"),
    (dict(variant="transformer", num_heads=8, head_dim=16, num_kv_heads=3), "model.num_kv_heads",
     "do not divide"),
    (dict(variant="diff", num_kv_heads=3), "model.num_kv_heads", "do not divide"),
    (dict(variant="shared_diff", shared_diff__rank=0), "model.shared_diff.rank", "must be in"),
    (dict(variant="shared_diff", shared_diff__rank=10_000), "model.shared_diff.rank",
     "must be in"),
    (dict(variant="nope"), "model.variant", "unknown variant"),
    (dict(kernel="cuda_magic"), "model.kernel", "unknown kernel"),
    (dict(layer_loop="loop"), "model.layer_loop", "not one of auto, scan, unroll"),
    (dict(d_model=0), "model.d_model", "positive"),
    (dict(num_layers=-1), "model.num_layers", "positive"),
    (dict(vocab_size=0), "model.vocab_size", "positive"),
    (dict(vocab_multiple=-128), "model.vocab_multiple", "must be >= 0"),
    (dict(variant="diff", transformer__head_norm=True), "model.transformer.head_norm",
     "an option of transformer, not of diff"),
    (dict(variant="transformer", num_heads=8, diff_v2__v2_lambda="none"),
     "model.diff_v2.v2_lambda", "an option of diff_v2, not of transformer"),
    (dict(variant="diff_v2", num_heads=8, shared_diff__rank=4), "model.shared_diff.rank",
     "an option of shared_diff, not of diff_v2"),
    (dict(variant="diff_v2", num_heads=8, diff_v2__v2_lambda="cosine"), "model.diff_v2.v2_lambda",
     "not one of"),
    (dict(variant="shared_diff", shared_diff__rank=4, shared_diff__lowrank_init="he"),
     "model.shared_diff.lowrank_init", "not one of"),
    (dict(diff__lambda_init=1.5), "model.diff.lambda_init", "must be in [0, 1)"),
    (dict(diff__norm_out_scale="-0.2"), "model.diff.norm_out_scale", "not a positive number"),
    (dict(diff__norm_out_scale="nan"), "model.diff.norm_out_scale", "not a positive number"),
    (dict(diff__norm_out_scale="big"), "model.diff.norm_out_scale", "rule, layer_rule"),
    (dict(variant="transformer", num_heads=8, transformer__head_norm=True,
          transformer__norm_out_scale="layer_rule"),
     "model.transformer.norm_out_scale", "one of rule here"),
    (dict(variant="diff_v2", num_heads=4, diff_v2__norm_out_scale="layer_rule"),
     "model.diff_v2.norm_out_scale", "one of rule here"),
])
def test_bad_model_configs(overrides, field, words):
  with pytest.raises(ConfigError) as e:
    validate(cfg(**overrides))
  message = str(e.value)
  assert message.startswith(field) and words in message and "\n" not in message


@pytest.mark.parametrize("variant, heads", [("transformer", 8), ("diff_v2", 8), ("diff", 4)])
def test_switching_the_variant_names_the_head_count_that_keeps_the_match(variant, heads):
  """The default is DIFF V1 with 4 differential heads of d=32 at D=256; another variant at the
  same d needs its own head count (the papers' parameter-matched rule), and the error says it."""
  c = cfg(variant=variant, num_heads=2 if variant == "diff" else 4)
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert f"set --config.model.num_heads={heads}" in str(e.value), str(e.value)
  validate(cfg(variant=variant, num_heads=heads))  # the named fix is valid


def test_diff_v2_pairs_crossing_groups_rejected_unless_halves():
  c = cfg(variant="diff_v2", num_heads=8, head_dim=32, num_kv_heads=16)
  with pytest.raises(ConfigError, match="model.num_kv_heads: 2h / h_kv = 1 .* must be even"):
    validate(c)  # 16 query heads over 16 kv heads: pair (2j, 2j+1) would use two kv heads
  c.model.diff_v2.v2_pairing = "halves"
  validate(c)


def test_mistyped_key_in_python_and_on_the_command_line():
  c = default.get_config()
  c.unlock()
  c.model.num_layer = 3
  with pytest.raises(ConfigError, match="model.num_layer: unknown key"):
    validate(c)
  out = subprocess.run([sys.executable, "train.py", "--config.model.num_layer=3", "--dry_run"],
                       capture_output=True, text=True,
                       env={"JAX_PLATFORMS": "cpu", "PATH": "",
                            "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1].startswith("error: unknown config key")


def test_every_preset_validates_and_names_its_source():
  for name in scaling.preset_names():
    c = validate(scaling.get_config(name))
    assert c.source and c.model.vocab_multiple == 128  # a run pads its tokenizer's ids
  with pytest.raises(ValueError, match="unknown preset"):
    scaling.get_config("diff-9b")


def test_model_section_is_built_from_the_model_spec_and_each_variants_options():
  """The section holds the keys every variant has, then a section per variant with its own keys
  (its Options); a spec carries its own variant's options, read from its section alone."""
  import dataclasses

  import ml_collections

  from diff_transformer.config import base_config
  from diff_transformer.model.attention import VARIANTS, spec_from_config
  from diff_transformer.model.spec import ModelSpec
  model = base_config().model.to_dict()
  sections = {name: {f.name: f.default for f in dataclasses.fields(cls.Options)}
              for name, cls in VARIANTS.items()}
  assert model == {f.name: f.default for f in ModelSpec.common_fields()} | sections
  assert {"subln", "lambda_init", "norm_out_scale"} <= set(sections["diff"])
  assert set(sections["transformer"]) == {"norm_out_scale", "head_norm"}
  for name, cls in VARIANTS.items():
    mine = ml_collections.ConfigDict(dict(model, variant=name))
    other = next(n for n in VARIANTS if n != name)
    mine[other]["norm_out_scale"] = "0.5"  # another variant's section: not read
    mine[name]["norm_out_scale"] = "0.25"
    spec = spec_from_config(mine)
    assert type(spec.options) is cls.Options and spec.options.norm_out_scale == "0.25"
  with pytest.raises(ConfigError, match="model.num_head: not a key"):
    spec_from_config(ml_collections.ConfigDict(dict(variant="diff", num_head=4)))


def test_flat_names_of_older_records_read_as_their_variants_own():
  """Records and configs from before the sections named a variant's options flat: one table
  reads them in today's names, the options of other variants (at their defaults) dropped."""
  from diff_transformer.model.attention import nested, nested_key
  old = {"model.variant": "shared_diff", "model.rank": 16, "model.subln": True,
         "model.head_norm": False, "model.v2_lambda": "sigmoid", "model.d_model": 128,
         "train.lr": 1e-3}
  assert nested(old) == {"model.variant": "shared_diff", "model.shared_diff.rank": 16,
                         "model.shared_diff.subln": True, "model.d_model": 128, "train.lr": 1e-3}
  assert nested_key("model.norm_out_scale", "transformer") == "model.transformer.norm_out_scale"
  assert nested_key("model.rank", "diff") is None
  assert nested_key("model.diff.subln", "diff") == "model.diff.subln"
  assert nested({"model.variant": "diff", "model.diff.subln": False,
                 "model.transformer.head_norm": False}) == {"model.variant": "diff",
                                                             "model.diff.subln": False}


def test_an_option_changed_on_a_spec_stays_with_its_variant():
  from diff_transformer.model.attention import make_spec
  spec = make_spec(variant="diff", subln=False)
  changed = spec.replace(lambda_init=0.8, num_layers=3)
  assert (changed.options.lambda_init, changed.options.subln, changed.num_layers) == (0.8, False, 3)
  with pytest.raises(TypeError):
    spec.replace(head_norm=True)  # the transformer's
