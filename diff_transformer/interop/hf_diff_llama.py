"""DIFF V1 and Shared DIFF as DiffLlamaForCausalLM.

- DiffLlama counts d-wide sub-heads: num_attention_heads = 2h, num_key_value_heads = 2 h_kv. Its
  differential head i takes Q1 = q head i and Q2 = q head i + h (we pair adjacent sub-heads 2i,
  2i+1), K1 = k head g and K2 = k head g + h_kv for its kv group g, and the 2d-wide value
  [v head g; v head g + h_kv] (ours: the 2d-wide value head g).
- DiffLlama's per-head RMSNorm has no gain: ours (one (2d,) gain shared by all heads) is folded
  into o_proj's input columns, and so is a fixed model.norm_out_scale (over DiffLlama's own
  (1 - lambda_init) of the layer). The fold is exact math but not an exact float inverse, so the
  export also writes the unfolded tensors to a sidecar (hf_common.SIDECAR) that makes export ->
  import bitwise; an import uses it only if it reproduces the HF tensors exactly.
- Shared DIFF (a low-rank variant): its effective W_Q1 = W_Q + U_q1 V_q1 (and Q2, K1, K2) are
  materialised, so it is DIFF V1 with full projections; its factors live in the sidecar.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from diff_transformer.interop import InteropError
from diff_transformer.interop.hf_common import (SIDECAR, Get, Layer, Params, Put, Target,
                                                inverse, lambda_init, reexports_exactly,
                                                reorder_heads, rope_rows)
from diff_transformer.model.spec import ModelSpec

LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def _shared(spec: ModelSpec) -> bool:
  """A low-rank variant (its options have the rank of its updates)."""
  return getattr(spec.options, "rank", 0) > 0


def split_half_order(sub_heads: int) -> np.ndarray:
  """Our adjacent sub-heads (2i, 2i+1) -> DiffLlama's halves (i, i + n/2)."""
  return np.concatenate([np.arange(0, sub_heads, 2), np.arange(1, sub_heads, 2)])


def fold_subln(wo_in_out: np.ndarray, gain: np.ndarray, heads: int) -> np.ndarray:
  """HF o_proj [D, h*2d] = our W_O with the shared (2d,) norm gain folded into its inputs."""
  return (wo_in_out * np.tile(gain, heads)[:, None]).T


def out_scale_ratio(spec: ModelSpec, layer: int) -> np.float32:
  """Our multiplier after the sub-layer norm over DiffLlama's (1 - lambda_init): 1 under the
  rule; under a fixed model.norm_out_scale, folded into o_proj like the norm's gain."""
  fixed = spec.options.fixed_norm_out_scale
  return np.float32(1.0 if fixed is None else fixed / (1.0 - lambda_init(layer)))


def _qk(spec: ModelSpec, a: Layer) -> tuple[np.ndarray, np.ndarray]:
  """[2h*d, D] and [2h_kv*d, D] in our adjacent sub-head order (Q1_0, Q2_0, Q1_1, ...)."""
  if not _shared(spec):
    return a("attn.wq.kernel").T, a("attn.wk.kernel").T
  # Shared DIFF: W_Q1 = W_Q + U_q1 V_q1 etc., materialised in float64 and rounded once.
  full = {}
  for name, base in (("q1", "wq"), ("q2", "wq"), ("k1", "wk"), ("k2", "wk")):
    f64 = lambda path: a(path).astype(np.float64)
    w = f64(f"attn.{base}.kernel") + f64(f"attn.u_{name}.kernel") @ f64(f"attn.v_{name}.kernel")
    full[name] = w.astype(np.float32).T
  d = spec.head_dim

  def interleave(first, second):  # heads (A_0, B_0, A_1, B_1, ...)
    D = first.shape[-1]
    return np.stack([first.reshape(-1, d, D), second.reshape(-1, d, D)], 1).reshape(-1, D)

  return interleave(full["q1"], full["q2"]), interleave(full["k1"], full["k2"])


