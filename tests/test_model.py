"""Whole-model properties: causality, packing, lambda, finite forward/backward in f32 and bf16,
the blocks scanned or unrolled alike."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from diff_transformer import kernels
from diff_transformer.model import build_model, split_params
from diff_transformer.model.decoder import unrolled
from diff_transformer.model.layers import NORM_EPS, rms_normalize
from diff_transformer.model.attention import LayerConstant, set_model
from tests.helpers.variant_table import VARIANTS, tiny

T = 16


@pytest.fixture(scope="module", params=VARIANTS)
def model(request):
  return build_model(tiny(request.param), nnx.Rngs(0))


@pytest.fixture(scope="module")
def forward():
  return nnx.jit(lambda m, tok, pos, seg: m(tok, pos, seg))


def test_causal(model, forward):
  tok = jax.random.randint(jax.random.key(1), (2, T), 0, 97)
  pos = jnp.broadcast_to(jnp.arange(T), (2, T))
  base = forward(model, tok, pos, None)
  t = 9
  changed = forward(model, tok.at[:, t].set((tok[:, t] + 1) % 97), pos, None)
  np.testing.assert_array_equal(base[:, :t], changed[:, :t])
  assert float(jnp.abs(base[:, t:] - changed[:, t:]).max()) > 1e-4


def test_packed_segments_do_not_attend_across(model, forward):
  seg = jnp.asarray([[1] * 6 + [2] * 10, [1] * 3 + [2] * 5 + [3] * 8])
  pos = jnp.asarray([list(range(6)) + list(range(10)),
                     list(range(3)) + list(range(5)) + list(range(8))])
  tok = jax.random.randint(jax.random.key(2), (2, T), 0, 97)
  base = forward(model, tok, pos, seg)
  other = forward(model, tok.at[:, :3].set((tok[:, :3] + 5) % 97), pos, seg)  # only segment 1
  np.testing.assert_array_equal(base[0, 6:], other[0, 6:])
  np.testing.assert_array_equal(base[1, 3:], other[1, 3:])
  # A packed document equals the same document run alone.
  alone = forward(model, tok[:1, 6:], jnp.arange(10)[None], None)
  np.testing.assert_allclose(base[0, 6:], alone[0], atol=2e-5)


def test_lambda_init_by_layer_and_lambda_vectors_std_point_one():
  # head_dim 128 over 8 layers: 4096 lambda-vector entries pin the std; d_model is not the point.
  spec = dataclasses.replace(tiny("diff"), num_layers=8, head_dim=128, num_heads=2)
  m = build_model(spec, nnx.Rngs(0))
  got = np.asarray(m.blocks.attn.lambda_init[...])
  np.testing.assert_allclose(got[[0, 1, 2, 5]], [0.2, 0.3555, 0.4707, 0.6661], atol=5e-5)
  assert isinstance(m.blocks.attn.lambda_init, LayerConstant)
  vals = np.concatenate([np.asarray(getattr(m.blocks.attn, n)[...]).ravel()
                         for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")])
  assert vals.size == 8 * 4 * 128 and 0.09 < vals.std() < 0.11
  const = build_model(spec.replace(lambda_init=0.8), nnx.Rngs(0))
  np.testing.assert_allclose(np.asarray(const.blocks.attn.lambda_init[...]), 0.8)


def test_diff_v2_lambda_varies_per_token_and_head():
  m = build_model(tiny("diff_v2"), nnx.Rngs(0))
  tok = jax.random.randint(jax.random.key(3), (1, T), 0, 97)
  _, aux = m(tok, capture=True)
  lam = np.asarray(aux["lambda"])  # [L, B, T, h]
  assert lam.shape == (2, 1, T, 4)
  assert lam.std(axis=2).min() > 1e-3 and lam.std(axis=3).min() > 1e-3
  assert ((lam > 0) & (lam < 1)).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_and_grad_finite(variant, dtype):
  m = build_model(dataclasses.replace(tiny(variant), dtype=dtype, remat="full"), nnx.Rngs(0))
  tok = jax.random.randint(jax.random.key(4), (2, T), 0, 97)

  @nnx.jit
  def loss_and_grad(m, tok):
    def loss_fn(m):
      logits = m(tok[:, :-1])
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, 1:, None], -1))
    return nnx.value_and_grad(loss_fn)(m)

  loss, grads = loss_and_grad(m, tok)
  assert np.isfinite(float(loss)) and abs(float(loss) - np.log(97)) < 0.5
  leaves = jax.tree.leaves(nnx.state(grads, nnx.Param))
  assert all(bool(jnp.isfinite(g).all()) for g in leaves)
  # float32 parameters whatever the compute dtype
  assert all(g.dtype == jnp.float32 for g in leaves)
  assert sum(float(jnp.abs(g).sum()) > 0 for g in leaves) == len(leaves)


def _initial_logit_rms(preset: str, **model) -> float:
  """rms of the initial attention logits q.k/sqrt(d) on random tokens, over three init seeds."""
  from configs import synthetic as presets
  from diff_transformer.evaluation import outliers
  from diff_transformer.model.attention import spec_from_config
  c = presets.get_config(preset)
  set_model(c.model, **model)
  return outliers.initial_logit_rms(spec_from_config(c.model), 256, rows=2, T=48)


def test_shared_diff_default_init_starts_at_diff_v1_logit_scale():
  """The default lowrank_init keeps Shared DIFF's initial attention logits within 2x of DIFF
  V1's; the old fan_in default started them ~50x larger (docs/results/shared_diff_init.md)."""
  diff = _initial_logit_rms("diff-mqar")
  shared = _initial_logit_rms("shared_diff-mqar")
  assert 0.5 < shared / diff < 2.0, (shared, diff)
  assert _initial_logit_rms("shared_diff-mqar", lowrank_init="fan_in") / diff > 10


