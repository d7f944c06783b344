"""The train step compiled for NVIDIA H100s on this CPU host (the gpu-aot extra; nothing runs):
every variant, causal-only and packed, on 1 and 8 GPUs. The optimised HLO must call cuDNN's fused
attention at the model's own widths for every attention (no XLA attention, no dense bias, no
conditional: rows over cuDNN's packed cap run a step of their own), keep its temporaries within a
bound linear in T (which the layout of one cuDNN sequence per token exceeds), and hold the
collectives its mesh implies."""
from __future__ import annotations

import functools

import pytest

from diff_transformer.aot import gpu as gpu_targets

pytestmark = pytest.mark.skipif(bool(gpu_targets.missing_extra()),
                                reason="the gpu-aot extra (pip install -e '.[gpu-aot]'): "
                                + (gpu_targets.missing_extra() or ""))

from configs import scaling  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.aot import inventory, plan  # noqa: E402
from diff_transformer.aot.hlo import Hlo  # noqa: E402
from diff_transformer.config import validate  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS, set_model  # noqa: E402
from diff_transformer.params import heads_for  # noqa: E402

T, D, D_HEAD, FFN, VOCAB, ROWS_PER_GPU = 2048, 384, 96, 1024, 1024, 2


def small_config(variant: str, packed: bool, gpus: int, **model):
  """The 830M preset's head width (96; DIFF V1's values 192) at D=384, one layer, T=2048, as it
  trains on GPUs (bfloat16, FSDP over the GPUs)."""
  c = plan.for_gpus(scaling.get_config(f"{variant}-830m"))
  m = c.model
  heads = heads_for(variant, D, D_HEAD)
  set_model(m, **dict(d_model=D, num_heads=heads, num_kv_heads=heads, head_dim=D_HEAD, ffn_dim=FFN,
                num_layers=1, vocab_size=VOCAB, max_seq_len=T) | model)
  c.data.seq_len, c.data.document_mask = T, packed
  c.train.global_batch_size, c.train.micro_batches = ROWS_PER_GPU * gpus, 1
  return validate(c)


@functools.cache
def compiled(variant: str, packed: bool, gpus: int, **model) -> aot.AotResult:
  result = aot.compile_train_step(small_config(variant, packed, gpus, **model),
                                  aot.target(f"h100:{gpus}", 0.9))
  assert result.compiled, result.error
  return result


def temp_bound(heads: int, d_v: int) -> float:
  """Bytes of temporaries a step may hold, linear in the tokens per GPU: two float32 copies of
  the per-token rows of the logits (vocabulary), the FFN (gate and up), the attention's values
  (both maps) and the residual stream (4 D). The exact layouts hold 1.0-1.35 of one copy (one
  layer); one cuDNN sequence per token holds 4.5, its softmax statistics growing as T^2."""
  tokens = ROWS_PER_GPU * T
  return 2 * tokens * 4 * (VOCAB + 2 * FFN + 2 * heads * d_v + 4 * D)


@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("variant", PAPER_VARIANTS)
def test_every_attention_is_a_cudnn_call_at_the_exact_widths(variant, packed, gpus):
  result = compiled(variant, packed, gpus)
  k = result.kernels
  assert k["classes"]["xla_attention"]["calls"] == 0, k["classes"]
  taken = [c for c in k["cudnn"]["calls"] if c["taken"]]
  assert sorted(c["kind"] for c in taken) == ["Softmax", "SoftmaxBackward"], taken
  for call in taken:
    assert not call["bias"] and call["q"] == call["k"] == D_HEAD, call
    if variant in ("diff", "shared_diff") and not packed:
      assert call["v"] == 2 * D_HEAD  # DIFF V1's values at 2d, q/k at d: nothing padded
    else:
      assert call["v"] == D_HEAD  # packed: values as q-wide halves; V2 and the Transformer: d
    assert call["mask"] == ("PADDING_CAUSAL" if packed else "CAUSAL")
    assert call["max_seg_per_batch"] == (16 if packed else 1)
    assert call["batch"] == ROWS_PER_GPU and call["seq"] == T
    assert call["calls"] == 1  # one layer: one forward and one backward call a step
  # No conditional: the driver reads the rows on the host and runs the step traced for them.
  assert all(c["taken"] for c in k["cudnn"]["calls"]), k["cudnn"]["calls"]
  widest = max(c["v"] * c["heads"] // (2 if packed and variant in ("diff", "shared_diff")
                                         else 1) for c in taken)
  assert 0 < result.temp_gib * aot.GIB <= temp_bound(max(c["heads"] for c in taken), widest)
  assert result.fits and result.margin_gib > 1.0


