"""The fused Pallas kernel inside the whole model: a train step's loss and gradients equal the
xla kernel's (float32, CPU interpret mode), single-device and sharded over fake devices."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.helpers.child_env import fake_devices_env
from tests.helpers.models import loss_and_grads
from tests.helpers.variant_table import VARIANTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_pallas_train_step_equals_xla(variant):
  loss_p, grads_p = loss_and_grads(variant, "pallas")
  loss_x, grads_x = loss_and_grads(variant, "xla")
  assert abs(loss_p - loss_x) / abs(loss_x) < 1e-5
  for gp, gx in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_x)):
    assert np.max(np.abs(gp - gx)) <= 1e-5 * max(np.max(np.abs(gx)), 1e-3)


SHARDED = """
import json, jax, numpy as np, sys
from tests.helpers.models import kernel_config, loss_and_grads
from diff_transformer.mesh import make_mesh
from tests.helpers.models import batch, kernel_config, loss_and_grads
out = {}
for variant in ("diff", "diff_v2"):
  c = kernel_config(variant, "pallas")
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 1, 2
  mha = dict(num_kv_heads=c.model.num_heads)  # kv heads split over the tensor axis too
  loss, grads = loss_and_grads(variant, "pallas", make_mesh(c.mesh), **mha)
  one = make_mesh(kernel_config(variant, "xla").mesh, devices=jax.devices()[:1])
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
