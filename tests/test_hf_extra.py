"""What works without the hf extra: its absence is one line naming the install command, and the
init_from_hf config rules."""
from __future__ import annotations

import pytest

from diff_transformer.config import ConfigError, base_config, validate
from diff_transformer.interop import InteropError, require


def test_missing_extra_is_one_line():
  with pytest.raises(InteropError) as e:
    require("safetensors", "no_such_module_for_the_hf_extra")
  assert "no_such_module_for_the_hf_extra" in str(e.value)
  assert 'pip install -e ".[hf]"' in str(e.value) and "\n" not in str(e.value)


def test_zero_steps_only_with_init_from_hf():
  config = base_config()
  config.train.steps = 0
  with pytest.raises(ConfigError, match="train.steps"):
    validate(config)
  config.init_from_hf = "some/folder"
  validate(config)
