"""Sharded training on 8 fake CPU devices: equality with one device, shardings, cross-mesh restore.

The work runs once in a child process (`python tests/test_training_sharding.py OUT.json`) that
sets the device count before jax starts; the tests below assert on its JSON report.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.variant_table import VARIANTS, entry

ROOT = Path(__file__).resolve().parents[1]
from tests.helpers.models import sharding_config
MESHES = ((8, 1, 1), (2, 2, 2), (1, 4, 2))
# Micro-batches per mesh: (2, 2, 2) also checks that accumulation equals the whole batch.
MICRO = {(8, 1, 1): 1, (2, 2, 2): 2, (1, 4, 2): 1}
# Each sharded gradient is a compile of seconds: every variant on (2, 2, 2) (every axis split at
# once), and each other mesh for two variants (fsdp 4 for those with a rank or 4 query heads).
# Every (variant, mesh) pair still gets its placement checked (no compile).
TOL = 1e-5


def synthetic_batch(seed: int, batch: int = 16, seq: int = 16, vocab: int = 96):
  """Packed rows: two documents per row, positions restarting, some padding at the end."""
  import numpy as np
  rng = np.random.default_rng(seed)
  inputs = rng.integers(0, vocab, (batch, seq), dtype=np.int32)
  targets = rng.integers(0, vocab, (batch, seq), dtype=np.int32)
  cut = rng.integers(3, seq - 3, batch)
  idx = np.arange(seq)[None]
  segment_ids = np.where(idx < cut[:, None], 1, 2).astype(np.int32)
  segment_ids[:, -2:] = 0  # padding
  positions = np.where(idx < cut[:, None], idx, idx - cut[:, None]).astype(np.int32)
  weights = (segment_ids > 0).astype(np.float32)
  return dict(inputs=inputs, targets=targets, segment_ids=segment_ids, positions=positions,
              weights=weights)


def _max_diff(a, b) -> float:
  import jax
  import numpy as np
  diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)
  return max(jax.tree.leaves(diffs))


def _expected_specs(trainer):
  """What LOGICAL_RULES say, read straight from the abstract model's variable metadata."""
  import jax
  from flax import nnx
  from diff_transformer.model import build_model
  from diff_transformer.sharding import logical_to_spec
  abstract = nnx.eval_shape(lambda: build_model(trainer.spec, nnx.Rngs(0)))
  params = nnx.state(abstract, nnx.Param)
  return nnx.to_pure_dict(jax.tree.map(lambda v: logical_to_spec(v.out_sharding), params,
                                      is_leaf=lambda x: isinstance(x, nnx.Variable)))


# One real sharded init per variant (its entry's init_mesh; each compile costs seconds on 2
# cores); the other meshes get the single-device state placed onto the trainer's shardings.


def _sharding_report(trainer, state) -> dict:
  """Params and both Adam moments against the rules, plus shard-shape spot checks."""
  import jax
  expected = _expected_specs(trainer)
  adam = state["opt_state"][1][0]  # chain(clip, adamw) -> adamw's ScaleByAdamState
  wrong = []
  for name, tree in (("params", state["params"]), ("mu", adam.mu), ("nu", adam.nu)):
    actual = dict(jax.tree_util.tree_flatten_with_path(tree)[0])
    for path, spec in jax.tree_util.tree_flatten_with_path(expected)[0]:
      if actual[path].sharding.spec != spec:
        wrong.append(f"{name}{jax.tree_util.keystr(path)}: {actual[path].sharding.spec} != {spec}")
  up = state["params"]["blocks"]["mlp"]["up"]["kernel"]
  emb = adam.mu["embed"]["embedding"]
  return dict(wrong=wrong, up_spec=tuple(up.sharding.spec),
              up_shard=list(up.addressable_shards[0].data.shape), up_shape=list(up.shape),
              emb_mu_spec=tuple(emb.sharding.spec),
              emb_mu_shard=list(emb.addressable_shards[0].data.shape))


