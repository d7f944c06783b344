"""gpu_check's train, profile and decode stages: the train step (the papers' Table 7 analog), the
step's profile by kernel class, and KV-cache decoding.

Train: the --size preset (830M by default) of every variant with its depth cut (--train_layers,
0: full depth; compile time does not grow with depth, the layers are scanned, but 4 states must
fit beside each other), in bfloat16, at T = 2K and 4K with B x T = --train_tokens (16K) tokens
per step and --remat as given. Each variant runs with kernel=auto
and with the other fused path (Pallas or cuDNN, whichever auto did not pick). Variants are timed
in turn, round by round; each round's tokens/s is divided by the Transformer's of that round.
Then one orbax save and restore: the two steps after the restore must give the losses of the
two steps after the save (bit for bit where the device repeats itself bit for bit: the same two
steps rerun from a copy of the saved state measure that).
"""
from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench_common import paper_config, small_config, spread, synthetic_batch
from gpu_check import OPTIONS, Deadline, Record, compile_all, error_text, lengths_or
from diff_transformer.model import build_model
from diff_transformer.model import cache as kv_cache
from diff_transformer.model.attention import PAPER_VARIANTS, variant_class
from diff_transformer.model.spec import ModelSpec
from diff_transformer.params import abstract_model, count
from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.mesh import global_batch, make_mesh
from diff_transformer.training.metrics import executed_flops_per_token, train_flops_per_token
from diff_transformer.training.peak import peak_tflops_per_device
from diff_transformer.runs.layout import fingerprint
from diff_transformer.training.step import Trainer

FUSED = ("pallas", "cudnn")


