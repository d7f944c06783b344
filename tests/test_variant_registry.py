"""A fifth variant defined only here: registering it is all it takes to build its presets, check
its config, train, checkpoint and resume, evaluate, and count its parameters and FLOPs."""
from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from configs import synthetic
from diff_transformer import params
from diff_transformer.config import ConfigError, validate
from diff_transformer.evaluation import Settings, evaluate
from diff_transformer.model.attention import (Attention, Projected, register_variant,
                                              unregister_variant)
from diff_transformer.model.spec import ModelSpec
from diff_transformer.training import train
from diff_transformer.training.metrics import attention_flops_per_token

FIXED_LAMBDA = 0.25


class FixedLambdaAttention(Attention):
  """(softmax(Q1 K1^T) - 0.25 softmax(Q2 K2^T)) V: two maps of N heads over 2 x K key groups,
  one d-wide value per kv head, no learned lambda and no sub-layer norm."""
  map_name = "A1 - 0.25 A2"

  def __init__(self, spec, layer_idx, *, rngs):
    super().__init__(spec, layer_idx, rngs=rngs)
    D, N, K, H = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
    self.wq = self._dense(D, 2 * N * H, ("embed", "heads"), rngs)
    self.wk = self._dense(D, 2 * K * H, ("embed", "kv_heads"), rngs)
    self.wv = self._dense(D, K * H, ("embed", "kv_heads"), rngs)
    self.wo = self._dense(N * H, D, ("heads", "embed"), rngs)

  @classmethod
  def cache_layout(cls, spec):
    return (2 * spec.kv_heads, spec.head_dim), (spec.kv_heads, spec.head_dim)

  @classmethod
  def attention_flops(cls, spec, seq_len):
    return 2 * super().attention_flops(spec, seq_len)  # two maps, each QK^T and AV

  def project(self, x_BTD, positions_BT):
    s = self.spec
    q_BTNH = self._rope(self._heads(self.wq(x_BTD), 2 * s.num_heads), positions_BT)
    k_BTKH = self._rope(self._heads(self.wk(x_BTD), 2 * s.kv_heads), positions_BT)
    n, k = s.num_heads, s.kv_heads
    return Projected(q1=q_BTNH[:, :, :n], k1=k_BTKH[:, :, :k], v=self._heads(self.wv(x_BTD), k),
                     q2=q_BTNH[:, :, n:], k2=k_BTKH[:, :, k:],
                     lam=jnp.asarray(FIXED_LAMBDA, jnp.float32))

  def output(self, o_BTNH, p):
    return self.wo(self._merge(o_BTNH))

  def metrics(self, p, weights_BT):
    return {"lambda": p.lam}


@pytest.fixture
def toy_variant():
  register_variant("fixed_lambda", FixedLambdaAttention)
  yield "fixed_lambda"
  unregister_variant("fixed_lambda")


def test_a_registered_variant_runs_everywhere(toy_variant, tmp_path):
  config = synthetic.get_config(f"{toy_variant}-mqar_plain")  # the presets ask the registry
  t = config.train
  t.steps, t.global_batch_size, t.checkpoint_every, t.eval_every = 4, 8, 2, 4
  t.log_every, t.eval_batches = 1, 1
  spec = ModelSpec.from_config(validate(config).model)
  assert spec.num_heads == spec.d_model // spec.head_dim  # the base class's head rule

  counts = params.count(spec)
  D, N, K, H = spec.d_model, spec.num_heads, spec.kv_heads, spec.head_dim
  assert counts["modules"]["blocks.attn"] == spec.num_layers * D * (2 * N * H + 3 * K * H + N * H)
  T = config.data.seq_len
  assert attention_flops_per_token(spec, T) == 0.5 * spec.num_layers * 2 * (2 * T * N * H * 2)

  workdir = tmp_path / "run"
  first = train(config, workdir)
  assert first["step"] == 4 and first["stopped_by"] is None
  t.steps = 6
  resumed = train(config, workdir)  # restores checkpoint step 4 and trains on
  assert resumed["step"] == 6
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  train_steps = [r["step"] for r in rows if r["kind"] == "train"]
  assert train_steps == [1, 2, 3, 4, 5, 6]  # the resumed run started at step 5
  lambdas = [r["lambda/l0"] for r in rows if r["kind"] == "train"]
  assert lambdas == [FIXED_LAMBDA] * 6  # the variant's metrics hook, logged per layer

  results = evaluate(workdir, ["task", "attention"], settings=Settings.for_mode(quick=True))
  assert results["attention"]["map"] == "A1 - 0.25 A2"
  assert results["task"]["step"] == 6 and 0.0 <= results["task"]["accuracy"] <= 1.0


def test_an_unregistered_variant_is_one_config_error(toy_variant):
  config = synthetic.get_config(f"{toy_variant}-mqar_plain")
  unregister_variant(toy_variant)
  with pytest.raises(ConfigError, match="model.variant: unknown variant 'fixed_lambda'"):
    validate(config)


def test_a_variant_name_is_registered_once(toy_variant):
  with pytest.raises(ValueError, match="already registered"):
    register_variant(toy_variant, Attention)
