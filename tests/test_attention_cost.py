"""Attention FLOPs of the compiled CPU train step (XLA's cost analysis) against the floor.

Two DIFF V1 train steps with the same tokens per step (B=2, T=256 and B=1, T=512) differ only
in the attention's T^2 work: weights, optimizer, embeddings and loss cost the same, and so does
the einsum path's diagonal-block overhang, which is linear in tokens. The floor of that
difference (DIFF V1, h heads of keys d and values 2d, causal, forward + backward):
3 x (two QK^T maps 2hTd + ONE PV 2hT(2d)) x T/2 per sequence = 3 x 4hT^2d per layer, which
a dense path (2x) or two PV products (1.5x) would miss by far.
"""
import functools

import jax
import jax.numpy as jnp
import pytest

from diff_transformer.config import base_config, validate
from diff_transformer.kernels import executed_flops
from diff_transformer.mesh import batch_sharding, make_mesh
from diff_transformer.training.step import Trainer

H, D_HEAD, LAYERS = 1, 128, 1  # wide heads: the softmax's elementwise work is small next to QK^T


@functools.lru_cache  # the plain B=1, T=512 step serves three tests
def step_flops(kernel: str, batch: int, seq: int, remat: str = "none") -> float:
  c = base_config()
  m = c.model
  m.variant, m.kernel, m.vocab_size, m.d_model, m.num_layers = "diff", kernel, 64, 256, LAYERS
  m.num_heads, m.head_dim, m.ffn_dim, m.max_seq_len = H, D_HEAD, 64, seq
  m.remat = remat
  c.data.seq_len, c.train.global_batch_size = seq, batch
  config = validate(c)
  mesh = make_mesh(config.mesh, devices=jax.devices()[:1])
  trainer = Trainer(config, mesh)
  abstract_batch = {k: jax.ShapeDtypeStruct((batch, seq), dtype, sharding=batch_sharding(mesh))
                    for k, dtype in (("inputs", jnp.int32), ("targets", jnp.int32),
                                     ("segment_ids", jnp.int32), ("positions", jnp.int32),
                                     ("weights", jnp.float32))}
  compiled = trainer.lower_train_step(abstract_batch).compile()
  cost = compiled.cost_analysis()
  return float((cost[0] if isinstance(cost, list) else cost)["flops"])


def floor_train_flops(batch: int, seq: int) -> float:
  # Per layer and sequence, causal: QK^T 2 maps x 2h(T^2/2)d + PV 2h(T^2/2)(2d) = 4hT^2d.
  return LAYERS * 3 * batch * 4 * H * seq ** 2 * D_HEAD


def test_v1_attention_flops_within_10_percent_of_floor():
  measured = step_flops("auto", 1, 512) - step_flops("auto", 2, 256)  # auto: 'xla' on CPU
  floor = floor_train_flops(1, 512) - floor_train_flops(2, 256)
  assert abs(measured / floor - 1) < 0.10, (measured, floor)


def test_executed_flops_counts_the_compiled_attention():
  """kernels.executed_flops (what metrics report) against the compiled einsum call itself."""
  shape = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  q1, k1, v = shape(1, 512, 2, 64), shape(1, 512, 2, 64), shape(1, 512, 2, 128)
  args = (q1, k1, v, q1, k1)
  from diff_transformer.kernels import xla
  # A full cotangent (a sum's constant one lets XLA fold dO V^T away) and the value (without it
  # XLA drops the forward PV product as dead code).
  loss = lambda *a: jnp.sum(xla.attention(*a[:5], 0.5) * a[5])
  fwd_bwd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
  cost = fwd_bwd.lower(*args, shape(1, 512, 2, 128)).compile().cost_analysis()
  compiled = float((cost[0] if isinstance(cost, list) else cost)["flops"])
  counted = executed_flops("xla", q1, k1, v, q1, backward=True)
  # The compiled count adds the softmax's elementwise work (~10 FLOPs per map entry).
  assert 1.0 <= compiled / counted < 1.15, (compiled, counted)


