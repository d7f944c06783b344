"""The decode stage: prefill then greedy decoding with the model's KV cache, per variant."""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.bench_common import spread
from benchmarks.gpu_check.common import (Deadline, Record, StageRun, compile_all, error_text,
                                         model_config, save_hlo)
from diff_transformer.model import build_model
from diff_transformer.model import cache as kv_cache
from diff_transformer.model.attention import PAPER_VARIANTS, spec_from_config, variant_class
from diff_transformer.params import abstract_model

# XLA compile options of the per-token step, by the name `--command_buffers` gives. A command
# buffer records a program's kernels as one CUDA graph and launches it at once, so it matters
# where a step is many small kernels, as at batch 1. XLA's own set (default) takes fusions,
# cuBLAS, custom calls and cuDNN but no loops; the decoder scans its layers (a while loop), so
# each layer still launches its kernels one by one. `loops` adds loops and conditionals, so the
# whole step can be one graph; `off` launches every kernel itself.
COMMAND_BUFFERS = {
    "default": {},
    "off": {"xla_gpu_enable_command_buffer": ""},
    "loops": {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
              "DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL", "xla_gpu_graph_min_graph_size": 1},
}


def stage_decode(stage: StageRun) -> None:
  """Prefill (model.prefill) then greedy decoding (model.decode), one jitted call per
  token with the cache donated (updated in place); tokens/s = batch x new tokens / seconds. The
  per-token step is compiled once per `--command_buffers` setting, and the settings are
  interleaved with the variants in every round."""
  deadline = Deadline(stage.seconds - 10)
  opts = stage.options
  prompt, new, batches = (32, 8, (4,)) if stage.cpu else (2048, 256, opts.batches or (1, 32))
  settings = opts.command_buffers
  rounds = 2
  rec = Record(stage, prompt_len=prompt, new_tokens=new, batches=batches, rounds=rounds,
               layers=opts.train_layers,
               command_buffers={s: COMMAND_BUFFERS[s] for s in settings},
               note="the prefill (model.prefill) makes the cache and runs the prompt causally "
               "through the model's kernel (kernel=auto); the per-token steps read the whole "
               "cache through the 'xla' path (an explicit mask over the cache)")
  models, lowered = _lowered(stage, prompt, new, batches)
  programs = {(v, b, "prefill", ""): low for (v, b, name), low in lowered.items()
              if name == "prefill"}
  programs.update({(v, b, "step", s): low for (v, b, name), low in lowered.items()
                   if name == "step" for s in settings})
  start = time.time()
  compiled = compile_all(programs, 16, options={k: COMMAND_BUFFERS[k[3]] for k in programs
                                                if k[3]})
  rec.set(compile_s=round(time.time() - start, 1), programs=len(programs),
          hlo={f"{v}_batch{b}": save_hlo(stage, f"decode_hlo_{v}_batch{b}", c)
               for (v, b, name, setting), c in compiled.items()
               if name == "step" and setting == settings[0] and not isinstance(c, BaseException)})
  print(f"decode: {len(programs)} programs compiled in {time.time() - start:.1f} s", flush=True)
  for variant, m in models.items():
    spec = m["spec"]
    m["state"] = jax.jit(lambda spec=spec: nnx.split(build_model(spec, nnx.Rngs(0)))[1])()
  print(f"decode: models built at {time.time() - start:.1f} s", flush=True)
  runs = [(v, s) for s in settings for v in models]
  for batch in batches:
    times: dict[Any, dict[str, list[float]]] = {run: dict(prefill=[], decode=[]) for run in runs}
    failed = {(v, s): error_text(compiled[key]) for v, s in runs
              for key in ((v, batch, "prefill", ""), (v, batch, "step", s))
              if isinstance(compiled[key], BaseException)}
    tokens = jnp.asarray(np.random.default_rng(batch).integers(
        0, 256, (batch, prompt), dtype=np.int32))
    for r in range(rounds + 1):  # round 0 warms up (two steps)
      for variant, setting in runs:
        if (variant, setting) in failed or deadline.left() < 0:
          continue
        step = compiled[(variant, batch, "step", setting)]
        try:
          t0 = time.perf_counter()
          tok, cache = compiled[(variant, batch, "prefill", "")](models[variant]["state"],
                                                                  tokens)
          tok.block_until_ready()
          t1 = time.perf_counter()
          for _ in range(new if r else 2):
            tok, cache = step(models[variant]["state"], tok, cache)
          tok.block_until_ready()
          t2 = time.perf_counter()
        except Exception as e:  # e.g. out of memory at batch 32
          failed[(variant, setting)] = error_text(e)
          continue
        if r:
          times[(variant, setting)]["prefill"].append(t1 - t0)
          times[(variant, setting)]["decode"].append(t2 - t1)
      print(f"decode: batch {batch} round {r} done at {time.time() - start:.1f} s", flush=True)
    for cell in _cells(times, failed, batch, prompt, new):
      rec.add(cell)