class DiffLlama(Target):
  architecture = "DiffLlamaForCausalLM"
  q_heads_per_head = 2
  sub_heads = 2

  def check(self, spec: ModelSpec) -> None:
    if not spec.options.subln:
      raise InteropError(f"model.{spec.variant}.subln: False (no sub-layer norm) has no "
                         "equivalent in DiffLlamaForCausalLM, which always normalises each head")
    if spec.options.norm_out_scale == "layer_rule":
      raise InteropError(f"model.{spec.variant}.norm_out_scale: layer_rule has no equivalent "
                         "in DiffLlamaForCausalLM (export with rule: the same multiplier where "
                         "lambda_init follows the layer rule)")
    if spec.options.lambda_init is not None:
      raise InteropError(f"model.{spec.variant}.lambda_init: the constant "
                         f"{spec.options.lambda_init} has no equivalent in DiffLlamaForCausalLM "
                         "(0.8 - 0.6 exp(-0.3 l) only)")

  def constants(self, spec: ModelSpec) -> Params:
    return {"blocks.attn.lambda_init": np.asarray(
        [lambda_init(l) for l in range(spec.num_layers)], np.float32)}

  def sidecar(self, spec: ModelSpec, params: Params, constants: Params) -> Params:
    lam0 = np.asarray(constants["blocks.attn.lambda_init"], np.float64)
    if np.abs(lam0 - self.constants(spec)["blocks.attn.lambda_init"]).max() > 1e-6:
      raise InteropError(f"model.{spec.variant}.lambda_init: the run's per-layer lambda_init "
                         "differs from DiffLlama's 0.8 - 0.6 exp(-0.3 l)")
    # What the HF tensors cannot give back bit for bit: the unfolded o_proj and norm gain, and
    # Shared DIFF's base projections and factors.
    keep = (("blocks.attn.w", "blocks.attn.u_", "blocks.attn.v_", "blocks.attn.subln_scale")
            if _shared(spec) else ("blocks.attn.wo.", "blocks.attn.subln_scale"))
    return {k: v for k, v in params.items() if k.startswith(keep) and k != "blocks.attn.wv.kernel"}

  def attention_to_hf(self, spec: ModelSpec, a: Layer, attn: str, layer: int) -> Params:
    d, h, K, rows = spec.head_dim, spec.num_heads, spec.kv_heads, rope_rows(spec)
    q_w, k_w = _qk(spec, a)
    # Our value head g is [first d | second d]; DiffLlama keeps them as heads g and g + h_kv.
    v = a("attn.wv.kernel").T.reshape(K, 2, d, spec.d_model)
    out = {attn + "q_proj.weight": reorder_heads(q_w, split_half_order(2 * h), d, rows),
           attn + "k_proj.weight": reorder_heads(k_w, split_half_order(2 * K), d, rows),
           attn + "v_proj.weight": v.transpose(1, 0, 2, 3).reshape(2 * K * d, spec.d_model),
           attn + "o_proj.weight": fold_subln(a("attn.wo.kernel"), a("attn.subln_scale")
                                              * out_scale_ratio(spec, layer), h)}
    out.update({attn + name: a(f"attn.{name}") for name in LAMBDAS})
    return out

  def attention_from_hf(self, spec: ModelSpec, q, k, v, o, get: Get, attn: str, put: Put,
                        layer: int) -> None:
    d, h, K, D = spec.head_dim, spec.num_heads, spec.kv_heads, spec.d_model
    rows = inverse(rope_rows(spec))
    put("attn.wq.kernel", reorder_heads(q, inverse(split_half_order(2 * h)), d, rows).T)
    put("attn.wk.kernel", reorder_heads(k, inverse(split_half_order(2 * K)), d, rows).T)
    put("attn.wv.kernel", v.reshape(2, K, d, D).transpose(1, 0, 2, 3).reshape(2 * K * d, D).T)
    put("attn.wo.kernel", o.T / out_scale_ratio(spec, layer))
    put("attn.subln_scale", np.ones((2 * d,), np.float32))  # DiffLlama's norm has no gain
    for name in LAMBDAS:
      put(f"attn.{name}", get(attn + name, (d,)))

  def check_import(self, spec: ModelSpec, sidecar: Params | None, folder: str) -> None:
    if _shared(spec) and not sidecar:
      raise InteropError(f"model.variant: {spec.variant} cannot be rebuilt from {folder}'s full "
                         f"projections (no {SIDECAR} from an export); import it as variant=diff")

  def after_import(self, spec: ModelSpec, ours: Params, hf: Params, sidecar: Params | None,
                   to_hf: Callable) -> Params:
    """The sidecar's unfolded attention tensors, if they re-export to exactly the HF tensors."""
    if not sidecar:
      return ours
    candidate = reexports_exactly(spec, ours, hf, sidecar, to_hf, self.constants(spec))
    if candidate is not None:
      return candidate
    if _shared(spec):
      raise InteropError(f"model.variant: the folder's DiffLlama weights no longer match its "
                         f"{spec.variant} sidecar (edited after export?); import it as "
                         "variant=diff")
    print(f"warning: {SIDECAR} does not reproduce the HF weights (edited after export?); using "
          "the HF weights with a unit sub-layer norm gain", flush=True)
    return ours


TARGET = DiffLlama()
