"""A study's point names and overrides as text: `<variant>-lr<lr>-s<seed>` numbers, `--set
key=value` pairs, setting a dotted config key, and override values by size (study/definition.py
uses them)."""
from __future__ import annotations

import ast
from typing import NamedTuple

import ml_collections

from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import nested_key


class BySize(NamedTuple):
  """A derived cell's override value that depends on the study's size, e.g. a head count at a
  fixed head width: BySize((("128", 2), ("256", 4), ("512", 8)))."""
  values: tuple[tuple[str, object], ...]

  def at(self, size: str):
    return dict(self.values)[size]


def at_lr(train: ml_collections.ConfigDict, lr: float) -> None:
  train.final_lr, train.lr = train.final_lr / train.lr * lr, lr  # keep the preset's decay ratio


def number(text: str, kind: type) -> tuple | None:
  """(value,) when text is a non-negative `kind` (a seed, or a positive lr), else None."""
  try:
    value = kind(text)
  except ValueError:
    return None
  return (value,) if value >= 0 and (kind is int or value > 0) else None


def parse_set(text: str) -> tuple[str, object]:
  key, sep, raw = text.partition("=")
  if not sep or not key.strip():
    raise ConfigError(f"--set: '{text}' is not key=value (e.g. data.task.num_keys=5)")
  try:
    value = ast.literal_eval(raw)
  except (ValueError, SyntaxError):
    value = raw  # a bare string (e.g. a variant or tokenizer name)
  return key.strip(), value


def set_key(config: ml_collections.ConfigDict, key: str, value) -> None:
  """Sets a dotted key; model.<option> names the option of the config's variant
  (model.<variant>.<option>), so one key serves cells of several variants."""
  own = nested_key(key, config.model.variant)
  if own is None:
    raise ConfigError(f"study override '{key}': not an option of {config.model.variant}")
  *path, last = own.split(".")
  node = config
  for part in path:
    if part not in node or not isinstance(node[part], ml_collections.ConfigDict):
      raise ConfigError(f"study override '{key}': unknown config key")
    node = node[part]
  if last not in node:
    raise ConfigError(f"study override '{key}': unknown config key")
  try:
    node[last] = value
  except TypeError as e:
    raise ConfigError(f"study override '{key}': {e}") from None