def _cells(times: dict, failed: dict, batch: int, prompt: int, new: int) -> list[dict]:
  """One record cell per (variant, setting) of a batch size: its times and rates, with the
  ratios of the same round's times to the Transformer under the same setting (decoding and the
  prefill) and to the same variant under XLA's default setting; or why it has none."""
  cells = []
  for variant, setting in times:
    cell = dict(variant=variant, batch=batch, command_buffers=setting)
    dec, prefill = times[(variant, setting)]["decode"], times[(variant, setting)]["prefill"]
    if (variant, setting) in failed:
      cells.append(dict(cell, error=failed[(variant, setting)]))
      continue
    if not dec:
      cells.append(dict(cell, skipped="stage time cap"))
      continue
    cell.update(prefill_s=spread(prefill), decode_s=spread(dec),
                decode_tokens_per_s=batch * new / float(np.median(dec)),
                prefill_tokens_per_s=batch * prompt / float(np.median(prefill)))
    for field, phase, base in (("decode_vs_transformer", "decode", ("transformer", setting)),
                               ("decode_vs_default", "decode", (variant, "default")),
                               ("prefill_vs_transformer", "prefill", ("transformer", setting))):
      ours, theirs = times[(variant, setting)][phase], times.get(base, {}).get(phase, [])
      if base != (variant, setting) and len(theirs) == len(ours):
        cell[field] = spread([b / t for t, b in zip(ours, theirs)])
    cells.append(cell)
  return cells


def _lowered(stage: StageRun, prompt: int, new: int, batches: tuple[int, ...]
             ) -> tuple[dict, dict]:
  """({variant: spec and graphdef}, {(variant, batch, prefill|step): lowered program})."""
  models: dict[str, Any] = {}
  lowered: dict[tuple, jax.stages.Lowered | Exception] = {}
  for variant in PAPER_VARIANTS:
    config = model_config(stage, variant, seq_len=prompt + new, batch=1, kernel="auto")
    spec = spec_from_config(config.model)
    graphdef = nnx.split(abstract_model(spec))[0]
    models[variant] = dict(spec=spec, graphdef=graphdef)

    def prefill(state, tokens_BT, graphdef=graphdef):
      logits, cache = nnx.merge(graphdef, state).prefill(tokens_BT, prompt + new)
      return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    def step(state, token_B, cache, graphdef=graphdef):
      logits, cache = nnx.merge(graphdef, state).decode(token_B[:, None], cache)
      return jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), cache

    state_struct = jax.eval_shape(lambda spec=spec: nnx.split(build_model(spec, nnx.Rngs(0)))[1])
    for batch in batches:
      cache = jax.eval_shape(lambda b=batch, spec=spec: new_cache(spec, b, prompt + new))
      tok = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
      token = jax.ShapeDtypeStruct((batch,), jnp.int32)
      for name, fn, args, donate in (("prefill", prefill, (state_struct, tok), ()),
                                     ("step", step, (state_struct, token, cache), 2)):
        try:
          lowered[(variant, batch, name)] = jax.jit(fn, donate_argnums=donate).lower(*args)
        except Exception as e:  # recorded
          lowered[(variant, batch, name)] = e
  return models, lowered


def new_cache(spec, batch: int, length: int):
  return kv_cache.init(spec, variant_class(spec.variant).cache_layout(spec), batch, length)
