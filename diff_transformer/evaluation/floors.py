"""Accuracy floors of the synthetic retrieval tasks: what a model scores with a shortcut.

Every asked item is answered by copying one stored value; a shortcut narrows the candidates and
guesses uniformly among them, so its expected accuracy on a query is 1 / |candidates|:

- random               every stored item.
- elimination          the stored items whose value was not revealed by an earlier query of the
                       row (each query `k .. v` shows its answer, so query r has N - r left).
- one_key              the stored items sharing ONE key token with the asked item (k1 or k2 of a
                       compositional MQAR triple; ka or kb of a needle), per query the better
                       of the two (the one leaving fewer candidates).
- one_key_elimination  both at once.

A task whose key is a single token (plain MQAR) has no partial key: there one_key equals random
and one_key_elimination equals elimination. Floors are computed on the very rows an accuracy is
measured on, so they are exact for them (no sampling error between floor and accuracy).
"""
from __future__ import annotations

import numpy as np

from diff_transformer.data import synthetic

KINDS = ("random", "elimination", "one_key", "one_key_elimination")


def item_parts(s: synthetic.TaskSpec, ex: dict) -> tuple[np.ndarray, np.ndarray]:
  """(key tokens [B, N, P], values [B, N]) of every stored item, indexed like ex["stored_at"]."""
  first = 1 if s.name == "needle" else 0  # a needle's key follows its NEEDLE mark
  b = np.arange(len(ex["seq"]))[:, None]
  keys = np.stack([ex["seq"][b, ex["stored_at"] + first + p]
                   for p in range(s.item_len - 1 - first)], axis=-1)
  return keys, ex["seq"][b, ex["stored_at"] + s.item_len - 1]


def row_floors(s: synthetic.TaskSpec, ex: dict) -> dict[str, float]:
  """{kind: expected accuracy} of each shortcut over the rows' asked items."""
  keys_BNP, _ = item_parts(s, ex)
  asked_BR = ex["asked"]
  B, N, P = keys_BNP.shape
  R = asked_BR.shape[1]
  b = np.arange(B)[:, None]
  # revealed_BRN[b, r, i]: item i was asked (its value shown) before query r.
  order_BN = np.full((B, N), R)
  order_BN[b, asked_BR] = np.arange(R)[None, :]
  revealed_BRN = order_BN[:, None, :] < np.arange(R)[None, :, None]
  out = dict(random=1.0 / N, elimination=float(np.mean(1.0 / (N - revealed_BRN.sum(-1)))))
  if P < 2:
    return dict(out, one_key=out["random"], one_key_elimination=out["elimination"])
  asked_keys_BRP = keys_BNP[b, asked_BR]
  same_PBRN = np.stack([keys_BNP[:, None, :, p] == asked_keys_BRP[:, :, None, p]
                        for p in range(P)])
  # Per query, the better key token (the one with fewer candidates left).
  one = np.max(1.0 / same_PBRN.sum(-1), axis=0)
  one_elim = np.max(1.0 / (same_PBRN & ~revealed_BRN).sum(-1), axis=0)
  return dict(out, one_key=float(one.mean()), one_key_elimination=float(one_elim.mean()))


def highest(floors: dict[str, float]) -> float:
  """The floor a result must clear: the best shortcut."""
  return max(floors[k] for k in KINDS)