def _config(variant, cpu, *, seq_len, batch, layers, kernel):
  """The preset OPTIONS['size'] names (layers 0: its full depth), remat as OPTIONS says."""
  if cpu:
    return small_config(variant, seq_len=seq_len, batch=batch, kernel=kernel)
  c = paper_config(variant, seq_len=seq_len, batch=batch, layers=layers, kernel=kernel,
                   size=OPTIONS["size"])
  c.model.remat = OPTIONS["remat"]
  return c


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def stage_train(out: Path, cpu: bool, seconds: float, layers: int, timing: bool = True) -> None:
  """timing=False: only the orbax check (DIFF V1, kernel=auto, the first length)."""
  deadline = Deadline(seconds - 10)
  tokens, lengths = (64, (32,)) if cpu else (OPTIONS["train_tokens"], lengths_or((2048, 4096)))
  rounds, steps = (2, 1) if cpu else (5, 3)
  peak, peak_source = peak_tflops_per_device(0.0, "bfloat16")
  rec = Record(out, "train" if timing else "train_orbax", layers=layers, tokens_per_step=tokens, lengths=lengths,
               rounds=rounds, steps_per_round=steps, peak_tflops=peak, peak_source=peak_source,
               preset="small_config" if cpu else f"configs/scaling.py <variant>-{OPTIONS['size']}, "
               f"num_layers {layers or 'full depth'}, bfloat16, remat {OPTIONS['remat']}")
  # CPU mode checks this stage's code, not speeds, so the other kernel runs for DIFF V1 alone
  # (every variant's Pallas train step is checked against XLA's in tests/test_pallas_model.py).
  other_variants = ("diff",) if cpu else PAPER_VARIANTS
  runs, lowered = [], {}
  for T in lengths:
    batch = max(1, tokens // T)
    for label in OPTIONS["labels"] if timing else ("auto",):
      for variant in PAPER_VARIANTS if label == "auto" else other_variants:
        if not timing and (variant, label, T) != ("diff", "auto", lengths[0]):
          continue
        auto = _config(variant, cpu, seq_len=T, batch=batch, layers=layers, kernel="auto")
        chosen = executed_flops_per_token(ModelSpec.from_config(auto.model), T)[1]
        kernel = "auto" if label == "auto" else next(k for k in FUSED if k != chosen)
        run = dict(variant=variant, T=T, batch=batch, label=label, kernel=kernel,
                   runs=chosen if kernel == "auto" else kernel)
        try:
          config = _config(variant, cpu, seq_len=T, batch=batch, layers=layers, kernel=kernel)
          trainer = Trainer(config, make_mesh(config.mesh))
          data = global_batch(trainer.mesh, synthetic_batch(batch, T, config.model.vocab_size))
          lowered[len(runs)] = trainer.lower_train_step(data)
          spec = trainer.spec
          run.update(trainer=trainer, data=data, params=count(spec)["params"],
                     model_flops=train_flops_per_token(spec, T) * batch * T,
                     executed_flops=executed_flops_per_token(spec, T)[0] * batch * T)
        except Exception as e:  # recorded per run
          lowered[len(runs)] = e
        runs.append(run)
  start = time.time()
  compiled = compile_all(lowered, 16)
  rec.set(compile_s=round(time.time() - start, 1), programs=len(lowered))
  states = {}
  for T in lengths:
    for label in ("auto", "other"):
      group = [(i, r) for i, r in enumerate(runs) if r["T"] == T and r["label"] == label]
      ready = {}
      for i, r in group:
        if isinstance(compiled[i], BaseException):
          r["error"] = error_text(compiled[i])
          continue
        if r["variant"] not in states:
          states[r["variant"]] = r["trainer"].init()
        ready[i] = r
      if timing and deadline.left() > 0 and ready:
        _time_group(ready, compiled, states, rounds, steps, peak * 1e12)
      for i, r in group if timing else ():
        rec.add({k: v for k, v in r.items() if k not in ("trainer", "data")}
                | ({} if i in ready or "error" in r else dict(skipped="stage time cap")))
  rec.set(summary=train_summary(rec.data["cells"]))
  diff_run = next((i for i, r in enumerate(runs) if r["variant"] == "diff" and r["label"] == "auto"
                   and not isinstance(compiled[i], BaseException)), None)
  if diff_run is not None and "diff" in states and deadline.left() > 0:
    run = runs[diff_run]
    for variant in [v for v in states if v != "diff"]:  # room for the copies the check makes
      del states[variant]
    rec.set(orbax=_orbax_check(run["trainer"], compiled[diff_run], states["diff"], run["data"]))


def _time_group(ready: dict, compiled: dict, states: dict, rounds: int, steps: int,
                peak_flops: float) -> None:
  """Interleaved rounds over the group's variants; state threads through (donated)."""
  times = {i: [] for i in ready}
  losses = {}
  for i, r in ready.items():  # warm-up step
    states[r["variant"]], m = compiled[i](states[r["variant"]], r["data"])
    jax.block_until_ready(m)
  for _ in range(rounds):
    for i, r in ready.items():
      start = time.perf_counter()
      for _ in range(steps):
        states[r["variant"]], m = compiled[i](states[r["variant"]], r["data"])
      losses[i] = float(m["loss"])  # waits for the last step
      times[i].append((time.perf_counter() - start) / steps)
  base = next((i for i, r in ready.items() if r["variant"] == "transformer"), None)
  for i, r in ready.items():
    step_s = float(np.median(times[i]))
    r.update(step_s=spread(times[i]), tokens_per_s=r["batch"] * r["T"] / step_s,
             mfu=r["model_flops"] / step_s / peak_flops, hfu=r["executed_flops"] / step_s / peak_flops,
             last_loss=losses[i])
    if base is not None:
      r["tokens_per_s_vs_transformer"] = spread([b / t for t, b in zip(times[i], times[base])])


def train_summary(cells: list[dict]) -> list[dict]:
  return [dict(T=c["T"], variant=c["variant"], kernel=c["kernel"], runs=c["runs"],
               tokens_per_s=round(c["tokens_per_s"]), mfu=round(c["mfu"], 4),
               vs_transformer=c.get("tokens_per_s_vs_transformer", {}).get("median"))
          for c in cells if "tokens_per_s" in c]


def _orbax_check(trainer, step, state, data) -> dict:
  """Save, take two steps; restore, take the same two; and the same two again from a copy."""
  folder = Path(tempfile.mkdtemp(prefix="gpu_check_ckpt_", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
  try:
    second = jax.tree.map(lambda x: jnp.roll(x, 1, axis=0) if x.ndim else x, data)

    def two_steps(s):
      s, m1 = step(s, data)
      s, m2 = step(s, second)
      return [float(m1["loss"]), float(m2["loss"])], fingerprint(s["params"])

    state = _copy(state)
    for _ in range(2):  # optimizer moments that are not zero
      state, _ = step(state, second)
    start = time.time()
    ckpt = Checkpointer(folder)
    ckpt.save(int(state["step"]), state, None)
    ckpt.wait()
    save_s = time.time() - start
    rerun = two_steps(_copy(state))
    after_save = two_steps(_copy(state))
    start = time.time()
    restored, restored_step = ckpt.restore(trainer.abstract_state)
    restore_s = time.time() - start
    after_restore = two_steps(restored)
    ckpt.close()
    return dict(step=restored_step, save_s=save_s, restore_s=restore_s,
                losses_after_save=after_save[0], losses_after_restore=after_restore[0],
                losses_rerun_from_copy=rerun[0],
                restore_losses_equal=after_save[0] == after_restore[0],
                restore_params_equal=after_save[1] == after_restore[1],
                rerun_losses_equal=after_save[0] == rerun[0],
                rerun_params_equal=after_save[1] == rerun[1],
                max_loss_diff=max(abs(a - b) for a, b in zip(after_save[0], after_restore[0])))
  except Exception as e:  # recorded
    return dict(error=error_text(e))
  finally:
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------- profile

# Device kernels by what they do, matched on the kernel's name (ours are named by
# pallas.kernel_name; cuDNN's fused attention carries "sdpa"/"fmha", cuBLAS/CUTLASS GEMMs their
# library's names). The rest is XLA's own fusions: elementwise work, norms, reductions, copies.
KERNEL_CLASSES = (("attention", re.compile(r"diff_attention|sdpa|fmha|flash|attention", re.I)),
                  ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|wgmma|matmul|dot", re.I)),
                  ("memory", re.compile(r"memcpy|memset|copy|transpose", re.I)))


def stage_profile(out: Path, cpu: bool, seconds: float, layers: int) -> None:
  """Where a train step's time goes: a jax.profiler trace of a few steps per variant (kernel=auto,
  the train stage's first length), its device kernels summed by name and by class."""
  deadline = Deadline(seconds - 10)
  tokens, T = (64, 32) if cpu else (16384, lengths_or((2048,))[0])
  batch, steps = max(1, tokens // T), 3
  rec = Record(out, "profile", T=T, batch=batch, layers=layers, steps=steps,
               classes={name: rx.pattern for name, rx in KERNEL_CLASSES} | {"other": "the rest"})
  runs, lowered = {}, {}
  for variant in PAPER_VARIANTS:
    config = _config(variant, cpu, seq_len=T, batch=batch, layers=layers, kernel="auto")
    trainer = Trainer(config, make_mesh(config.mesh))
    data = global_batch(trainer.mesh, synthetic_batch(batch, T, config.model.vocab_size))
    runs[variant] = dict(trainer=trainer, data=data,
                         runs=executed_flops_per_token(trainer.spec, T)[1])
    lowered[variant] = trainer.lower_train_step(data)
  start = time.time()
  compiled = compile_all(lowered, 16)
  rec.set(compile_s=round(time.time() - start, 1))
  for variant, r in runs.items():
    if deadline.left() < 0:
      rec.add(dict(variant=variant, skipped="stage time cap"))
      continue
    if isinstance(compiled[variant], BaseException):
      rec.add(dict(variant=variant, error=error_text(compiled[variant])))
      continue
    folder = Path(tempfile.mkdtemp(prefix="gpu_check_profile_"))
    try:
      state = r["trainer"].init()
      state, m = compiled[variant](state, r["data"])  # warm-up
      jax.block_until_ready(m)
      with jax.profiler.trace(str(folder)):
        t0 = time.perf_counter()
        for _ in range(steps):
          state, m = compiled[variant](state, r["data"])
        jax.block_until_ready(m)
        step_s = (time.perf_counter() - t0) / steps
      del state
      rec.add(dict(variant=variant, runs=r["runs"], step_ms=1e3 * step_s,
                   **kernel_times(folder, steps)))
    except Exception as e:  # recorded
      rec.add(dict(variant=variant, error=error_text(e)))
    finally:
      shutil.rmtree(folder, ignore_errors=True)
  base = next((c for c in rec.data["cells"] if c["variant"] == "transformer" and "ms" in c), None)
  if base is not None:
    rec.set(extra_ms_vs_transformer={
        c["variant"]: {k: round(c["ms"].get(k, 0.0) - base["ms"].get(k, 0.0), 2)
                       for k in {*c["ms"], *base["ms"]}}
        for c in rec.data["cells"] if "ms" in c and c is not base})


def kernel_times(folder: Path, steps: int, top: int = 25) -> dict:
  """Per-step milliseconds of the trace's device kernels: by class and the `top` kernels by name.
  On a GPU the kernels are the device plane's stream lines (its derived "XLA Ops"/"XLA Modules"
  lines would count them twice); on a CPU, the host's events that carry an hlo_op (there a
  while loop's event holds its body's: the CPU figures exercise this code, they time nothing)."""
  from jax.profiler import ProfileData
  trace = ProfileData.from_file(str(next(folder.rglob("*.xplane.pb"))))
  by_name: dict = {}
  for plane in trace.planes:
    device = plane.name.startswith(("/device:GPU", "/device:TPU"))
    for line in plane.lines:
      if device and not line.name.startswith("Stream"):
        continue
      for event in line.events:
        stats = dict(event.stats)
        if not device and "hlo_op" not in stats:
          continue
        slot = by_name.setdefault(event.name, dict(ns=0.0, calls=0, hlo_op=stats.get("hlo_op")))
        slot["ns"] += event.duration_ns
        slot["calls"] += 1
  ms: dict = {}
  for name, slot in by_name.items():
    kind = next((k for k, rx in KERNEL_CLASSES if rx.search(name)), "other")
    ms[kind] = ms.get(kind, 0.0) + slot["ns"] / 1e6 / steps
  ranked = sorted(by_name.items(), key=lambda kv: -kv[1]["ns"])[:top]
  return dict(busy_ms=round(sum(ms.values()), 3), ms={k: round(v, 3) for k, v in ms.items()},
              kernels=[dict(name=n[:160], hlo_op=s["hlo_op"], ms=round(s["ns"] / 1e6 / steps, 3),
                            calls=s["calls"] / steps) for n, s in ranked])


# ----------------------------------------------------------------------------------- decode


def stage_decode(out: Path, cpu: bool, seconds: float, layers: int) -> None:
  """Prefill then greedy decoding with the model's KV cache (model.decode), one jitted call per
  token with the cache donated (updated in place); tokens/s = batch x new tokens / seconds."""
  deadline = Deadline(seconds - 10)
  prompt, new, batches = (32, 8, (4,)) if cpu else (2048, 256, (1, 32))
  rounds = 2
  rec = Record(out, "decode", prompt_len=prompt, new_tokens=new, batches=batches, rounds=rounds,
               layers=layers, note="prefill runs the 'xla' path (an explicit decode mask); the "
               "per-token steps read the whole cache through it")
  models, lowered = {}, {}
  for variant in PAPER_VARIANTS:
    config = _config(variant, cpu, seq_len=prompt + new, batch=1, layers=layers, kernel="auto")
    spec = ModelSpec.from_config(config.model)
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


def new_cache(spec, batch: int, length: int):
  return kv_cache.init(spec, variant_class(spec.variant).cache_layout(spec), batch, length)
