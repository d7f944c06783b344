"""Bad configs fail before any work, with one line naming the field and the constraint."""
import os
import subprocess
import sys

import pytest

from configs import default, scaling
from diff_transformer.config import ConfigError, validate


def cfg(**model):
  c = default.get_config()
  for k, v in model.items():
    c.model[k] = v
  return c


@pytest.mark.parametrize("overrides,field,words", [
    (dict(num_heads=3), "model.head_dim", "must equal d_model"),
    (dict(head_dim=48), "model.head_dim", "must equal d_model"),
    (dict(variant="transformer", num_heads=8, head_dim=16, num_kv_heads=3), "model.num_kv_heads",
     "do not divide"),
    (dict(variant="diff", num_kv_heads=3), "model.num_kv_heads", "do not divide"),
    (dict(variant="shared_diff", rank=0), "model.rank", "must be in"),
    (dict(variant="shared_diff", rank=10_000), "model.rank", "must be in"),
    (dict(variant="nope"), "model.variant", "unknown variant"),
    (dict(kernel="cuda_magic"), "model.kernel", "unknown kernel"),
    (dict(layer_loop="loop"), "model.layer_loop", "not one of auto, scan, unroll"),
    (dict(d_model=0), "model.d_model", "positive"),
    (dict(num_layers=-1), "model.num_layers", "positive"),
    (dict(vocab_size=0), "model.vocab_size", "positive"),
    (dict(vocab_multiple=-128), "model.vocab_multiple", "must be >= 0"),
    (dict(variant="diff", head_norm=True), "model.head_norm", "an option of transformer, not of diff"),
    (dict(variant="transformer", num_heads=8, v2_lambda="none"), "model.v2_lambda",
     "an option of diff_v2, not of transformer"),
    (dict(variant="diff_v2", num_heads=8, rank=4), "model.rank",
     "an option of shared_diff, not of diff_v2"),
    (dict(variant="diff_v2", num_heads=8, v2_lambda="cosine"), "model.v2_lambda", "not one of"),
    (dict(variant="shared_diff", rank=4, lowrank_init="he"), "model.lowrank_init", "not one of"),
    (dict(lambda_init=1.5), "model.lambda_init", "must be in [0, 1)"),
    (dict(norm_out_scale="-0.2"), "model.norm_out_scale", "not a positive number"),
    (dict(norm_out_scale="nan"), "model.norm_out_scale", "not a positive number"),
    (dict(norm_out_scale="big"), "model.norm_out_scale", "rule, layer_rule"),
    (dict(variant="transformer", num_heads=8, head_norm=True, norm_out_scale="layer_rule"),
     "model.norm_out_scale", "one of rule here"),
    (dict(variant="diff_v2", num_heads=4, norm_out_scale="layer_rule"), "model.norm_out_scale",
     "one of rule here"),
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
  c.model.v2_pairing = "halves"
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
  """The section holds the keys every variant has, then each variant's own (its Options); a
  spec carries its own variant's options only, at the section's defaults."""
  import dataclasses

  import ml_collections

  from diff_transformer.config import base_config
  from diff_transformer.model.attention import VARIANTS, spec_from_config
  from diff_transformer.model.spec import ModelSpec
  section = base_config().model.to_dict()
  own = {f.name: f.default for cls in VARIANTS.values() for f in dataclasses.fields(cls.Options)}
  assert section == {f.name: f.default for f in ModelSpec.common_fields()} | own
  assert {"subln", "head_norm", "rank", "v2_lambda", "norm_out_scale"} <= set(own)
  for name, cls in VARIANTS.items():
    spec = spec_from_config(ml_collections.ConfigDict(dict(section, variant=name)))
    assert type(spec.options) is cls.Options
    assert dataclasses.asdict(spec.options) == {k: section[k] for k in
                                                dataclasses.asdict(spec.options)}
  with pytest.raises(ConfigError, match="model.num_head: unknown key"):
    spec_from_config(ml_collections.ConfigDict(dict(variant="diff", num_head=4)))


def test_an_option_changed_on_a_spec_stays_with_its_variant():
  from diff_transformer.model.attention import make_spec
  spec = make_spec(variant="diff", subln=False)
  changed = spec.replace(lambda_init=0.8, num_layers=3)
  assert (changed.options.lambda_init, changed.options.subln, changed.num_layers) == (0.8, False, 3)
  with pytest.raises(TypeError):
    spec.replace(head_norm=True)  # the transformer's