def child(out_path: str) -> None:
  import jax
  jax.config.update("jax_num_cpu_devices", 8)
  import numpy as np
  from diff_transformer.runs.checkpoint import Checkpointer
  from diff_transformer.mesh import global_batch, make_mesh
  from diff_transformer.training.step import Trainer
  assert jax.device_count() == 8
  report: dict = {"equality": {}, "shardings": {}, "init": {}, "restore": {}}
  batch_np = synthetic_batch(0)
  one = jax.devices()[:1]
  ref_states = {}
  for variant in VARIANTS:
    ref = Trainer(sharding_config(variant), make_mesh(sharding_config(variant).mesh, devices=one))
    ref_state = ref_states[variant] = ref.init()
    ref_grads, ref_loss = ref.grads(ref_state, global_batch(ref.mesh, batch_np))
    ref_grads, ref_loss = jax.device_get(ref_grads), float(ref_loss)
    host_state = jax.device_get(ref_state)
    for shape in MESHES:
      config = sharding_config(variant, shape, MICRO[shape])
      trainer = Trainer(config, make_mesh(config.mesh))
      key = f"{variant}/{shape}"
      if shape == entry(variant).init_mesh:
        state = trainer.init()  # created sharded in place
        report["init"][key] = dict(
            values=_max_diff(jax.device_get(state["params"]), host_state["params"]),
            **_sharding_report(trainer, state))
      state = jax.device_put(host_state, trainer.state_shardings)
      report["shardings"][key] = _sharding_report(trainer, state)
      if shape not in entry(variant).equality_meshes:
        continue
      grads, loss = trainer.grads(state, global_batch(trainer.mesh, batch_np))
      report["equality"][key] = dict(grads=_max_diff(jax.device_get(grads), ref_grads),
                                     loss=abs(float(loss) - ref_loss))
  # A full train step keeps every array on its sharding (out_shardings), here with 2
  # micro-batches; then cross-mesh restore: save on (4, 2, 1), restore on (2, 2, 2) and 1 device.
  config = sharding_config("diff", (4, 2, 1), micro=2)
  src = Trainer(config, make_mesh(config.mesh))
  state = jax.device_put(jax.device_get(ref_states["diff"]), src.state_shardings)
  state, metrics = src.train_step(state, global_batch(src.mesh, batch_np))
  report["step"] = dict(loss=float(metrics["loss"]), **_sharding_report(src, state))
  workdir = Path(out_path).parent / "cross_mesh"
  saver = Checkpointer(workdir, config.train)
  saver.save(1, state, None)
  saver.close()
  saved = jax.device_get(state)
  (workdir / "config.json").write_text(config.to_json_best_effort())
  from diff_transformer.data import ByteTokenizer, describe
  (workdir / "tokenizer_record.json").write_text(json.dumps(describe(ByteTokenizer())))
  for shape, devices in (((2, 2, 2), None), ((1, 1, 1), one)):
    target_config = sharding_config("diff", shape)
    target = Trainer(target_config, make_mesh(target_config.mesh, devices=devices))
    restored, step = Checkpointer(workdir, read_only=True).restore(target.abstract_state)
    up = restored["params"]["blocks"]["mlp"]["up"]["kernel"]
    report["restore"][str(shape)] = dict(
        step=step, equal=bool(all(jax.tree.leaves(jax.tree.map(
            lambda a, b: bool(np.array_equal(np.asarray(a), b)), jax.device_get(restored),
            saved)))),
        up_spec=tuple(up.sharding.spec), devices=len(up.sharding.device_set))
  from diff_transformer.runs.restore import restore_model
  from flax import nnx
  model, _, step = restore_model(workdir, mesh=make_mesh(sharding_config("diff").mesh, devices=one))
  params = jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  report["restore"]["restore_model"] = dict(step=step, equal=_max_diff(params, saved["params"]))
  Path(out_path).write_text(json.dumps(report))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  out = tmp_path_factory.mktemp("sharding") / "report.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, __file__, str(out)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(out.read_text())


UP = [None, "fsdp", "tensor"]  # (layers, embed, mlp) by the rules
EMB = ["tensor", "fsdp"]  # (vocab, embed)


@pytest.mark.parametrize("variant, shape",
                         [(v, m) for v in VARIANTS for m in entry(v).equality_meshes],
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else x)
def test_sharded_step_equals_single_device(report, variant, shape):
  r = report["equality"][f"{variant}/{tuple(shape)}"]
  assert r["loss"] <= TOL and r["grads"] <= TOL, r


def _check_shardings(r: dict, shape) -> None:
  assert not r["wrong"], r["wrong"][:5]
  _, fsdp, tensor = shape
  # Spot checks independent of the rule table, including the size of each device's shard.
  assert r["up_spec"] == UP and r["emb_mu_spec"] == EMB, r
  assert r["up_shard"] == [r["up_shape"][0], r["up_shape"][1] // fsdp, r["up_shape"][2] // tensor]
  assert r["emb_mu_shard"] == [96 // tensor, 32 // fsdp]


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", VARIANTS)
def test_params_and_moments_follow_rules(report, variant, shape):
  _check_shardings(report["shardings"][f"{variant}/{tuple(shape)}"], shape)


@pytest.mark.parametrize("variant", VARIANTS)
def test_init_is_sharded_in_place_and_equals_single_device(report, variant):
  shape = entry(variant).init_mesh
  r = report["init"][f"{variant}/{shape}"]
  assert r["values"] <= TOL, r["values"]
  _check_shardings(r, shape)


def test_train_step_keeps_shardings(report):
  r = report["step"]
  assert np.isfinite(r["loss"])
  _check_shardings(r, (4, 2, 1))


def test_cross_mesh_restore(report):
  r = report["restore"]
  assert r["(2, 2, 2)"] == dict(step=1, equal=True, up_spec=UP, devices=8)
  assert r["(1, 1, 1)"]["equal"] and r["(1, 1, 1)"]["devices"] == 1
  assert r["restore_model"]["step"] == 1 and r["restore_model"]["equal"] == 0.0


if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  child(sys.argv[1])