@pytest.mark.parametrize("remat", ["full", "dots_with_no_batch_dims_saveable"])
def test_executed_flops_count_what_remat_recomputes(remat):
  """The compiled step's extra FLOPs under a remat policy against what metrics add for it."""
  import dataclasses
  from diff_transformer.model.attention import make_spec
  from diff_transformer.training.metrics import executed_flops_per_token
  base = make_spec(variant="diff", vocab_size=64, d_model=256, num_layers=LAYERS, num_heads=H,
                   head_dim=D_HEAD, ffn_dim=64, max_seq_len=512)
  spec = lambda r: dataclasses.replace(base, remat=r)
  measured = step_flops("auto", 1, 512, remat) - step_flops("auto", 1, 512)
  counted = 512 * (executed_flops_per_token(spec(remat), 512)[0]
                   - executed_flops_per_token(spec("none"), 512)[0])
  assert counted > 0 and abs(measured / counted - 1) < 0.15, (measured, counted)


def test_auto_choice_per_platform():
  from diff_transformer.kernels import auto
  shape = lambda width, dtype=jnp.bfloat16: jax.ShapeDtypeStruct((1, 8, 2, width), dtype)
  q, k = shape(64), shape(64)
  assert auto.choose(q, k, shape(64)) == "xla"  # this CPU test machine
  assert auto.choose(q, k, shape(64), platform="tpu") == "pallas"
  assert auto.choose(q, k, shape(64), platform="gpu") == "cudnn"
  assert auto.choose(q, k, shape(128), platform="gpu") == "cudnn"  # V1 at d=64: padded to 128
  assert auto.choose(shape(128), shape(128), shape(256), platform="gpu") == "pallas"
  # Hopper (compute capability 9.0): cuDNN up to 256 wide, so V1 at d=96 (values 192) too
  hopper = dict(platform="gpu", compute_capability=9.0)
  assert auto.choose(shape(96), shape(96), shape(192), **hopper) == "cudnn"
  assert auto.choose(shape(128), shape(128), shape(256), **hopper) == "cudnn"
  assert auto.choose(shape(160), shape(160), shape(320), **hopper) == "pallas"
  assert auto.choose(shape(96), shape(96), shape(192), platform="gpu",
                     compute_capability=8.0) == "pallas"
  # Shared DIFF 13.1B's heads of 84 (values 168): padded to 168 cuDNN takes them, but its exact
  # layout calls q/k at 84 wide, which it refuses, so there the fused Pallas kernel runs.
  assert auto.choose(shape(84), shape(84), shape(168), **hopper) == "cudnn"
  assert auto.choose(shape(84), shape(84), shape(168), exact_layout=True, **hopper) == "pallas"
  assert auto.choose(shape(96), shape(96), shape(192), exact_layout=True, **hopper) == "cudnn"
  # An ahead-of-time compile for a GPU chooses for that GPU, not for this host.
  with auto.target_platform("gpu", compute_capability=9.0):
    assert auto.choose(shape(96), shape(96), shape(192)) == "cudnn"
  assert auto.choose(shape(64, jnp.float32), shape(64, jnp.float32), shape(64, jnp.float32),
                     platform="gpu") == "pallas"
  assert auto.choose(q, k, shape(64), platform="tpu", explicit_mask=True) == "xla"
  with auto.target_platform("tpu"):  # an ahead-of-time TPU compile on this CPU host
    assert auto.choose(q, k, shape(64)) == "pallas"
  assert auto.choose(q, k, shape(64)) == "xla"


@pytest.mark.parametrize("packed", [False, True])
def test_cudnn_exact_flops_count_the_calls_its_layout_makes(packed):
  """DIFF V1's exact cuDNN layout: one call over [q1; q2] at the model's widths unpacked; packed,
  the values split into q-wide halves (QK^T twice). The count of what reaches cuDNN (each call a
  one-map attention of its own shapes) is what executed_flops reports."""
  from diff_transformer.kernels import cudnn
  from diff_transformer.kernels.oracle import exact_cpu_attention
  B, T, N, d = 1, 16, 2, 8
  calls = []

  def recording_core(q, k, v, **kw):
    calls.append((q, k, v))
    return exact_cpu_attention(q, k, v, **kw)

  q1, k1 = jnp.ones((B, T, N, d)), jnp.ones((B, T, N, d))
  v = jnp.ones((B, T, N, 2 * d))
  seg = jnp.asarray([[1] * 5 + [2] * 11]) if packed else None
  cudnn.attention(q1, k1, v, q1, k1, 0.5, core=cudnn.equal_widths(recording_core),
                  implementation="xla", segment_ids=seg)
  counted = sum(executed_flops("cudnn", q, k, v_, backward=True, cudnn_exact=True)
                for q, k, v_ in calls)
  assert counted == executed_flops("cudnn", q1, k1, v, q1, backward=True, cudnn_exact=True,
                                   packed=packed)
