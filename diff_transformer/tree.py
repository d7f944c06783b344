"""Nested dicts <-> flat dicts of dotted paths: config fields ("model.d_model") and parameter
paths ("blocks.attn.wq.kernel") use the one pair."""
from __future__ import annotations

from typing import Any


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def unflatten(flat: dict[str, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree
