"""Every variant and kernel against the independent float64 reference
(tests/helpers/np_reference.py)."""
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tests.helpers import np_reference as ref
from diff_transformer import kernels
from diff_transformer.kernels import cudnn, reference
from diff_transformer.kernels.oracle import ARG_NAMES, np_attention
from diff_transformer.model.attention import variant_class
from diff_transformer.model.attention import make_spec
from tests.helpers.variant_table import VARIANTS, entry

D, T, B, LAYER = 64, 12, 2, 3
SEG = np.array([[1] * 5 + [2] * 7, [1] * 12])


def make(variant, kv, seed, **kw):
  heads, d = entry(variant).numerics
  low_rank = {"rank": 6} if variant == "shared_diff" else {}
  spec = make_spec(variant=variant, d_model=D, num_heads=heads, num_kv_heads=kv, head_dim=d,
                   **low_rank, **kw)
  attn = variant_class(variant)(spec, LAYER, rngs=nnx.Rngs(seed))
  # Fresh random values for EVERY parameter (gains and low-rank factors included).
  rng = np.random.default_rng(seed)
  for path, p in nnx.iter_graph(attn):
    if isinstance(p, nnx.Param):
      p[...] = jnp.asarray(rng.normal(0, 0.3, p.shape), jnp.float32)
  return spec, attn


def weights(attn) -> dict[str, np.ndarray]:
  """The module's own parameters, float64, by their paths ('wq/kernel', 'lambda_q1'): the oracle
  reads what the module holds, so a new parameter needs no line here."""
  return {"/".join(map(str, path)): np.asarray(v[...], np.float64)
          for path, v in nnx.to_flat_state(nnx.state(attn, nnx.Param))}


def expected(variant, spec, attn, x, seg):
  return entry(variant).oracle(spec, weights(attn), x, seg, LAYER)


def kernel_oracle(*args, seg, causal):
  """The kernels' float64 oracle's output (kernels/oracle.py) for positional kernel arguments."""
  named = dict.fromkeys(ARG_NAMES) | {n: np.asarray(a, np.float64)
                                      for n, a in zip(ARG_NAMES, args) if a is not None}
  q1, v = named["q1"], named["v"]
  do = np.zeros((*q1.shape[:3], v.shape[-1]))
  return np_attention(named, do, causal=causal, seg=seg)[0]


def rel_err(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


def seed_of(*case) -> int:
  """A fixed seed per case (str hash() is salted per process, so it would not reproduce)."""
  return zlib.crc32(repr(case).encode())


CASES = [(v, kv) for v in VARIANTS for kv in (None, 2)] + [("transformer", 1)]


@pytest.mark.parametrize("kernel", ["reference", "xla", "auto"])
@pytest.mark.parametrize("variant,kv", CASES)
def test_module_matches_float64(variant, kv, kernel):
  spec, attn = make(variant, kv, seed=seed_of(variant, kv, kernel), kernel=kernel)
  x = np.random.default_rng(1).normal(size=(B, T, D))
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))
  for seg in (None, SEG):
    got = attn(jnp.asarray(x, jnp.float32), pos, None if seg is None else jnp.asarray(seg))
    assert rel_err(got, expected(variant, spec, attn, x, seg)) < entry(variant).tolerance


@pytest.mark.parametrize("variant,overrides", [
    ("transformer", dict(head_norm=True)),
    ("diff", dict(subln=False)),
    ("diff", dict(lambda_init=0.5)),
    ("diff", dict(norm_out_scale="0.37")),
    ("diff", dict(lambda_init=0.8, norm_out_scale="1.3")),
    ("diff", dict(lambda_init=0.8, norm_out_scale="layer_rule")),
    ("shared_diff", dict(norm_out_scale="0.2")),
    ("transformer", dict(head_norm=True, norm_out_scale="0.2")),
    # The branch's multiplier without a per-head norm (every variant takes it).
    ("transformer", dict(norm_out_scale="0.5")),
    ("diff", dict(subln=False, norm_out_scale="2.5")),
    ("diff", dict(subln=False, norm_out_scale="layer_rule")),
    ("diff_v2", dict(norm_out_scale="0.3")),
    ("diff_v2", dict(v2_pairing="halves")),
    ("diff_v2", dict(v2_lambda="none")),
    ("diff_v2", dict(v2_lambda="linear")),
])
def test_ablations_match_float64(variant, overrides):
  spec, attn = make(variant, 2, seed=7, **overrides)
  x = np.random.default_rng(2).normal(size=(B, T, D))
  got = attn(jnp.asarray(x, jnp.float32), jnp.broadcast_to(jnp.arange(T), (B, T)), jnp.asarray(SEG))
  assert rel_err(got, expected(variant, spec, attn, x, SEG)) < entry(variant).tolerance


