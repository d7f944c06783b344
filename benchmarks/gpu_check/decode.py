"""The decode stage: prefill then greedy decoding with the model's KV cache, per variant."""
from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench_common import spread
from benchmarks.gpu_check.common import (OPTIONS, Deadline, Record, compile_all, error_text,
                                         model_config)
from diff_transformer.model import build_model
from diff_transformer.model import cache as kv_cache
from diff_transformer.model.attention import PAPER_VARIANTS, spec_from_config, variant_class
from diff_transformer.params import abstract_model

def stage_decode(out: Path, cpu: bool, seconds: float) -> None:
  """Prefill then greedy decoding with the model's KV cache (model.decode), one jitted call per
  token with the cache donated (updated in place); tokens/s = batch x new tokens / seconds."""
  deadline = Deadline(seconds - 10)
  prompt, new, batches = (32, 8, (4,)) if cpu else (2048, 256, (1, 32))
  rounds = 2
  rec = Record(out, "decode", prompt_len=prompt, new_tokens=new, batches=batches, rounds=rounds,
               layers=OPTIONS["train_layers"], note="prefill runs the 'xla' path (an explicit "
               "decode mask); the per-token steps read the whole cache through it")
  models, lowered = _lowered(cpu, prompt, new, batches)
  start = time.time()
  compiled = compile_all(lowered, 16)
  rec.set(compile_s=round(time.time() - start, 1), programs=len(lowered))
  print(f"decode: {len(lowered)} programs compiled in {time.time() - start:.1f} s", flush=True)
  for variant, m in models.items():
    spec = m["spec"]
    m["state"] = jax.jit(lambda spec=spec: nnx.split(build_model(spec, nnx.Rngs(0)))[1])()
  print(f"decode: models built at {time.time() - start:.1f} s", flush=True)
  for batch in batches:
    times = {v: dict(prefill=[], decode=[]) for v in models}
    failed = {v: error_text(compiled[(v, batch, n)]) for v in models for n in ("prefill", "step")
              if isinstance(compiled[(v, batch, n)], BaseException)}
    tokens = jnp.asarray(np.random.default_rng(batch).integers(
        0, 256, (batch, prompt), dtype=np.int32))
    for r in range(rounds + 1):  # round 0 warms up (two steps)
      for variant, m in models.items():
        if variant in failed or deadline.left() < 0:
          continue
        try:
          cache = new_cache(m["spec"], batch, prompt + new)
          t0 = time.perf_counter()
          tok, cache = compiled[(variant, batch, "prefill")](m["state"], tokens, cache)
          tok.block_until_ready()
          t1 = time.perf_counter()
          for _ in range(new if r else 2):
            tok, cache = compiled[(variant, batch, "step")](m["state"], tok, cache)
          tok.block_until_ready()
          t2 = time.perf_counter()
        except Exception as e:  # e.g. out of memory at batch 32
          failed[variant] = error_text(e)
          continue
        if r:
          times[variant]["prefill"].append(t1 - t0)
          times[variant]["decode"].append(t2 - t1)
      print(f"decode: batch {batch} round {r} done at {time.time() - start:.1f} s", flush=True)
    base = times["transformer"]["decode"]
    for variant in models:
      cell = dict(variant=variant, batch=batch)
      if variant in failed:
        rec.add(dict(cell, error=failed[variant]))
        continue
      dec = times[variant]["decode"]
      if not dec:
        rec.add(dict(cell, skipped="stage time cap"))
        continue
      cell.update(prefill_s=spread(times[variant]["prefill"]), decode_s=spread(dec),
                  decode_tokens_per_s=batch * new / float(np.median(dec)),
                  prefill_tokens_per_s=batch * prompt / float(np.median(times[variant]["prefill"])))
      if len(base) == len(dec):
        cell["decode_vs_transformer"] = spread([b / t for t, b in zip(dec, base)])
      rec.add(cell)


def _lowered(cpu: bool, prompt: int, new: int, batches: tuple[int, ...]) -> tuple[dict, dict]:
  """({variant: spec and graphdef}, {(variant, batch, prefill|step): lowered program})."""
  models, lowered = {}, {}
  for variant in PAPER_VARIANTS:
    config = model_config(variant, cpu, seq_len=prompt + new, batch=1, kernel="auto")
    spec = spec_from_config(config.model)
    graphdef = nnx.split(abstract_model(spec))[0]
    models[variant] = dict(spec=spec, graphdef=graphdef)

    def prefill(state, tokens_BT, cache, graphdef=graphdef):
      logits, cache = nnx.merge(graphdef, state).decode(tokens_BT, cache)
      return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    def step(state, token_B, cache, graphdef=graphdef):
      logits, cache = nnx.merge(graphdef, state).decode(token_B[:, None], cache)
      return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    state_struct = jax.eval_shape(lambda spec=spec: nnx.split(build_model(spec, nnx.Rngs(0)))[1])
    for batch in batches:
      cache = jax.eval_shape(lambda b=batch, spec=spec: new_cache(spec, b, prompt + new))
      tok = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
      for name, fn, arg in (("prefill", prefill, tok),
                            ("step", step, jax.ShapeDtypeStruct((batch,), jnp.int32))):
        try:
          lowered[(variant, batch, name)] = jax.jit(fn, donate_argnums=2).lower(
              state_struct, arg, cache)
        except Exception as e:  # recorded
          lowered[(variant, batch, name)] = e
  return models, lowered


def new_cache(spec, batch: int, length: int):
  return kv_cache.init(spec, variant_class(spec.variant).cache_layout(spec), batch, length)
