"""Activation outliers (DIFF Table 5): the k-th largest |value| (k = 1, 2, 3, 10, 100), the
median and the root mean square of |attention logits| and |hidden states| over a validation
batch, per layer and overall.

Attention logits are the scaled scores q.k / sqrt(d) entering the softmax, over the (query, key)
pairs the mask allows (causal, same document), for both maps of the differential variants.
Hidden states are each layer's input residual stream (layer 0: the embeddings) and the final
residual stream before the last RMSNorm, at non-padding tokens.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from diff_transformer.evaluation import common
from diff_transformer.model import build_model

RANKS = (1, 2, 3, 10, 100)


def stats(values: np.ndarray) -> dict[str, float]:
  """k-th largest |value| for k in RANKS (nan when there are fewer values), the median and the
  root mean square (the scale of the values; their std for zero-mean ones)."""
  flat = np.abs(np.asarray(values, np.float64).ravel())
  out = {}
  for k in RANKS:
    out[f"top{k}"] = float(np.partition(flat, flat.size - k)[flat.size - k]) if flat.size >= k \
        else float("nan")
  out["median"] = float(np.median(flat))
  out["rms"] = float(np.sqrt(np.mean(flat * flat)))
  return out


def _logits(q_BTNH, k_BSKH, valid_BTS) -> np.ndarray:
  group = q_BTNH.shape[2] // k_BSKH.shape[2]
  k_BSNH = jnp.repeat(k_BSKH, group, axis=2)
  logits = jnp.einsum("btnh,bsnh->bnts", q_BTNH.astype(jnp.float32),
                      k_BSNH.astype(jnp.float32)) / np.sqrt(q_BTNH.shape[-1])
  return np.asarray(logits)[np.broadcast_to(valid_BTS[:, None], logits.shape)]


def layer_logits(fns: common.Fns, layer: int, attn_in_BTD, positions_BT, valid_BTS) -> np.ndarray:
  """Valid attention logits of one layer (both maps for differential variants), flattened."""
  p = fns.layer_project(layer, attn_in_BTD, positions_BT)
  parts = [_logits(p.q1, p.k1, valid_BTS)]
  if p.q2 is not None:
    parts.append(_logits(p.q2, p.k1 if p.k2 is None else p.k2, valid_BTS))
  return np.concatenate(parts)


def analyse(fns: common.Fns, batch: dict) -> dict:
  seg = np.asarray(batch["segment_ids"])
  positions = jnp.asarray(batch["positions"])
  logits, aux = fns.capture(batch["inputs"], positions, seg)
  del logits
  t = np.arange(seg.shape[1])
  valid_BTS = (t[None, :, None] >= t[None, None, :]) & (seg[:, :, None] == seg[:, None, :]) & (
      seg[:, :, None] > 0)
  tokens_BT = seg > 0
  hidden = np.asarray(aux["hidden"])  # [L, B, T, D]: each layer's input
  last = fns.spec.num_layers - 1  # its output is the residual stream entering the final norm
  final = np.asarray(fns.layer_output(last, aux["hidden"][last], positions, seg))
  per_layer, all_logits, all_hidden = {}, [], []
  for l in range(hidden.shape[0]):
    lg = layer_logits(fns, l, aux["attn_in"][l], positions, valid_BTS)
    hs = hidden[l][tokens_BT]
    per_layer[f"layer_{l}"] = dict(attention_logits=stats(lg), hidden_states=stats(hs))
    all_logits.append(lg)
    all_hidden.append(hs.ravel())
  all_hidden.append(final[tokens_BT].ravel())
  per_layer["final"] = dict(hidden_states=stats(final[tokens_BT]))
  return dict(overall=dict(attention_logits=stats(np.concatenate(all_logits)),
                           hidden_states=stats(np.concatenate(all_hidden))),
              per_layer=per_layer, tokens=int(tokens_BT.sum()))


def run(fns: common.Fns, batch: dict, settings, out_dir) -> dict:
  del settings, out_dir
  result = analyse(fns, batch)
  result["definition"] = ("k-th largest |value| and median; logits = q.k/sqrt(d) over allowed "
                          "(query, key) pairs; hidden = residual stream entering each layer, "
                          "and 'final' = the last block's output")
  return result


def initial_logit_rms(spec, vocab: int, seeds=(0, 1, 2), rows: int = 4, T: int = 96) -> float:
  """rms of a freshly initialised model's attention logits on random tokens, averaged over init
  seeds (the Shared DIFF initialisation ablation and its test)."""
  out, fns = [], None
  for seed in seeds:
    tokens = np.random.default_rng(seed).integers(4, vocab, (rows, T)).astype(np.int32)
    batch = dict(inputs=tokens, segment_ids=np.ones_like(tokens),
                 positions=np.tile(np.arange(T, dtype=np.int32), (rows, 1)))
    model = build_model(spec, nnx.Rngs(seed))
    fns = common.Fns(model) if fns is None else fns.reloaded(model)
    out.append(analyse(fns, batch)["overall"]["attention_logits"]["rms"])
  return float(np.mean(out))


def summary(result: dict) -> dict:
  """The outlier suite's headline: the largest attention logit over its RMS (top-1 ratio)."""
  return dict(logit_top1=result["overall"]["attention_logits"]["top1"])
