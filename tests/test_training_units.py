"""Small, fast pieces of training: schedule, decay masks, mesh resolution and checks, FLOPs."""
from __future__ import annotations

import jax
import ml_collections
import pytest

from diff_transformer.config import base_config
from diff_transformer.model.attention import VARIANTS
from diff_transformer.params import heads_for, set_rank
from tests.helpers.toy_variant import TOY_PATH
from tests.helpers.variant_table import entry


def test_schedule_warmup_then_linear_decay_to_floor():
  from diff_transformer.training.optim import learning_rate_schedule
  t = base_config().train
  t.update(dict(lr=3.2e-4, final_lr=1.28e-5, warmup_steps=1000, steps=40000))
  lr = learning_rate_schedule(t)
  assert float(lr(0)) == pytest.approx(3.2e-4 / 1000, rel=1e-5)
  assert float(lr(499)) == pytest.approx(3.2e-4 / 2, rel=1e-5)
  assert float(lr(999)) == pytest.approx(3.2e-4, rel=1e-5)
  assert float(lr(1000 + 19500)) == pytest.approx((3.2e-4 + 1.28e-5) / 2, rel=1e-5)
  assert float(lr(40000)) == pytest.approx(1.28e-5, rel=1e-5)
  assert float(lr(50000)) == pytest.approx(1.28e-5, rel=1e-5)  # an extended run stays at the floor


# The parameters AdamW must not decay with the default decay flags come from the variant table
# (tests/helpers/variant_table.py `undecayed`: the norm gains and lambdas), written out by hand;
# the toy variant's here.
TOY_UNDECAYED = frozenset({"blocks/attn/out_gain"})
EVERY_VARIANT_HAS = {"embed/embedding", "final_norm/scale", "blocks/attn_norm/scale",
                     "blocks/mlp_norm/scale"}


def _flat(tree) -> dict[str, object]:
  return {"/".join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("variant", [*VARIANTS, TOY_PATH])
def test_decay_mask_comes_from_variable_types(variant, request):
  """With decay off for norms, lambdas and embeddings, exactly the hand-listed parameters are
  left out; with it on, everything is decayed. No parameter name is read: the types say it."""
  from flax import nnx
  from diff_transformer.model import build_model
  from diff_transformer.model.attention import spec_from_config, unregister_variant
  from diff_transformer.training.optim import decay_mask
  from tests.helpers.models import sharding_config  # after the env of conftest
  request.addfinalizer(lambda: unregister_variant(TOY_PATH))  # naming it registered it
  c = sharding_config("transformer")
  c.model.variant = variant
  c.model.num_heads = heads_for(variant, c.model.d_model, c.model.head_dim)
  set_rank(c.model, 4)
  abstract = nnx.eval_shape(lambda: build_model(spec_from_config(c.model), nnx.Rngs(0)))
  params = nnx.state(abstract, nnx.Param)
  t = c.train
  t.decay_norms = t.decay_lambda = t.decay_embeddings = False
  mask = _flat(decay_mask(params, t))
  undecayed = TOY_UNDECAYED if variant == TOY_PATH else entry(variant).undecayed
  assert {name for name, decayed in mask.items() if not decayed} == (
      undecayed | EVERY_VARIANT_HAS), variant
  t.decay_norms = t.decay_lambda = t.decay_embeddings = True
  assert all(_flat(decay_mask(params, t)).values())
  t.decay_norms, t.decay_lambda, t.decay_embeddings = True, False, False  # one flag per role
  assert {n for n, d in _flat(decay_mask(params, t)).items() if not d} == (
      {n for n in undecayed if "lambda" in n} | {"embed/embedding"})


def test_a_new_role_is_one_class():
  """A role a variant defines for itself (here: a frozen table, never decayed) needs no change
  to the optimizer or the config: its class says it."""
  from flax import nnx
  from diff_transformer.training.optim import decay_mask

  class NeverDecayed(nnx.Param):
    decay = False

  class Toy(nnx.Module):
    def __init__(self):
      self.w = nnx.Param(jax.numpy.ones((2, 2)))
      self.table = NeverDecayed(jax.numpy.ones((3,)))

  t = base_config().train
  assert _flat(decay_mask(nnx.state(Toy(), nnx.Param), t)) == {"w": True, "table": False}


def test_mesh_shape_resolution_and_errors():
  from diff_transformer.mesh import TrainError, mesh_shape
  m = ml_collections.ConfigDict(dict(data=-1, fsdp=2, tensor=2))
  assert mesh_shape(m, 8) == (2, 2, 2)
  with pytest.raises(TrainError, match="does not divide the 6 devices"):
    mesh_shape(ml_collections.ConfigDict(dict(data=-1, fsdp=4, tensor=1)), 6)
  with pytest.raises(TrainError, match="at most one axis may be -1"):
    mesh_shape(ml_collections.ConfigDict(dict(data=-1, fsdp=-1, tensor=1)), 8)
  with pytest.raises(TrainError, match="= 4 but 8 devices"):
    mesh_shape(ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=1)), 8)


