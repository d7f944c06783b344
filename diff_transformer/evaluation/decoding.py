"""Decoding with the model's KV cache: greedy / temperature + top-k / top-p sampling, and
constrained scoring of a fixed candidate set (ICL labels).

Prompts of different lengths share one batch: they are right-padded, prefilled in one call with
their true lengths (model.prefill), then extended one token per call (model.decode). Shapes are
bucketed (cache length to a multiple of 64, rows to a power of two) so a suite compiles only a few
programs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from diff_transformer.evaluation.common import Fns, pad_rows
from diff_transformer.errors import EvalError


def _cache_len(fns: Fns, prompt_len: int, extra: int) -> int:
  need = prompt_len + extra
  limit = fns.spec.max_seq_len
  if need > limit:
    raise EvalError(f"decoding: prompt of {prompt_len} tokens + {extra} new tokens exceeds the "
                    f"model's max_seq_len {limit}")
  return min(limit, int(np.ceil(need / 64) * 64))


def prefill(fns: Fns, prompts: list[list[int]], extra: int):
  """Cache holding the prompts and the logits [B, V] predicting each prompt's next token.

  Rows are padded to a power of two with copies of the first prompt (callers use the first
  len(prompts) rows of what comes back).
  """
  if any(len(p) == 0 for p in prompts):
    raise EvalError("decoding: empty prompt")
  cache_len = _cache_len(fns, max(len(p) for p in prompts), extra)
  rows = 1 << (len(prompts) - 1).bit_length()
  tokens, lengths = pad_rows(prompts + [prompts[0]] * (rows - len(prompts)), length=cache_len)
  logits, cache = fns.prefill(tokens, cache_len, lengths)
  last = jnp.take_along_axis(logits, jnp.asarray(lengths - 1)[:, None, None], axis=1)[:, 0]
  return last, cache


def _pick(logits_BV, key, temperature: float, top_k: int, top_p: float = 1.0):
  if temperature <= 0:
    return jnp.argmax(logits_BV, axis=-1)
  logits_BV = logits_BV / temperature
  if top_k > 0:
    kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
  if top_p < 1.0:  # nucleus: the most likely ids whose mass before them is under top_p
    sorted_BV = -jnp.sort(-logits_BV, axis=-1)
    p_BV = jax.nn.softmax(sorted_BV, axis=-1)
    kept_BV = jnp.cumsum(p_BV, axis=-1) - p_BV < top_p
    floor_B1 = jnp.min(jnp.where(kept_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    logits_BV = jnp.where(logits_BV < floor_B1, -jnp.inf, logits_BV)
  return jax.random.categorical(key, logits_BV, axis=-1)


def check_sampling(temperature: float, top_k: int, top_p: float, field: str = "decoding") -> None:
  if temperature < 0 or top_k < 0 or not 0.0 < top_p <= 1.0:
    raise EvalError(f"{field}: temperature >= 0, top_k >= 0 and 0 < top_p <= 1 required, got "
                    f"temperature={temperature}, top_k={top_k}, top_p={top_p}")


def generate(fns: Fns, prompts: list[list[int]], max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, num_ids: int | None = None
             ) -> list[list[int]]:
  """max_new_tokens new tokens per prompt (greedy when temperature is 0). `num_ids`: the
  tokenizer's ids; the model's padded vocabulary rows beyond them are never picked."""
  check_sampling(temperature, top_k, top_p)
  logits, cache = prefill(fns, prompts, max_new_tokens)
  padded = num_ids is not None and num_ids < logits.shape[-1]
  key = jax.random.key(seed)
  out = np.zeros((logits.shape[0], max_new_tokens), np.int32)
  for t in range(max_new_tokens):
    key, sub = jax.random.split(key)
    if padded:
      logits = logits.at[:, num_ids:].set(-jnp.inf)
    out[:, t] = np.asarray(_pick(logits, sub, temperature, top_k, top_p), np.int32)
    if t < max_new_tokens - 1:  # the last token needs no cache entry
      logits, cache = fns.decode(out[:, t:t + 1], cache, in_place=True)
      logits = logits[:, 0]
  return out[:len(prompts)].tolist()


def score_candidates(fns: Fns, prompts: list[list[int]], candidates: list[list[int]]
                     ) -> np.ndarray:
  """Log-probability [B, C] of each candidate token sequence as the prompt's continuation.

  The prompts are prefilled once; each candidate then reuses that cache (the cache arrays are
  values, so every candidate branches from the same prefix).
  """
  longest = max(len(c) for c in candidates)
  first, cache = prefill(fns, prompts, longest)
  first = jax.nn.log_softmax(first, axis=-1)
  rows = first.shape[0]
  scores = np.zeros((rows, len(candidates)), np.float64)
  for j, cand in enumerate(candidates):
    total = np.asarray(first[:, cand[0]], np.float64)
    if len(cand) > 1:
      toks = np.tile(np.asarray(cand[:-1], np.int32), (rows, 1))
      logits, _ = fns.decode(toks, cache)
      logp = jax.nn.log_softmax(logits, axis=-1)
      total = total + np.asarray(
          jnp.take_along_axis(logp, jnp.asarray(cand[1:])[None, :, None], axis=-1)[..., 0]
      ).sum(-1)
    scores[:, j] = total
  return scores[:len(prompts)]
