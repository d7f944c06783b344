"""Fused differential Pallas kernel vs an independent float64 numpy reference (forward + grads).

Interpret mode on CPU. The numpy reference below is written from the formulas (README 'The
variants', kernels/common.py) with an explicit softmax-Jacobian backward, and is itself checked
against finite differences. Lowering for TPU/Triton and sharding run in subprocesses (fresh jax).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from tests.helpers.child_env import fake_devices_env
from diff_transformer.kernels.pallas import attention
from diff_transformer.kernels.oracle import ARG_NAMES, make_inputs, np_attention

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ float64 numpy reference


# ------------------------------------------------------------------------------ test inputs


def rel_err(x, ref) -> float:
  x = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
  return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def check(variant, *, causal, seg, tol, dtype=jnp.float32, **kw):
  shape_kw = {k: kw.pop(k) for k in ("B", "T", "N", "K", "d", "seed") if k in kw}
  args, seg_ids, do = make_inputs(variant, seg=seg, dtype=dtype, **shape_kw)
  names = [n for n in ARG_NAMES if args[n] is not None]
  sid = None if seg_ids is None else jnp.asarray(seg_ids)

  def loss(*xs):
    full = dict(args, **dict(zip(names, xs)))
    out = attention(*(full[n] for n in ARG_NAMES), segment_ids=sid, causal=causal, **kw)
    return jnp.sum(out.astype(jnp.float32) * do), out

  # One compiled program (op-by-op dispatch would compile each op of both passes on its own).
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(names))),
                                               has_aux=True))(*(args[n] for n in names))
  ref_out, ref_grads = np_attention(args, do, causal=causal, seg=seg_ids)
  errors = {"out": rel_err(out, ref_out)}
  errors.update({n: rel_err(g, ref_grads[n]) for n, g in zip(names, grads)})
  assert max(errors.values()) < tol, errors
  return errors


# ------------------------------------------------------------------------------------ tests


def test_numpy_reference_matches_finite_differences():
  """The reference's hand-written backward is right (central differences in float64)."""
  for variant in ("v1", "v2"):
    args, seg_ids, do = make_inputs(variant, B=1, T=6, N=2, K=1, d=3, seed=3, seg=True)
    args = {n: None if a is None else np.asarray(a, np.float64) for n, a in args.items()}
    _, grads = np_attention(args, do, causal=True, seg=seg_ids)
    for name in grads:
      x = args[name]
      flat_idx = ([(0,) * x.ndim] if x.ndim == 0
                  else [np.unravel_index(i, x.shape) for i in (0, x.size // 2, x.size - 1)])
      for idx in flat_idx:
        eps, plus, minus = 1e-6, dict(args), dict(args)
        plus[name], minus[name] = x.copy(), x.copy()
        plus[name][idx] += eps
        minus[name][idx] -= eps
        f = lambda a: np.sum(np_attention(a, do, causal=True, seg=seg_ids)[0] * do)
        numeric = (f(plus) - f(minus)) / (2 * eps)
        assert abs(numeric - grads[name][idx]) < 1e-6 * max(1.0, abs(numeric)), (variant, name, idx)


# (variant, heads N/K, causal, segments, T, block_q, block_k): every variant meets MHA/GQA/MQA,
# causal and not, with/without segments, lengths that are not multiples of the blocks.
F32_CASES = [
    ("v1", 4, 2, True, False, 40, 16, 16),
    ("v1", 2, 2, False, True, 37, 8, 16),
    ("v1", 4, 1, True, True, 64, 32, 16),
    ("v1", 4, 4, True, False, 130, 32, 32),
    ("v2", 4, 2, True, True, 50, 16, 8),
    ("v2", 4, 1, False, False, 33, 16, 16),
    ("v2", 2, 2, True, False, 64, 64, 64),
    ("v2", 4, 2, False, True, 130, 64, 32),
    ("base", 4, 2, True, True, 45, 16, 16),
    ("base", 2, 2, False, False, 20, 8, 8),
    ("base", 4, 1, True, False, 70, 32, 64),
]


@pytest.mark.parametrize("variant,N,K,causal,seg,T,bq,bk", F32_CASES)
def test_float32_interpret_matches_numpy(variant, N, K, causal, seg, T, bq, bk):
  check(variant, N=N, K=K, T=T, causal=causal, seg=seg, tol=1e-5, block_q=bq, block_k=bk,
        backend="tpu")


@pytest.mark.parametrize("variant,causal,seg", [("v1", True, True), ("v2", False, True),
                                                ("base", True, False)])
def test_triton_variant_interpret_matches_numpy(variant, causal, seg):
  check(variant, N=4, K=2, T=45, d=16, causal=causal, seg=seg, tol=1e-5, block_q=16,
        block_k=32, backend="triton")


@pytest.mark.parametrize("variant,backend", [("v1", "tpu"), ("v2", "tpu"), ("base", "triton")])
def test_bfloat16_matches_numpy(variant, backend):
  check(variant, N=4, K=2, T=50, d=16, causal=True, seg=True, tol=1e-2, dtype=jnp.bfloat16,
        block_q=16, block_k=16, backend=backend)


def test_batch_and_default_blocks():
  check("v2", B=2, N=4, K=2, T=24, causal=True, seg=True, tol=1e-5)


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_strict_tpu_interpreter(variant):
  """TPU-semantics interpreter: raises on out-of-bounds reads, detects races between cores."""
  strict = pltpu.InterpretParams(detect_races=True, out_of_bounds_reads="raise")
  check(variant, N=2, K=1, T=20, causal=True, seg=True, tol=1e-5, block_q=8, block_k=8,
        backend="tpu", interpret=strict)


def test_explicit_mask_is_refused():
  args, _, _ = make_inputs("base", T=8)
  with pytest.raises(NotImplementedError, match="mask"):
    attention(*(args[n] for n in ARG_NAMES), mask=jnp.ones((1, 8, 8), bool))


def test_registry_dispatches_to_pallas():
  from diff_transformer.kernels import attention as dispatch
  args, seg_ids, do = make_inputs("v2", T=24)
  out = dispatch(*(args[n] for n in ARG_NAMES), implementation="pallas", causal=True)
  ref, _ = np_attention(args, do, causal=True)
  assert rel_err(out, ref) < 1e-5


def _run(code_or_args: list[str], extra_env: dict | None = None) -> subprocess.CompletedProcess:
  path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # keep what is there
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path, **(extra_env or {}))
  return subprocess.run([sys.executable, *code_or_args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)


SHARDED_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from diff_transformer.kernels.pallas import attention, sharded_attention
    assert len(jax.devices()) == 4
    mesh = jax.make_mesh((2, 2), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    rng = np.random.default_rng(0)
    B, T, N, K, d = 2, 24, 4, 2, 8
    x = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
    q1, k1, v, q2, lam = x(B, T, N, d), x(B, T, K, d), x(B, T, K, d), x(B, T, N, d), x(B, T, N)
    seg = jnp.asarray(np.repeat([[0, 1, 1]], B, 0).repeat(8, 1), jnp.int32)
    act = NamedSharding(mesh, P("data", None, "model", None))
    args = [jax.device_put(a, act) for a in (q1, k1, v, q2)]
    lam_s = jax.device_put(lam, NamedSharding(mesh, P("data", None, "model")))
    seg_s = jax.device_put(seg, NamedSharding(mesh, P("data", None)))
    fn = sharded_attention(mesh, "data", "model", block_q=8, block_k=8)
    loss = lambda f: (lambda q1, k1, v, q2, lam, seg:
                      jnp.sum(f(q1, k1, v, q2, None, lam, segment_ids=seg) ** 2))
    with jax.set_mesh(mesh):
      out = jax.jit(lambda *a: fn(*a[:4], None, a[4], segment_ids=a[5]))(*args, lam_s, seg_s)
      grads = jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2, 3, 4)))(*args, lam_s, seg_s)
    ref = attention(q1, k1, v, q2, None, lam, segment_ids=seg, block_q=8, block_k=8)
    ref_grads = jax.grad(loss(lambda *a, **k: attention(*a, block_q=8, block_k=8, **k)),
                         argnums=(0, 1, 2, 3, 4))(q1, k1, v, q2, lam, seg)
    assert out.sharding.spec == P("data", None, "model", None), out.sharding
    err = max([float(jnp.abs(out - ref).max())]
              + [float(jnp.abs(a - b).max()) for a, b in zip(grads, ref_grads)])
    assert err < 1e-5, err
    print("SHARDED_OK", err)
""")


def test_sharded_attention_on_fake_devices():
  proc = _run(["-c", SHARDED_SCRIPT], {"XLA_FLAGS": fake_devices_env(4)["XLA_FLAGS"]})
  assert proc.returncode == 0 and "SHARDED_OK" in proc.stdout, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def lowered(tmp_path_factory) -> dict:
  """One run of benchmarks/lower_kernels.py: TPU/Triton lowering, plus the v5e AOT compile
  where libtpu is installed (the script records it as skipped otherwise)."""
  out = tmp_path_factory.mktemp("lower") / "lower.json"
  proc = _run(["benchmarks/lower_kernels.py", "--json", str(out)])
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return json.loads(out.read_text())


def test_lowering_tpu_mosaic_and_gpu_triton(lowered):
  rows = lowered["lowering"]
  assert {r["platform"] for r in rows} == {"tpu", "cuda"}
  assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]


def test_tpu_aot_compile_v5e(lowered):
  pytest.importorskip("libtpu", reason="AOT TPU compile needs libtpu (pip install 'jax[tpu]')")
  rows = lowered["aot"]
  assert rows and all(r["ok"] for r in rows), rows
  # What XLA reserves per chip for the arguments is what their shard shapes say (plus alignment
  # padding): the wrapper shards batch and heads instead of gathering them onto each chip.
  for r in rows:
    expected, got = r["expected_argument_bytes"], r["memory"]["argument_size_in_bytes"]
    assert expected <= got <= expected + 4096, r