@pytest.mark.parametrize("variant", VARIANTS)
def test_scanned_and_unrolled_blocks_compute_the_same_model(variant):
  """model.layer_loop changes how the blocks run, not what they compute or how their parameters
  are stored: one set of stacked parameters gives the same loss and gradients both ways (to
  float32 rounding), and the same KV-cache decoding; only the scanned program loops."""
  spec = dataclasses.replace(tiny(variant), num_layers=3)
  tok = jax.random.randint(jax.random.key(5), (2, T), 0, 97)
  results, decoded = {}, {}
  for loop in ("scan", "unroll"):
    m = build_model(dataclasses.replace(spec, layer_loop=loop), nnx.Rngs(0))
    _, cache = m.prefill(tok[:, :8], T)
    decoded[loop] = m.decode(tok[:, 8:10], cache)[0]
    graph, param_variables, constants = split_params(m)
    params, rest = nnx.to_pure_dict(param_variables), nnx.to_pure_dict(constants)  # a state's

    def loss(params, rest, graph=graph):
      logits = nnx.merge(graph, params, rest)(tok[:, :-1])
      return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, 1:, None], -1))

    results[loop] = jax.jit(jax.value_and_grad(loss))(params, rest)
    text = jax.jit(loss).lower(params, rest).as_text()
    assert ("stablehlo.while" in text) == (loop == "scan"), loop
  np.testing.assert_allclose(decoded["scan"], decoded["unroll"], rtol=1e-5, atol=1e-5)
  (loss_scan, grads_scan), (loss_unroll, grads_unroll) = results["scan"], results["unroll"]
  assert jax.tree.structure(grads_scan) == jax.tree.structure(grads_unroll)
  np.testing.assert_allclose(float(loss_scan), float(loss_unroll), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_scan), jax.tree.leaves(grads_unroll)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_auto_unrolls_on_cpu_only():
  spec = tiny("diff")
  assert unrolled(spec) == (jax.default_backend() == "cpu")
  with kernels.auto.target_platform("tpu"):  # an AOT compile for a TPU keeps the loop
    assert not unrolled(spec)
  assert not unrolled(dataclasses.replace(spec, layer_loop="scan"))
  assert unrolled(dataclasses.replace(spec, layer_loop="unroll"))


def _rms_loss_f64(x, scale, w):
  """sum(RMSNorm(x) * w) in float64, from the formula."""
  return float(np.sum(x / np.sqrt(np.mean(x * x, -1, keepdims=True) + NORM_EPS) * scale * w))


@pytest.mark.parametrize("with_scale", [True, False])
def test_rms_norm_gradient_is_the_formulas_and_keeps_x_in_its_own_dtype(with_scale):
  """RMSNorm's backward (a custom VJP) against central differences of the float64 formula, in
  float32 and bfloat16; under bf16 it saves x itself for the backward, not a float32 copy."""
  rng = np.random.default_rng()
  x, w = rng.normal(size=(2, 3, 16)), rng.normal(size=(2, 3, 16))
  scale = rng.normal(size=16) if with_scale else np.ones(16)
  h, want_x, want_scale = 1e-6, np.zeros_like(x), np.zeros_like(scale)
  for i in np.ndindex(x.shape):
    e = np.zeros_like(x)
    e[i] = h
    want_x[i] = (_rms_loss_f64(x + e, scale, w) - _rms_loss_f64(x - e, scale, w)) / (2 * h)
  for i in range(16):
    e = np.zeros(16)
    e[i] = h
    want_scale[i] = (_rms_loss_f64(x, scale + e, w) - _rms_loss_f64(x, scale - e, w)) / (2 * h)
  for dtype, tol in ((jnp.float32, 1e-4), (jnp.bfloat16, 5e-2)):
    xs, ss = jnp.asarray(x, dtype), jnp.asarray(scale, jnp.float32)
    loss = lambda x_, s_: jnp.sum(rms_normalize(x_, s_ if with_scale else None).astype(
        jnp.float32) * jnp.asarray(w, jnp.float32))
    got_x, got_scale = jax.grad(loss, (0, 1))(xs, ss)
    assert got_x.dtype == dtype
    np.testing.assert_allclose(np.asarray(got_x, np.float64), want_x, atol=tol * 4, rtol=tol)
    if with_scale:
      np.testing.assert_allclose(np.asarray(got_scale), want_scale, atol=tol * 4, rtol=tol)
  _, backward = jax.vjp(lambda x_: rms_normalize(x_, jnp.asarray(scale, jnp.float32)),
                        jnp.asarray(x, jnp.bfloat16))
  saved = [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(backward)]
  assert (x.shape, jnp.bfloat16) in saved and (x.shape, jnp.float32) not in saved, saved