@pytest.mark.parametrize("variant", VARIANTS)
def test_reference_maps_match_float64(variant):
  spec, attn = make(variant, 2, seed=3)
  x = jnp.asarray(np.random.default_rng(4).normal(size=(B, T, D)), jnp.float32)
  p = attn.project(x, jnp.broadcast_to(jnp.arange(T), (B, T)))
  _, maps = reference.attention_maps(p.q1, p.k1, p.v, p.q2, p.k2, p.lam,
                                    segment_ids=jnp.asarray(SEG))
  q1, k1 = np.asarray(p.q1, np.float64), np.asarray(p.k1, np.float64)
  if p.q2 is None:  # a single map: A1 only
    for b in range(B):
      ok = ref.allowed(SEG[b], T)
      for n in range(q1.shape[2]):
        g = n // (q1.shape[2] // k1.shape[2])
        np.testing.assert_allclose(maps["A1"][b, n], ref.softmax_map(
            q1[b, :, n], k1[b, :, g], ok, q1.shape[3] ** -0.5), atol=1e-6)
    return
  q2 = np.asarray(p.q2, np.float64)
  k2 = k1 if p.k2 is None else np.asarray(p.k2, np.float64)
  H, K, dk = q1.shape[2], k1.shape[2], q1.shape[3]
  for b in range(B):
    ok = ref.allowed(SEG[b], T)
    for n in range(H):
      g = n // (H // K)
      for name, q, k in (("A1", q1, k1), ("A2", q2, k2)):
        expected = ref.softmax_map(q[b, :, n], k[b, :, g], ok, dk ** -0.5)
        np.testing.assert_allclose(maps[name][b, n], expected, atol=1e-6)
  lam = np.broadcast_to(np.asarray(p.lam), (B, T, H))
  np.testing.assert_allclose(maps["lambda"], lam, rtol=1e-6)


# 'xla_blocks' runs the causal query blocks (12 rows in blocks of 5: uneven), 'cudnn_layout' the
# padded dot_product_attention layout of the cudnn kernel through XLA, 'cudnn_exact_layout' its
# exact layout (model widths, packed rows) with an exact CPU attention in cuDNN's place (cuDNN
# itself needs a GPU: tools/gpu_check.sh checks the real call against float64 there).
PATHS = {
    "reference": dict(implementation="reference"),
    "xla": dict(implementation="xla"),
    "xla_blocks": dict(implementation="xla", block_q=5),
    "auto": dict(implementation="auto"),
}


# The exact layout with an exact CPU attention in cuDNN's place: its reshapes, map mix and packed
# offsets; at the cap on sequences per row (SEG's first row has 2), and over it (a batch with a
# row over the cap takes the padded layout, here through XLA).
EXACT_LAYOUT = {"cudnn_exact_layout": {}, "cudnn_exact_separate": dict(separate_calls=True),
                "cudnn_exact_at_cap": dict(max_segments=2),
                "cudnn_exact_over_cap": dict(max_segments=1)}


def run_path(path, *args, **kw):
  if path == "cudnn_layout":
    return cudnn.attention(*args, implementation="xla", **kw)
  if path in EXACT_LAYOUT:
    from diff_transformer.kernels.oracle import exact_cpu_attention
    return cudnn.attention(*args, core=cudnn.equal_widths(exact_cpu_attention),
                           implementation="xla", **EXACT_LAYOUT[path], **kw)
  return kernels.attention(*args, **PATHS[path], **kw)


@pytest.mark.parametrize("kernel", [*PATHS, "cudnn_layout", *EXACT_LAYOUT])
@pytest.mark.parametrize("case", ["baseline", "v1", "v2", "mqa"])
def test_kernels_match_float64_on_fresh_inputs(kernel, case):
  rng = np.random.default_rng(seed_of(kernel, case))
  H, K, dk = 4, (1 if case == "mqa" else 2), 8
  dv = 2 * dk if case == "v1" else dk
  q1, q2 = rng.normal(size=(2, B, T, H, dk))
  k1, k2 = rng.normal(size=(2, B, T, K, dk))
  v = rng.normal(size=(B, T, K, dv))
  args = {"baseline": (q1, k1, v), "mqa": (q1, k1, v, q2, None, rng.uniform(size=(B, T, H))),
          "v1": (q1, k1, v, q2, k2, 0.37),
          "v2": (q1, k1, v, q2, None, rng.uniform(size=(B, T, H)))}[case]
  f32 = [None if a is None else jnp.asarray(a, jnp.float32) for a in args]
  for causal in (True, False):
    run = jax.jit(functools.partial(run_path, kernel, causal=causal))
    got = run(*f32, segment_ids=jnp.asarray(SEG))
    assert rel_err(got, kernel_oracle(*args, seg=SEG, causal=causal)) < 1e-5


@pytest.mark.parametrize("path", ["xla", "xla_blocks", "auto", "cudnn_layout",
                                  "cudnn_exact_layout", "cudnn_exact_over_cap"])
@pytest.mark.parametrize("case", ["v1", "v1_mha", "v2", "v2_mqa", "base"])
def test_kernel_gradients_match_float64(path, case):
  """Forward and every input's gradient against the float64 softmax-Jacobian reference."""
  from diff_transformer.kernels.oracle import (  # only this test
      ARG_NAMES, make_inputs, np_attention, scalar_lam_terms)
  variant, kv = {"v1": ("v1", 2), "v1_mha": ("v1", 4), "v2": ("v2", 2), "v2_mqa": ("v2", 1),
                 "base": ("base", 2)}[case]
  args, seg_ids, do = make_inputs(variant, B=2, T=23, N=4, K=kv, d=8, seed=seed_of(path, case),
                                  seg=True)
  names = [n for n in ARG_NAMES if args[n] is not None]

  def loss(*xs):
    full = dict(args, **dict(zip(names, xs)))
    out = run_path(path, *(full[n] for n in ARG_NAMES), segment_ids=jnp.asarray(seg_ids))
    return jnp.sum(out * do), out

  # One compiled program: op-by-op dispatch would compile every op of the forward and backward
  # on its own (several times the CPU time).
  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(names))),
                                               has_aux=True))(*(args[n] for n in names))
  ref_out, ref_grads = np_attention(args, do, causal=True, seg=seg_ids)
  errors = {"out": rel_err(out, ref_out)}
  errors.update({n: rel_err(g, ref_grads[n]) for n, g in zip(names, grads)})
  if "lam" in names and np.ndim(args["lam"]) == 0:  # measured against its terms' sum
    lam_grad = grads[names.index("lam")]
    errors["lam"] = float(abs(lam_grad - ref_grads["lam"])
                          / scalar_lam_terms(args, do, causal=True, seg=seg_ids))
  assert max(errors.values()) < 1e-5, errors


@pytest.mark.parametrize("path", ["xla", "auto", "reference"])
@pytest.mark.parametrize("case", ["v1", "v2", "base"])
def test_explicit_decode_mask_matches_float64(path, case):
  """KV-cache decoding: 3 new queries over 10 cached keys with an explicit [B, T, S] mask."""
  rng = np.random.default_rng(seed_of("mask", path, case))
  H, K, dk, Tq, S = 4, 2, 8, 3, 10
  dv = 2 * dk if case == "v1" else dk
  q1, q2 = rng.normal(size=(2, B, Tq, H, dk))
  k1, k2 = rng.normal(size=(2, B, S, K, dk))
  v = rng.normal(size=(B, S, K, dv))
  lam = {"v1": 0.37, "v2": rng.uniform(size=(B, Tq, H)), "base": None}[case]
  mask = rng.uniform(size=(B, Tq, S)) < 0.6
  mask[..., 0] = True
  args = {"v1": (q1, k1, v, q2, k2, lam), "v2": (q1, k1, v, q2, None, lam),
          "base": (q1, k1, v, None, None, None)}[case]
  f32 = [None if a is None else jnp.asarray(a, jnp.float32) for a in args]
  got = run_path(path, *f32, mask=jnp.asarray(mask))
  want = np.zeros((B, Tq, H, dv))
  for b in range(B):
    for n in range(H):
      g = n // (H // K)
      want[b, :, n] = ref.softmax_map(q1[b, :, n], k1[b, :, g], mask[b], dk ** -0.5) @ v[b, :, g]
      if case != "base":
        kk = k1 if case == "v2" else k2
        lam_t = np.broadcast_to(lam, (B, Tq, H))[b, :, n]
        want[b, :, n] -= lam_t[:, None] * (
            ref.softmax_map(q2[b, :, n], kk[b, :, g], mask[b], dk ** -0.5) @ v[b, :, g])
  assert rel_err(got, want) < 1e-5


def test_packed_segments_give_each_run_its_offset_and_length():
  """cuDNN's packed layout from segment ids: every contiguous run (id 0 included, as the segment
  mask treats it) is a sequence; unused entries are -1."""
  seg = jnp.asarray([[1, 1, 2, 2, 2, 3], [0, 0, 0, 0, 0, 0], [4, 5, 5, 5, 0, 0]], jnp.int32)
  packed, over_cap = cudnn.packed_segments(seg, max_segments=4)
  got = {k: np.asarray(v).tolist() for k, v in packed.items()}
  assert got["q_offsets"] == [[0, 2, 5, -1, -1], [0, -1, -1, -1, -1], [0, 1, 4, -1, -1]]
  assert got["q_seqlen"] == [[2, 3, 1, -1], [6, -1, -1, -1], [1, 3, 2, -1]]
  assert got["kv_offsets"] == got["q_offsets"] and got["kv_seqlen"] == got["q_seqlen"]
  assert not bool(over_cap)
  # At the cap (3 runs, cap 3) the layout is whole; over it (cap 2) the rows are flagged.
  packed, over_cap = cudnn.packed_segments(seg, max_segments=3)
  assert np.asarray(packed["q_seqlen"]).tolist()[0] == [2, 3, 1] and not bool(over_cap)
  assert bool(cudnn.packed_segments(seg, max_segments=2)[1])
  # The cap never exceeds T: offsets [B, T + 1] at most.
  assert cudnn.packed_segments(seg, max_segments=100)[0]["q_offsets"].shape == (3, 7)


@pytest.mark.parametrize("kv_offsets_by_key_heads", [False, True])
@pytest.mark.parametrize("case", ["v1", "v2", "mqa"])
def test_a_packed_cudnn_call_has_every_operand_at_the_query_width(case, kv_offsets_by_key_heads,
                                                                   monkeypatch):
  """jax gives cuDNN one per-token stride for q and the output and one for k and v, both at q's
  head width (and, before jax 0.11.2, q's head count), so the exact layout's packed calls must
  not carry wider values or, there, GQA heads (an unpacked call may); the numbers stay the
  float64 oracle's."""
  monkeypatch.setattr(cudnn, "KV_OFFSETS_BY_KEY_HEADS", kv_offsets_by_key_heads)
  from diff_transformer.kernels.oracle import exact_cpu_attention
  calls = []

  def recording_core(q, k, v, **kw):
    calls.append((q.shape[2:], k.shape[2:], v.shape[2:], kw.get("q_offsets") is not None))
    return exact_cpu_attention(q, k, v, **kw)

  rng = np.random.default_rng(seed_of("packed strides", case))
  H, K, dk = 4, (1 if case == "mqa" else 2), 8
  dv = 2 * dk if case == "v1" else dk
  q1, q2 = jnp.asarray(rng.normal(size=(2, B, T, H, dk)), jnp.float32)
  k1, k2 = jnp.asarray(rng.normal(size=(2, B, T, K, dk)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, T, K, dv)), jnp.float32)
  lam = 0.37 if case == "v1" else jnp.asarray(rng.uniform(size=(B, T, H)), jnp.float32)
  args = (q1, k1, v, q2, k2 if case == "v1" else None, lam)
  for separate in (False, True):
    for seg in (None, jnp.asarray(SEG)):
      got = cudnn.attention(*args, core=cudnn.equal_widths(recording_core),
                            implementation="xla", separate_calls=separate, segment_ids=seg)
      want = kernel_oracle(*args, seg=None if seg is None else SEG, causal=True)
      assert rel_err(got, want) < 1e-5
  packed = [c for c in calls if c[3]]
  assert packed and all(q[1] == k[1] == v[1] for q, k, v, _ in packed), packed  # widths
  assert all(k[0] == v[0] and (k[0] == q[0] or kv_offsets_by_key_heads)
             for q, k, v, _ in packed), packed  # heads
  assert any(k != q or v != q for q, k, v, is_packed in calls if not is_packed)  # unpacked: as is


