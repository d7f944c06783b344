"""The fused Pallas kernel inside the whole model: a train step's loss and gradients equal the
xla kernel's (float32, CPU interpret mode), single-device and sharded over fake devices."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import default
from child_env import fake_devices_env
from diff_transformer.config import validate
from diff_transformer.training.mesh import make_mesh
from diff_transformer.training.step import Trainer
from variant_table import VARIANTS, tiny

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(d_model=32, num_layers=2, head_dim=8, ffn_dim=64, vocab_size=96, max_seq_len=40)


def tiny_config(variant: str, kernel: str, **model):
  c = default.get_config()
  c.model.update(TINY)
  c.model.variant, c.model.kernel = variant, kernel
  spec = tiny(variant)  # GQA
  c.model.num_heads, c.model.num_kv_heads, c.model.rank = spec.num_heads, spec.num_kv_heads, spec.rank
  c.model.update(model)
  c.data.seq_len = 40
  c.train.global_batch_size = 4
  return validate(c)


def batch(seed=0, B=4, T=40):
  rng = np.random.default_rng(seed)
  seg = np.repeat(np.array([[1] * 17 + [2] * 23]), B, 0).astype(np.int32)  # packed documents
  pos = np.concatenate([np.arange(17), np.arange(23)])[None].repeat(B, 0).astype(np.int32)
  tok = rng.integers(0, 96, (B, T + 1)).astype(np.int32)
  return dict(inputs=tok[:, :-1], targets=tok[:, 1:], segment_ids=seg, positions=pos,
              weights=np.ones((B, T), np.float32))


def loss_and_grads(variant, kernel, mesh=None, **model):
  config = tiny_config(variant, kernel, **model)
  trainer = Trainer(config, mesh or make_mesh(config.mesh, devices=jax.devices()[:1]))
  state = trainer.init(0)
  grads, loss = trainer.grads(state, batch())
  return float(loss), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("variant", VARIANTS)
def test_pallas_train_step_equals_xla(variant):
  loss_p, grads_p = loss_and_grads(variant, "pallas")
  loss_x, grads_x = loss_and_grads(variant, "xla")
  assert abs(loss_p - loss_x) / abs(loss_x) < 1e-5
  for gp, gx in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_x)):
    assert np.max(np.abs(gp - gx)) <= 1e-5 * max(np.max(np.abs(gx)), 1e-3)


SHARDED = """
import json, jax, numpy as np, sys
sys.path.insert(0, 'tests')
from test_pallas_model import loss_and_grads, tiny_config
from diff_transformer.training.mesh import make_mesh
out = {}
for variant in ("diff", "diff_v2"):
  c = tiny_config(variant, "pallas")
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 1, 2
  mha = dict(num_kv_heads=c.model.num_heads)  # kv heads split over the tensor axis too
  loss, grads = loss_and_grads(variant, "pallas", make_mesh(c.mesh), **mha)
  one = make_mesh(tiny_config(variant, "xla").mesh, devices=jax.devices()[:1])
  ref_loss, ref_grads = loss_and_grads(variant, "xla", one, **mha)
  err = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-3))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)))
  out[variant] = dict(loss=abs(loss - ref_loss) / abs(ref_loss), grads=err)
print(json.dumps(out))
"""


def test_pallas_inside_sharded_step_matches_single_device():
  env = dict(fake_devices_env(4), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", SHARDED], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  errs = json.loads(out.stdout.strip().splitlines()[-1])
  for variant, e in errs.items():
    assert e["loss"] < 1e-5 and e["grads"] < 1e-5, (variant, e)
