"""Packed rows over cuDNN's packed cap (model.max_segments), decided on the host: the train step
runs the program traced for the exact layout (rows within the cap) or for the padded one (a row
over it), with no cond inside (under autodiff a cond per call keeps both branches' residuals for
every layer), and either gives the step the einsum path gives. On this CPU an exact attention
(kernels/oracle.py) takes cuDNN's place in the exact layout and XLA runs the padded one, as in
the attention tests."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.bench_common import small_config
from diff_transformer.kernels import cudnn
from diff_transformer.kernels.oracle import exact_cpu_attention
from diff_transformer.mesh import global_batch, make_mesh
from diff_transformer.training.step import Trainer

T, CAP = 32, 2


def test_the_host_reads_the_cap_as_the_device_does():
  """cudnn.rows_over_cap (numpy, before the rows reach a device) and packed_segments' over_cap
  agree on random rows of 1 to 6 documents, at the cap and either side of it."""
  rng = np.random.default_rng(0)
  seen = set()
  for _ in range(60):
    seg = 1 + np.cumsum(rng.random((3, T)) < rng.uniform(0.0, 0.2), axis=1).astype(np.int32)
    for cap in (1, 2, 3, 4):
      host = cudnn.rows_over_cap(seg, cap)
      assert host == bool(cudnn.packed_segments(jnp.asarray(seg), cap)[1])
      seen.add(host)
  assert seen == {False, True}


def _rows(documents: int) -> dict:
  """Two rows of `documents` equal documents each, random tokens, positions restarting."""
  rng = np.random.default_rng(documents)
  tokens = rng.integers(0, 256, (2, T + 1), dtype=np.int32)
  segment_ids = np.repeat(np.arange(1, documents + 1), T // documents)[None].repeat(2, 0)
  positions = np.tile(np.arange(T // documents), documents)[None].repeat(2, 0)
  return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:],
              segment_ids=segment_ids.astype(np.int32), positions=positions.astype(np.int32),
              weights=np.ones((2, T), np.float32))


@pytest.fixture
def exact_layout_here(monkeypatch):
  """The exact layout on this CPU: cuDNN's entry answered by an exact attention (recording its
  packed calls), the padded layout through XLA (recording its calls)."""
  calls = {"exact packed": 0, "padded": 0}

  def exact(q, k, v, **kw):
    calls["exact packed"] += kw.get("q_offsets") is not None
    return exact_cpu_attention(q, k, v, **kw)

  padded = cudnn._padded

  def padded_through_xla(*args, **kw):
    calls["padded"] += 1
    return padded(*args, **{**kw, "implementation": "xla"})
  monkeypatch.setattr(cudnn, "exact_reason", lambda: "")
  monkeypatch.setattr(cudnn, "cudnn_exact", exact)
  monkeypatch.setattr(cudnn, "_padded", padded_through_xla)
  return calls


def _trainer(kernel: str) -> Trainer:
  config = small_config("diff", seq_len=T, batch=2, kernel=kernel)
  config.model.max_segments = CAP
  return Trainer(config, make_mesh(config.mesh))


@pytest.mark.parametrize("documents, layout", [(CAP, "exact packed"), (2 * CAP, "padded")])
def test_the_step_for_the_rows_runs_its_layout_and_equals_the_einsum_step(exact_layout_here,
                                                                          documents, layout):
  cudnn_trainer, xla_trainer = _trainer("cudnn"), _trainer("xla")
  rows = _rows(documents)
  assert cudnn_trainer.rows_over_cap(rows) == (documents > CAP)
  assert xla_trainer.rows_over_cap(rows) is None  # no cap on the einsum path
  batch = global_batch(cudnn_trainer.mesh, rows)
  lowered = cudnn_trainer._train_steps[documents > CAP].lower(cudnn_trainer.abstract_state, batch)
  assert "stablehlo.case" not in lowered.as_text() and "stablehlo.if" not in lowered.as_text()
  state, metrics = cudnn_trainer.train_step(cudnn_trainer.init(0), batch, host_batch=rows)
  want_state, want = xla_trainer.train_step(xla_trainer.init(0), batch)
  assert exact_layout_here[layout] > 0
  assert exact_layout_here["padded" if layout == "exact packed" else "exact packed"] == 0
  np.testing.assert_allclose(float(metrics["loss"]), float(want["loss"]), rtol=1e-5)
  for got, ref in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(want_state["params"])):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-4, atol=1e-5)
