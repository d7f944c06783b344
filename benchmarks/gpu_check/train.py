"""The train stage: the train step (the papers' Table 7 analog).

The --size preset (830M by default) of every variant with its depth cut (--train_layers, 0: full
depth; compile time does not grow with depth, the layers are scanned, but 4 states must fit
beside each other), in bfloat16, at T = 2K and 4K with B x T = --train_tokens (16K) tokens per
step and --remat as given. Each variant runs with kernel=auto and with the other fused path
(Pallas or cuDNN, whichever auto did not pick). Variants are timed in turn, round by round; each
round's tokens/s is divided by the Transformer's of that round. Then one orbax save and restore:
the two steps after the restore must give the losses of the two steps after the save (bit for
bit where the device repeats itself bit for bit: the same two steps rerun from a copy of the
saved state measure that).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_common import Stepper, interleaved_times, spread, synthetic_batch
from benchmarks.gpu_check.common import (Deadline, Record, StageRun, compile_all, error_text,
                                         model_config)
from benchmarks.gpu_check.fit import fit_to_memory
from diff_transformer.aot.gpu import FIXED_MARGIN_BYTES, GIB
from diff_transformer.mesh import global_batch, make_mesh
from diff_transformer.model.attention import spec_from_config
from diff_transformer.params import count
from diff_transformer.runs.checkpoint import Checkpointer
from diff_transformer.runs.layout import fingerprint
from diff_transformer.training.metrics import executed_flops_per_token, train_flops_per_token
from diff_transformer.training.peak import peak_tflops_per_device
from diff_transformer.training.step import Trainer

FUSED = ("pallas", "cudnn")


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def stage_train(stage: StageRun, timing: bool = True) -> None:
  """timing=False: only the orbax check (DIFF V1, kernel=auto, the first length)."""
  cpu, opts = stage.cpu, stage.options
  deadline = Deadline(stage.seconds - 10)
  tokens, lengths = (64, (32,)) if cpu else (opts.train_tokens, opts.lengths_or((2048, 4096)))
  rounds, steps = (2, 1) if cpu else (opts.rounds, 3)
  peak, peak_source = peak_tflops_per_device(0.0, "bfloat16")
  layers = opts.train_layers
  rec = Record(stage, layers=layers, tokens_per_step=tokens, lengths=lengths, rounds=rounds,
               steps_per_round=steps, peak_tflops=peak, peak_source=peak_source,
               preset="small_config" if cpu else f"configs/scaling.py <variant>-{opts.size}, "
               f"num_layers {layers or 'full depth'}, bfloat16, remat {opts.remat}")
  masks = opts.masks_or(("causal",)) if timing else ("causal",)
  runs, lowered = _runs(stage, timing, tokens, lengths, masks)
  start = time.time()
  compiled = compile_all(lowered, 16)
  limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
  fit_to_memory(runs, compiled, limit)
  rec.set(compile_s=round(time.time() - start, 1), programs=len(lowered),
          usable_gib=limit and round(limit / GIB, 2), margin_gib=FIXED_MARGIN_BYTES / GIB)
  one_state, state_gib = one_state_at_a_time(runs, opts.states)
  rec.set(states="one at a time" if one_state else "all resident", state_gib=state_gib)
  states = {}
  for T, label, mask in ((T, label, mask) for T in lengths for label in ("auto", "other")
                         for mask in masks):
    group = [(i, r) for i, r in enumerate(runs)
             if (r["T"], r["label"], r["mask"]) == (T, label, mask)]
    ready = {}
    for i, r in group:
      if isinstance(compiled[i], BaseException):
        r["error"] = error_text(compiled[i])
        continue
      try:
        if r["variant"] not in states and not one_state:
          states[r["variant"]] = r["trainer"].init()
      except Exception as e:  # e.g. out of memory: recorded, the others go on
        r["error"] = error_text(e)
        continue
      ready[i] = r
    if timing and deadline.left() > 0 and ready:
      try:
        _time_group(ready, compiled, states, rounds, steps, peak * 1e12, one_state, deadline)
      except Exception as e:  # a failure only in company: every cell of the group says so
        for r in ready.values():
          r.setdefault("error", error_text(e))
    for i, r in group if timing else ():
      rec.add({k: v for k, v in r.items() if k not in ("trainer", "data")}
              | ({} if "tokens_per_s" in r or "error" in r else dict(skipped="stage time cap")))
  rec.set(summary=train_summary(rec.data["cells"]))
  diff_run = next((i for i, r in enumerate(runs) if r["variant"] == "diff" and r["label"] == "auto"
                   and not isinstance(compiled[i], BaseException)), None)
  if one_state:
    rec.set(orbax="not run: the states are trained one at a time (they do not fit together)")
  elif diff_run is not None and "diff" in states and deadline.left() > 0:
    run = runs[diff_run]
    for variant in [v for v in states if v != "diff"]:  # room for the copies the check makes
      del states[variant]
    rec.set(orbax=_orbax_check(run["trainer"], compiled[diff_run], states["diff"], run["data"]))


def _runs(stage: StageRun, timing: bool, tokens: int, lengths: tuple[int, ...],
          masks: tuple[str, ...]) -> tuple[list[dict], dict]:
  """(one run per length, label, mask and variant, {index: its lowered step or the exception})."""
  # CPU mode checks this stage's code, not speeds, so the other kernel runs for DIFF V1 alone
  # (every variant's Pallas train step is checked against XLA's in tests/test_pallas_model.py).
  opts = stage.options
  other_variants = ("diff",) if stage.cpu else opts.variants
  runs: list[dict[str, Any]] = []
  lowered: dict[int, jax.stages.Lowered | Exception] = {}
  for T, label, mask in ((T, label, mask) for T in lengths
                         for label in (opts.labels if timing else ("auto",))
                         for mask in masks):
    batch = max(1, tokens // T)
    variants = opts.variants if label == "auto" else other_variants
    if mask == "document":
      variants = tuple(v for v in variants if v in opts.document_variants)
    for variant in variants:
      if not timing and (variant, label, T) != ("diff", "auto", lengths[0]):
        continue
      auto = model_config(stage, variant, seq_len=T, batch=batch, kernel="auto")
      chosen = executed_flops_per_token(spec_from_config(auto.model), T)[1]
      kernel = "auto" if label == "auto" else next(k for k in FUSED if k != chosen)
      run = dict(variant=variant, T=T, batch=batch, label=label, mask=mask, kernel=kernel,
                 runs=chosen if kernel == "auto" else kernel)
      try:
        config = model_config(stage, variant, seq_len=T, batch=batch, kernel=kernel)
        config.data.document_mask = mask == "document"
        trainer = Trainer(config, make_mesh(config.mesh))
        # Document-masked rows pack about 3 documents a row, as the kernels stage's calls.
        data = global_batch(trainer.mesh, synthetic_batch(
            batch, T, config.model.vocab_size, documents=3.0 if mask == "document" else 1.0))
        lowered[len(runs)] = trainer.lower_train_step(data)
        spec = trainer.spec
        run.update(trainer=trainer, data=data, params=count(spec)["params"],
                   model_flops=train_flops_per_token(spec, T) * batch * T,
                   executed_flops=executed_flops_per_token(
                       spec, T, packed=trainer.packed_rows)[0] * batch * T)
      except Exception as e:  # recorded per run
        lowered[len(runs)] = e
      runs.append(run)
  return runs, lowered


def stage_train_orbax(stage: StageRun) -> None:
  """The orbax check alone (DIFF V1, kernel=auto, the first length)."""
  stage_train(stage, timing=False)


def one_state_at_a_time(runs: list[dict], states: str) -> tuple[bool, dict]:
  """(whether the variants' train states are made one at a time, each variant's state in GiB).
  `states` (--states): 'all' keeps every variant's state on the device through the rounds, 'one'
  makes a fresh state before each variant's turn and drops it after, 'auto' takes 'one' where
  the states would fill more than half the device's memory (the 3B presets' AdamW states)."""
  gib = {r["variant"]: sum(x.size * x.dtype.itemsize
                           for x in jax.tree.leaves(r["trainer"].abstract_state)) / 2 ** 30
         for r in runs if "trainer" in r}
  gib = {v: round(g, 4) for v, g in gib.items()}
  if states != "auto":
    return states == "one", gib
  limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
  if not limit:  # the device does not say
    return False, gib
  return sum(gib.values()) * 2 ** 30 > 0.5 * limit, gib


def _time_group(ready: dict, compiled: dict, states: dict, rounds: int, steps: int,
                peak_flops: float, one_state: bool = False, deadline: Deadline | None = None
                ) -> None:
  """Interleaved rounds over the group's variants; state threads through (donated). One state
  at a time: before each variant's turn the last state is dropped, a fresh one made and
  stepped once (its warm-up), all untimed; the timed steps run as they would in training.
  Rounds stop at `deadline` once every variant has one (what was measured is kept)."""
  calls = {i: Stepper(compiled[i], r["data"], states, r["variant"]) for i, r in ready.items()}
  if not one_state:  # each step alone first (its warm-up): a failing variant costs its own cell
    for i in list(calls):
      try:
        jax.block_until_ready(calls[i]())
      except Exception as e:  # recorded per run
        ready[i]["error"] = error_text(e)
        del calls[i]

  def fresh_state(i):
    states.clear()
    states[ready[i]["variant"]] = ready[i]["trainer"].init()
    jax.block_until_ready(calls[i]())

  times = interleaved_times(calls, rounds, inner=steps, deadline=deadline,
                            before_call=fresh_state if one_state else None, warm=False)
  losses = {i: float(call.metrics["loss"]) for i, call in calls.items()}
  base = next((i for i in calls if ready[i]["variant"] == "transformer"), None)
  for i, r in ((i, ready[i]) for i in calls):
    step_s = float(np.median(times[i]))
    r.update(step_s=spread(times[i]), tokens_per_s=r["batch"] * r["T"] / step_s,
             mfu=r["model_flops"] / step_s / peak_flops,
             hfu=r["executed_flops"] / step_s / peak_flops,
             last_loss=losses[i])
    if base is not None:
      r["tokens_per_s_vs_transformer"] = spread([b / t for t, b in zip(times[i], times[base])])


def train_summary(cells: list[dict]) -> list[dict]:
  return [dict(T=c["T"], variant=c["variant"], mask=c.get("mask", "document"),
               kernel=c["kernel"], runs=c["runs"],
               tokens_per_s=round(c["tokens_per_s"]), mfu=round(c["mfu"], 4),
               vs_transformer=c.get("tokens_per_s_vs_transformer", {}).get("median"))
          for c in cells if "tokens_per_s" in c]


def _orbax_check(trainer, step, state, data) -> dict:
  """Save, take two steps; restore, take the same two; and the same two again from a copy."""
  shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
  folder = Path(tempfile.mkdtemp(prefix="gpu_check_ckpt_", dir=shm))
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
    found = ckpt.restore(trainer.abstract_state)
    if found is None:
      raise RuntimeError(f"no checkpoint found in {folder} right after saving one")
    restored, restored_step = found
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