def test_the_cudnn_kernel_says_once_which_layout_runs_and_why(capsys):
  """On this host (no CUDA GPU) the exact layout is refused with its reason and the padded one
  is chosen; the line comes once per process (the padded call itself then needs a GPU)."""
  why = cudnn.exact_reason()
  assert why and "\n" not in why
  if jax.default_backend() == "cpu":
    assert why == "the backend is cpu, not a CUDA GPU"
  cudnn._SAID.clear()
  q = jnp.ones((1, 4, 2, 8), jnp.bfloat16)
  v = jnp.ones((1, 4, 2, 16), jnp.bfloat16)
  cudnn.attention(q, q, v, q, q, 0.5, implementation="xla")  # a layout test: nothing to say
  assert capsys.readouterr().out == ""
  for _ in range(2):
    with pytest.raises(Exception):  # noqa: B017  (jax refuses cuDNN without a GPU)
      cudnn.attention(q, q, v, q, q, 0.5, implementation="cudnn")
  out = capsys.readouterr().out
  assert out.count("cudnn: padded layout") == 1 and why in out


def test_the_layout_switch_forces_the_padded_layout_and_a_bad_value_is_one_line(monkeypatch):
  """DIFF_TRANSFORMER_CUDNN_LAYOUT=padded: the exact layout is refused with the switch named (so
  a GPU job can run the padded layout without a code edit); any other value fails the config
  check before any work, naming the variable."""
  from diff_transformer.config import base_config, validate
  from diff_transformer.errors import ConfigError
  try:
    monkeypatch.setenv(cudnn.LAYOUT_ENV, "padded")
    assert cudnn.exact_reason() == f"{cudnn.LAYOUT_ENV}=padded forces it"
    monkeypatch.setenv(cudnn.LAYOUT_ENV, "fast")
    with pytest.raises(ConfigError,
                       match=f"^{cudnn.LAYOUT_ENV}: 'fast' is not one of exact, padded"):
      validate(base_config())
  finally:
    monkeypatch.undo()
  assert cudnn.exact_reason() != f"{cudnn.LAYOUT_ENV}=padded forces it"


def test_cudnn_refusal_names_what_cudnn_cannot_take():
  from diff_transformer.kernels import auto
  s = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
  q, v = s(1, 8, 4, 102), s(1, 8, 4, 204)
  assert auto.cudnn_refusal(q, q, v, compute_capability=9.0, exact=True) == (
      "head width 102 (cuDNN takes multiples of 8 up to 256 on this GPU)")
  assert "head width 204" in auto.cudnn_refusal(q, q, v, compute_capability=9.0)
  q, v = s(1, 8, 4, 96), s(1, 8, 4, 192)
  assert auto.cudnn_refusal(q, q, v, compute_capability=9.0, exact=True) == ""
  assert "head width 192" in auto.cudnn_refusal(q, q, v, compute_capability=8.0)
  assert "dtype float32" in auto.cudnn_refusal(s(1, 8, 4, 96, dtype=jnp.float32), q, q)