def test_flops_count_causal_attention_maxtext_way():
  from diff_transformer.model.attention import make_spec
  from diff_transformer.training.metrics import (attention_flops_per_token, matmul_params,
                                                 train_flops_per_token)
  spec = make_spec(variant="transformer", vocab_size=100, d_model=64, num_layers=2,
                   num_heads=4, head_dim=16, ffn_dim=128, max_seq_len=128)
  per_layer_weights = 4 * 64 * 64 + 3 * 64 * 128
  assert matmul_params(spec) == 2 * per_layer_weights + 64 * 100  # LM head, not the lookup
  # QK^T and AV: 2 * 2 * T * heads * head_dim per token, halved for causal masking.
  assert attention_flops_per_token(spec, 128) == 2 * 0.5 * (4 * 128 * 4 * 16)
  assert train_flops_per_token(spec, 128) == 6 * matmul_params(spec) + 3 * 2 * 0.5 * (
      4 * 128 * 4 * 16)
  diff = make_spec(variant="diff", vocab_size=100, d_model=64, num_layers=2, num_heads=2,
                   head_dim=16, ffn_dim=128, max_seq_len=128)
  # Two maps per head: QK^T over d, AV over 2d.
  assert attention_flops_per_token(diff, 128) == 2 * 0.5 * (
      2 * 2 * 128 * 2 * 16 + 2 * 2 * 128 * 2 * 32)


def test_unknown_logical_axis_name_is_an_error():
  from diff_transformer.sharding import BATCH, LENGTH, logical_to_spec
  assert logical_to_spec((BATCH, None, LENGTH)) == jax.sharding.PartitionSpec(("data", "fsdp"),
                                                                               None, None)
  with pytest.raises(ValueError, match="unknown logical axis name"):
    logical_to_spec((BATCH, "bacth"))