@pytest.mark.parametrize("variant", ["diff", "transformer"])
def test_the_mesh_implies_its_collectives(variant):
  """One GPU communicates nothing; FSDP over 8 gathers the parameters (bf16 or float32, at least
  their bytes once a step) and reduce-scatters the gradients."""
  assert compiled(variant, True, 1).kernels["collectives"] == {}
  eight = compiled(variant, True, 8)
  assert eight.mesh == {"data": 1, "fsdp": 8, "tensor": 1}
  collectives = eight.kernels["collectives"]
  params_bytes = eight.argument_gib * aot.GIB / 12 * 8  # params + 2 AdamW moments, float32, /8
  assert collectives["all-gather"]["bytes"] >= params_bytes / 2 * 7 / 8, collectives
  assert collectives["reduce-scatter"]["bytes"] > 0 and collectives["all-reduce"]["calls"] > 0


def test_attention_through_xla_is_seen():
  """The check that no attention runs through XLA can fail: the einsum path's score GEMMs
  ([.., T, T]) are classed as XLA attention, and no cuDNN call is left."""
  xla = compiled("diff", False, 1, kernel="xla")
  assert xla.kernels["classes"]["xla_attention"]["calls"] > 0
  assert xla.kernels["cudnn"]["calls"] == []


def test_one_cudnn_sequence_per_token_fails_the_bound():
  """The packed layout before the cap (offsets [B, T + 1]: cuDNN's batch B x T) keeps softmax
  statistics [B T, H, T] float32: quadratic in T, over the linear bound."""
  old = compiled("diff", True, 1, max_segments=T)
  taken = [c for c in old.kernels["cudnn"]["calls"] if c["taken"]]
  assert {c["max_seg_per_batch"] for c in taken} == {T}
  assert old.temp_gib * aot.GIB > temp_bound(max(c["heads"] for c in taken), D_HEAD)


def test_each_scanned_layer_adds_the_same_bytes():
  """A scanned layer's stacked residuals are updated in place, one layer's slice at a time (on
  jax 0.12's XLA by async fusions, fusion-start): the inventory counts that slice, not the whole
  stack, so the bytes a step moves grow linearly with depth (counting the stack, each layer would
  add more than the one before)."""
  moved = {layers: compiled("diff", True, 1, num_layers=layers).kernels["classes"]["other"]["bytes"]
           for layers in (2, 4, 6)}
  first, second = moved[4] - moved[2], moved[6] - moved[4]
  assert first > 0 and abs(second - first) < 0.02 * first, moved


@pytest.mark.parametrize("variant", PAPER_VARIANTS)
def test_a_populations_step_compiles_with_its_attention_through_pallas(variant):
  """Two members vmapped (training/population.py) on packed rows, for one H100: jax's cuDNN
  attention does not batch over members (its batching rule fails on packed rows' offsets, DIFF
  V1's wider values and the padded layout's mask), so a population's 'auto' is the Pallas
  kernel: the step compiles and calls no cuDNN."""
  import jax
  import jax.numpy as jnp
  from diff_transformer.mesh import make_mesh
  from diff_transformer.training.population import Population
  from diff_transformer.training.step import Trainer
  config, where = small_config(variant, True, 1), aot.target("h100:1", 0.9)
  members = Population(Trainer(config, make_mesh(config.mesh, devices=where.devices)),
                       [0, 1], [1.0, 1.0])
  batches = {name: jax.ShapeDtypeStruct((2, ROWS_PER_GPU, T), dtype) for name, dtype in (
      ("inputs", jnp.int32), ("targets", jnp.int32), ("segment_ids", jnp.int32),
      ("positions", jnp.int32), ("weights", jnp.float32))}
  with aot.for_target(where):
    step = members.lower_step(members.abstract_state, batches).compile()
  classes = inventory.inventory(Hlo(step.as_text()))["classes"]
  assert classes["cudnn"]["calls"] == 0 and classes["pallas"]["calls"] > 0, classes


def test_unknown_gpu_and_missing_extra_are_one_line(monkeypatch):
  from diff_transformer.errors import UserError
  with pytest.raises(UserError, match=r"^--topology: 'a100:8' is not a GPU topology.*h100, h200"):
    aot.target("a100:8")
  monkeypatch.setattr(gpu_targets, "missing_extra", lambda: "jax's CUDA plugin is not installed")
  with pytest.raises(UserError, match=r"^--topology: compiling for h200 needs the gpu-aot extra"):
    aot.target("h200:8")
