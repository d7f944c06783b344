"""The train step's cuDNN calls, proven on CPU: the step is lowered for a CUDA GPU here
(benchmarks/lower_cudnn.py; nothing compiles) and its `__cudnn$fmha` calls are read back: which
calls, their widths, the mask, no dense bias in the exact layout, and every operand and result
under a byte bound linear in T. The layout before the cap on sequences per row (one cuDNN
sequence per token) must fail that bound."""
from __future__ import annotations

import jax
import pytest

from benchmarks.lower_cudnn import STEPS, check, fmha_calls, lowered_step, summary
from diff_transformer.kernels import auto, cudnn
from diff_transformer.model.attention import PAPER_VARIANTS, spec_from_config
from diff_transformer.model.attention import kernel_inputs

# The 830M step at 2K and the 3B steps at 2K and 4K, as the GPU jobs train them.
CASES = list(STEPS)
HEAD_WIDTH = {"830m": 96, "3b": 128}


@pytest.mark.parametrize("size,seq_len,batch", CASES)
@pytest.mark.parametrize("variant", PAPER_VARIANTS)
@pytest.mark.parametrize("packed", [False, True])
def test_the_train_step_lowers_to_cudnn_calls_that_fit(variant, size, seq_len, batch, packed):
  row = summary(variant, size, seq_len, batch, packed)
  if variant == "shared_diff" and size == "3b":
    # Shared DIFF's 3B heads are 102 wide: cuDNN refuses them, and the check names the width.
    assert "102" in row["error"] or "204" in row["error"], row
    from benchmarks.bench_common import paper_config
    spec = spec_from_config(paper_config(variant, seq_len=seq_len, batch=batch, layers=1,
                                         size=size).model)
    p = kernel_inputs(spec, seq_len, batch)
    assert "head width 102" in auto.cudnn_refusal(p.q1, p.k1, p.v, compute_capability=9.0,
                                                  exact=True)
    return
  assert "error" not in row, row
  d = HEAD_WIDTH[size]
  exact = [k for k in row["calls"] if "Bias" not in k]
  assert exact == ["Softmax", "SoftmaxBackward"], row["calls"]  # one call, forward and backward
  w = row["widths"]
  assert w["q"] == w["k"] == d
  if variant in ("diff", "shared_diff") and not packed:
    assert w["v"] == 2 * d  # DIFF V1's values at 2d, q/k at d: no padding
  else:
    assert w["v"] == d  # packed: values as q-wide halves (cudnn.equal_widths)
  if packed:
    # The step for rows within the cap: the packed layout alone (rows over the cap run a
    # step of their own, the padded layout, decided on the host).
    assert row["mask_types"] == ["PADDING_CAUSAL"]
    assert row["max_seg_per_batch"] == cudnn.MAX_SEGMENTS
  else:
    assert row["mask_types"] == ["CAUSAL"] and row["max_seg_per_batch"] == 1
  assert not any("Bias" in k for k in row["calls"])
  assert row["problems"] == []


def test_one_cudnn_sequence_per_token_fails_the_bound():
  """Offsets of shape [B, T + 1] (the cap at T) make cuDNN's batch B * T: the softmax statistics
  [B * T, H, T] float32 are 4 GiB a layer at the 830M step, and the modelled dQ accumulator
  hundreds of GiB; the check refuses both."""
  size, seq_len, batch = STEPS[0]
  calls = fmha_calls(lowered_step("diff", size, seq_len, batch, packed=True,
                                  max_segments=seq_len))
  forward = next(c for c in calls if c["kind"] == "Softmax")
  assert forward["max_seg_per_batch"] == seq_len
  assert forward["results"][1]["shape"] == [batch * seq_len, 32, seq_len]
  problems = check(calls)
  assert any("4.00 GiB exceeds the linear bound" in p for p in problems), problems
  assert any("dQ accumulator" in p for p in problems), problems


def test_the_lowering_leaves_this_process_as_it_was():
  """The answered queries are restored: here the exact layout is refused again."""
  lowered_step("transformer", *STEPS[0][:2], 1, packed=False)
  assert cudnn.exact_reason() != "" or jax.default_backend() == "gpu"


@pytest.mark.parametrize("packed", [False, True])
def test_the_layout_switch_lowers_the_padded_layout(monkeypatch, packed):
  """DIFF_TRANSFORMER_CUDNN_LAYOUT=padded on a GPU: DIFF V1's q/k padded to the values' 192,
  and packed rows as a dense mask (a bias operand) instead of cuDNN's packed layout."""
  monkeypatch.setenv(cudnn.LAYOUT_ENV, "padded")
  size, seq_len, batch = STEPS[0]
  calls = fmha_calls(lowered_step("diff", size, seq_len, batch, packed=packed))
  assert sorted(c["kind"] for c in calls) == (
      ["ScaleBiasSoftmax", "ScaleBiasSoftmaxBackward"] if packed
      else ["Softmax", "SoftmaxBackward"])
  forward = next(c for c in calls if not c["backward"])
  q, k, v = (forward["operands"][i]["shape"][3] for i in range(3))
  assert q == k == v == 2 * HEAD_WIDTH["830m"]
  assert forward["max_seg_per_batch"] in (0, 1)