def test_trainer_logits_are_the_models_own():
  import numpy as np
  from diff_transformer.mesh import make_mesh
  from diff_transformer.training.step import Trainer
  c = base_config()
  c.model.update(dict(variant="diff_v2", vocab_size=64, d_model=32, num_layers=1, num_heads=2,
                      head_dim=16, ffn_dim=64, max_seq_len=16))
  c.mesh.data = 1
  trainer = Trainer(c, make_mesh(c.mesh))
  state = trainer.init(seed=1)
  tokens_BT = np.arange(24, dtype=np.int32).reshape(2, 12)
  logits_BTV = trainer.logits(state, {"inputs": tokens_BT})
  assert logits_BTV.shape == (2, 12, 64)
  np.testing.assert_allclose(logits_BTV, trainer.model(state)(tokens_BT), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_diff_v2_lambda_metric_is_the_forwards_weighted_mean(micro_batches):
  import numpy as np
  from diff_transformer.mesh import make_mesh
  from diff_transformer.training.step import Trainer
  c = base_config()
  c.model.update(dict(variant="diff_v2", vocab_size=64, d_model=32, num_layers=2, num_heads=2,
                      head_dim=16, ffn_dim=64, max_seq_len=16))
  c.mesh.data, c.train.global_batch_size, c.train.micro_batches = 1, 4, micro_batches
  trainer = Trainer(c, make_mesh(c.mesh))
  state = trainer.init(seed=3)
  rng = np.random.default_rng(0)
  tokens_BT = rng.integers(0, 64, (4, 12)).astype(np.int32)
  weights_BT = (rng.random((4, 12)) < 0.6).astype(np.float32)  # uneven real tokens per row
  batch = dict(inputs=tokens_BT, targets=np.roll(tokens_BT, -1, 1), weights=weights_BT,
               positions=np.tile(np.arange(12, dtype=np.int32), (4, 1)),
               segment_ids=np.ones((4, 12), np.int32))
  # Independently: the analysis forward's per-token lambda [L, B, T, h], averaged over real tokens.
  _, aux = trainer.model(state)(tokens_BT, batch["positions"], batch["segment_ids"], capture=True)
  lam_LBTN = np.asarray(aux["lambda"])
  expected_L = (lam_LBTN * weights_BT[None, :, :, None]).sum((1, 2, 3)) / (weights_BT.sum() * 2)
  _, metrics = trainer.train_step(state, batch)
  np.testing.assert_allclose(np.asarray(metrics["layers"]["lambda"]), expected_L, rtol=1e-5)


def test_deterministic_training_asks_xla_before_the_backend_starts(monkeypatch):
  """train.deterministic adds XLA's deterministic-ops flag once, before any device is touched;
  once the backend has started it is refused in one line (the flag would be ignored)."""
  import os
  import subprocess
  import sys
  from pathlib import Path
  import jax
  from diff_transformer.errors import TrainError
  from diff_transformer.mesh import request_determinism
  code = ("import os; from diff_transformer.mesh import request_determinism as r; "
          "print(r(False), r(True), r(True), os.environ['XLA_FLAGS'])")
  root = Path(__file__).resolve().parents[1]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env=dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=str(root)), check=True)
  assert out.stdout.split() == ["False", "True", "False", "--xla_gpu_deterministic_ops=true"]
  jax.devices()  # the backend has started in this process
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  with pytest.raises(TrainError, match="train.deterministic: the device backend already started"):
    request_determinism(True)
  assert not request_determinism(False)


def test_without_the_document_mask_a_packed_row_is_one_causal_sequence():
  """data.document_mask=False (the DIFF paper's training): a row of packed documents attends
  causally end to end with positions 0..T-1, which is the masked step on one document a row;
  with the mask the documents' losses differ from that."""
  import numpy as np
  from diff_transformer.mesh import make_mesh
  from diff_transformer.training.step import Trainer
  c = base_config()
  c.model.update(dict(variant="diff", vocab_size=64, d_model=32, num_layers=1, num_heads=1,
                      head_dim=16, ffn_dim=64, max_seq_len=16))
  c.mesh.data, c.train.global_batch_size = 1, 2
  rng = np.random.default_rng(5)
  tokens_BT = rng.integers(0, 64, (2, 12)).astype(np.int32)
  seg_BT = np.asarray([[1] * 5 + [2] * 7, [1] * 3 + [2] * 4 + [3] * 5], np.int32)
  starts = np.asarray([[0] * 5 + [5] * 7, [0] * 3 + [3] * 4 + [7] * 5])
  packed = dict(inputs=tokens_BT, targets=np.roll(tokens_BT, -1, 1),
                weights=np.ones((2, 12), np.float32), segment_ids=seg_BT,
                positions=(np.arange(12) - starts).astype(np.int32))
  one_document = dict(packed, segment_ids=np.ones((2, 12), np.int32),
                      positions=np.tile(np.arange(12, dtype=np.int32), (2, 1)))
  masked = Trainer(c, make_mesh(c.mesh))
  state = masked.init(seed=2)
  c.data.document_mask = False
  causal = Trainer(c, make_mesh(c.mesh))
  assert not causal.packed_rows and masked.packed_rows
  got = causal.eval_step(state, packed)[0]
  np.testing.assert_allclose(got, masked.eval_step(state, one_document)[0], rtol=1e-6)
  assert abs(float(got) - float(masked.eval_step(state, packed)[0])) > 1e-4
