"""Exact parameter maps between this codebase and Hugging Face causal LMs (numpy only).

Targets: `transformer` -> LlamaForCausalLM; `diff`, `shared_diff` -> DiffLlamaForCausalLM;
`diff_v2` -> DiffV2ForCausalLM (the modelling file bundled with the export, see remote/).
Our parameters are a flat dict of dotted paths ("blocks.attn.wq.kernel", stacked over layers);
HF tensors use transformers' names and [out, in] weights.

What the maps have to get right:
- RoPE: this codebase rotates pairs (2i, 2i+1) by default, HF pairs (i, i + d/2): each query/key
  head's rows are permuted (identity for runs trained with rope_pairs=half).
- DiffLlama counts d-wide sub-heads: num_attention_heads = 2h, num_key_value_heads = 2 h_kv. Its
  differential head i takes Q1 = q head i and Q2 = q head i + h (we pair adjacent sub-heads 2i,
  2i+1), K1 = k head g and K2 = k head g + h_kv for its kv group g, and the 2d-wide value
  [v head g; v head g + h_kv] (ours: the 2d-wide value head g).
- DiffLlama's per-head RMSNorm has no gain: ours (one (2d,) gain shared by all heads) is folded
  into o_proj's input columns. The fold is exact math but not an exact float inverse, so the
  export also writes the unfolded tensors to a sidecar (`SIDECAR`) that makes export -> import
  bitwise; an import uses it only if it reproduces the HF tensors exactly.
- Shared DIFF: its effective W_Q1 = W_Q + U_q1 V_q1 (and Q2, K1, K2) are materialised, so it is
  DIFF V1 with full projections; its factors live in the sidecar.
"""
from __future__ import annotations

import math

import numpy as np

from diff_transformer.interop import InteropError
from diff_transformer.model.spec import ModelSpec

ARCHITECTURES = {"transformer": "LlamaForCausalLM", "diff": "DiffLlamaForCausalLM",
                 "shared_diff": "DiffLlamaForCausalLM", "diff_v2": "DiffV2ForCausalLM"}
SIDECAR = "diff_transformer_params.safetensors"
RMS_EPS = 1e-5  # model/layers.py NORM_EPS

Params = dict[str, np.ndarray]


# ---- what a target class can hold exactly -----------------------------------------------------
def check_exportable(spec: ModelSpec) -> None:
  """Refuses, in one line naming the field, what the target class cannot represent exactly."""
  if spec.variant not in ARCHITECTURES:
    raise InteropError(f"model.variant: '{spec.variant}' has no Hugging Face class to export to "
                       f"or import from (these have: {', '.join(ARCHITECTURES)})")
  if spec.short_conv:
    raise InteropError(f"model.short_conv: {spec.short_conv} (a short convolution before "
                       "attention) has no equivalent in the Hugging Face classes")
  if spec.variant in ("diff", "shared_diff"):
    if not spec.subln:
      raise InteropError("model.subln: False (no sub-layer norm) has no equivalent in "
                         "DiffLlamaForCausalLM, which always normalises each head")
    if spec.lambda_init is not None:
      raise InteropError(f"model.lambda_init: the constant {spec.lambda_init} has no equivalent "
                         "in DiffLlamaForCausalLM (0.8 - 0.6 exp(-0.3 l) only)")
  if spec.variant == "diff_v2":
    if spec.v2_pairing != "interleaved":
      raise InteropError(f"model.v2_pairing: '{spec.v2_pairing}' is not exported (the bundled "
                         "DIFF V2 model pairs query heads 2j, 2j+1)")
    if spec.v2_lambda != "sigmoid":
      raise InteropError(f"model.v2_lambda: '{spec.v2_lambda}' is not exported (the bundled "
                         "DIFF V2 model applies sigmoid(x W_lambda))")


def rope_rows(spec: ModelSpec) -> np.ndarray:
  """Row order inside one head that turns our RoPE pairs into HF's rotate-half pairs."""
  d = spec.head_dim
  if spec.rope_pairs == "half":
    return np.arange(d)
  return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def _reorder_heads(w_out_in: np.ndarray, head_order, head_dim: int, rows: np.ndarray) -> np.ndarray:
  """[heads*d, D] weight with its heads taken in `head_order` and each head's rows in `rows`."""
  heads = w_out_in.reshape(-1, head_dim, w_out_in.shape[-1])
  return heads[np.asarray(head_order)][:, rows].reshape(-1, w_out_in.shape[-1])


def _inverse(order) -> np.ndarray:
  return np.argsort(np.asarray(order))


def _split_half_order(sub_heads: int) -> np.ndarray:
  """Our adjacent sub-heads (2i, 2i+1) -> DiffLlama's halves (i, i + n/2)."""
  return np.concatenate([np.arange(0, sub_heads, 2), np.arange(1, sub_heads, 2)])


def lambda_init(layer: int) -> float:
  return 0.8 - 0.6 * math.exp(-0.3 * layer)


# ---- config.json -----------------------------------------------------------------------------
def hf_config(spec: ModelSpec, eot_id: int) -> dict:
  """The fields of the target's config.json (architectures and the shape it needs)."""
  check_exportable(spec)
  sub = 2 if spec.variant in ("diff", "shared_diff") else 1  # DiffLlama counts d-wide sub-heads
  cfg = dict(
      architectures=[ARCHITECTURES[spec.variant]], vocab_size=spec.vocab_size,
      hidden_size=spec.d_model, intermediate_size=spec.ffn_dim,
      num_hidden_layers=spec.num_layers, num_attention_heads=sub * spec.num_heads,
      num_key_value_heads=sub * spec.kv_heads, head_dim=spec.head_dim, hidden_act="silu",
      max_position_embeddings=spec.max_seq_len, rms_norm_eps=RMS_EPS,
      tie_word_embeddings=spec.tie_embeddings,
      rope_parameters=dict(rope_type="default", rope_theta=float(spec.rope_theta)),
      attention_bias=False, attention_dropout=0.0, bos_token_id=eot_id, eos_token_id=eot_id,
      dtype="float32")
  if spec.variant == "diff_v2":
    cfg["num_attention_heads"] = 2 * spec.num_heads  # query heads; h = half of them output
  if spec.variant == "transformer":
    cfg["mlp_bias"] = False
  return cfg


def check_hf_config(spec: ModelSpec, cfg: dict, folder) -> None:
  """The HF folder's config must describe exactly the model `spec` builds (one line if not)."""
  want = hf_config(spec, 0)  # refuses what the target class cannot hold
  arch = (cfg.get("architectures") or ["?"])[0]
  if arch != ARCHITECTURES[spec.variant]:
    raise InteropError(f"model.variant: {folder} holds a {arch}; variant '{spec.variant}' "
                       f"imports a {ARCHITECTURES[spec.variant]}")
  rope = cfg.get("rope_parameters") or dict(rope_type="default", rope_theta=cfg.get("rope_theta"))
  for key in ("rope_type", "rope_theta"):
    if rope.get(key) != want["rope_parameters"][key]:
      raise InteropError(f"model.rope_theta: {folder} has RoPE {key}={rope.get(key)!r}, this "
                         f"config needs {want['rope_parameters'][key]!r}")
  names = dict(vocab_size="vocab_size", hidden_size="d_model", intermediate_size="ffn_dim",
               num_hidden_layers="num_layers", num_attention_heads="num_heads",
               num_key_value_heads="num_kv_heads", head_dim="head_dim",
               tie_word_embeddings="tie_embeddings", hidden_act="(silu activation)",
               rms_norm_eps="(rms norm eps 1e-5)", attention_bias="(no biases)",
               mlp_bias="(no biases)")
  defaults = dict(head_dim=cfg.get("hidden_size", 0) // max(cfg.get("num_attention_heads", 1), 1),
                  num_key_value_heads=cfg.get("num_attention_heads"), tie_word_embeddings=False,
                  attention_bias=False, mlp_bias=False, hidden_act="silu")
  for key, field in names.items():
    if key not in want:
      continue
    have = cfg.get(key, defaults.get(key))
    if key == "rms_norm_eps" and have is not None and abs(have - want[key]) < 1e-12:
      continue
    if have != want[key]:
      raise InteropError(f"model.{field}: {folder}/config.json has {key}={have!r}, this config "
                         f"needs {want[key]!r}")


# ---- export: ours -> HF ----------------------------------------------------------------------
def to_hf(spec: ModelSpec, params: Params, constants: Params) -> tuple[Params, Params]:
  """(HF tensors by name, sidecar tensors) for the model's parameters (float32 numpy)."""
  check_exportable(spec)
  p = {k: np.asarray(v, np.float32) for k, v in params.items()}
  rows = rope_rows(spec)
  d, h, K = spec.head_dim, spec.num_heads, spec.kv_heads
  out: Params = {"model.embed_tokens.weight": p["embed.embedding"],
                 "model.norm.weight": p["final_norm.scale"]}
  if not spec.tie_embeddings:
    out["lm_head.weight"] = p["lm_head.kernel"].T
  sidecar: Params = {}
  if spec.variant in ("diff", "shared_diff"):
    lam0 = np.asarray(constants["blocks.attn.lambda_init"], np.float64)
    want = np.asarray([lambda_init(l) for l in range(spec.num_layers)])
    if np.abs(lam0 - want).max() > 1e-6:
      raise InteropError("model.lambda_init: the run's per-layer lambda_init differs from "
                         "DiffLlama's 0.8 - 0.6 exp(-0.3 l)")
    # What the HF tensors cannot give back bit for bit: the unfolded o_proj and norm gain, and
    # Shared DIFF's base projections and factors.
    keep = (("blocks.attn.wo.", "blocks.attn.subln_scale") if spec.variant == "diff" else
            ("blocks.attn.w", "blocks.attn.u_", "blocks.attn.v_", "blocks.attn.subln_scale"))
    sidecar = {k: v for k, v in p.items() if k.startswith(keep) and k != "blocks.attn.wv.kernel"}
  for l in range(spec.num_layers):
    a, pre = (lambda name: p[f"blocks.{name}"][l]), f"model.layers.{l}."
    out[pre + "input_layernorm.weight"] = a("attn_norm.scale")
    out[pre + "post_attention_layernorm.weight"] = a("mlp_norm.scale")
    for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
      out[pre + f"mlp.{theirs}.weight"] = a(f"mlp.{ours}.kernel").T
    attn = pre + "self_attn."
    if spec.variant in ("transformer", "diff_v2"):
      q_heads = 2 * h if spec.variant == "diff_v2" else h
      out[attn + "q_proj.weight"] = _reorder_heads(a("attn.wq.kernel").T, range(q_heads), d, rows)
      out[attn + "k_proj.weight"] = _reorder_heads(a("attn.wk.kernel").T, range(K), d, rows)
      out[attn + "v_proj.weight"] = a("attn.wv.kernel").T
      out[attn + "o_proj.weight"] = a("attn.wo.kernel").T
      if spec.variant == "diff_v2":
        out[attn + "lambda_proj.weight"] = a("attn.wlambda.kernel").T
      continue
    q_w, k_w = _diff_qk(spec, a)
    out[attn + "q_proj.weight"] = _reorder_heads(q_w, _split_half_order(2 * h), d, rows)
    out[attn + "k_proj.weight"] = _reorder_heads(k_w, _split_half_order(2 * K), d, rows)
    # Our value head g is [first d | second d]; DiffLlama keeps them as heads g and g + h_kv.
    v = a("attn.wv.kernel").T.reshape(K, 2, d, spec.d_model)
    out[attn + "v_proj.weight"] = v.transpose(1, 0, 2, 3).reshape(2 * K * d, spec.d_model)
    out[attn + "o_proj.weight"] = fold_subln(a("attn.wo.kernel"), a("attn.subln_scale"), h)
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
      out[attn + name] = a(f"attn.{name}")
  return out, sidecar


def fold_subln(wo_in_out: np.ndarray, gain: np.ndarray, heads: int) -> np.ndarray:
  """HF o_proj [D, h*2d] = our W_O with the shared (2d,) norm gain folded into its inputs."""
  return (wo_in_out * np.tile(gain, heads)[:, None]).T


def _diff_qk(spec: ModelSpec, a) -> tuple[np.ndarray, np.ndarray]:
  """[2h*d, D] and [2h_kv*d, D] in our adjacent sub-head order (Q1_0, Q2_0, Q1_1, ...)."""
  if spec.variant == "diff":
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


# ---- import: HF -> ours ----------------------------------------------------------------------
def from_hf(spec: ModelSpec, hf: Params, sidecar: Params | None = None,
            folder: str = "the HF folder") -> Params:
  """Our flat parameters from HF tensors (the inverse of to_hf); uses the sidecar's unfolded
  tensors only when re-exporting them reproduces the HF tensors bit for bit."""
  if spec.variant == "shared_diff" and not sidecar:
    raise InteropError(f"model.variant: shared_diff cannot be rebuilt from {folder}'s full "
                       f"projections (no {SIDECAR} from an export); import it as variant=diff")
  rows = _inverse(rope_rows(spec))
  d, h, K, L = spec.head_dim, spec.num_heads, spec.kv_heads, spec.num_layers

  def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in hf:
      raise InteropError(f"{folder}: tensor {name} is missing")
    t = np.asarray(hf[name], np.float32)
    if t.shape != shape:
      raise InteropError(f"{folder}: tensor {name} has shape {t.shape}, this config needs {shape}")
    return t

  D, F, V = spec.d_model, spec.ffn_dim, spec.vocab_size
  out: Params = {"embed.embedding": get("model.embed_tokens.weight", (V, D)),
                 "final_norm.scale": get("model.norm.weight", (D,))}
  if not spec.tie_embeddings:
    out["lm_head.kernel"] = get("lm_head.weight", (V, D)).T
  layers: dict[str, list] = {}
  put = lambda name, value: layers.setdefault(name, []).append(value)
  q_heads = {"transformer": h, "diff_v2": 2 * h}.get(spec.variant, 2 * h)
  k_heads = 2 * K if spec.variant in ("diff", "shared_diff") else K
  v_width = 2 * K * d if spec.variant in ("diff", "shared_diff") else K * d
  o_width = 2 * h * d if spec.variant in ("diff", "shared_diff") else h * d
  for l in range(L):
    pre, attn = f"model.layers.{l}.", f"model.layers.{l}.self_attn."
    put("attn_norm.scale", get(pre + "input_layernorm.weight", (D,)))
    put("mlp_norm.scale", get(pre + "post_attention_layernorm.weight", (D,)))
    put("mlp.gate.kernel", get(pre + "mlp.gate_proj.weight", (F, D)).T)
    put("mlp.up.kernel", get(pre + "mlp.up_proj.weight", (F, D)).T)
    put("mlp.down.kernel", get(pre + "mlp.down_proj.weight", (D, F)).T)
    q = get(attn + "q_proj.weight", (q_heads * d, D))
    k = get(attn + "k_proj.weight", (k_heads * d, D))
    v = get(attn + "v_proj.weight", (v_width, D))
    o = get(attn + "o_proj.weight", (D, o_width))
    if spec.variant in ("transformer", "diff_v2"):
      put("attn.wq.kernel", _reorder_heads(q, range(q_heads), d, rows).T)
      put("attn.wk.kernel", _reorder_heads(k, range(K), d, rows).T)
      put("attn.wv.kernel", v.T)
      put("attn.wo.kernel", o.T)
      if spec.variant == "diff_v2":
        put("attn.wlambda.kernel", get(attn + "lambda_proj.weight", (h, D)).T)
      continue
    put("attn.wq.kernel", _reorder_heads(q, _inverse(_split_half_order(2 * h)), d, rows).T)
    put("attn.wk.kernel", _reorder_heads(k, _inverse(_split_half_order(2 * K)), d, rows).T)
    put("attn.wv.kernel", v.reshape(2, K, d, D).transpose(1, 0, 2, 3).reshape(2 * K * d, D).T)
    put("attn.wo.kernel", o.T)
    put("attn.subln_scale", np.ones((2 * d,), np.float32))  # DiffLlama's norm has no gain
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
      put(f"attn.{name}", get(attn + name, (d,)))
  out.update({f"blocks.{k}": np.stack(v) for k, v in layers.items()})
  if sidecar and spec.variant in ("diff", "shared_diff"):
    out = _apply_sidecar(spec, out, hf, sidecar)
  return out


def _apply_sidecar(spec: ModelSpec, ours: Params, hf: Params, sidecar: Params) -> Params:
  """The sidecar's unfolded attention tensors, if they re-export to exactly the HF tensors."""
  candidate = dict(ours)
  candidate.update({k: np.asarray(v, np.float32) for k, v in sidecar.items()})
  constants = {"blocks.attn.lambda_init": np.asarray(
      [lambda_init(l) for l in range(spec.num_layers)], np.float32)}
  try:
    again, _ = to_hf(spec, candidate, constants)
  except KeyError:
    again = {}
  if again.keys() == hf.keys() and all(np.array_equal(again[k], np.asarray(hf[k], np.float32))
                                       for k in again):
    return candidate
  if spec.variant == "shared_diff":
    raise InteropError("model.variant: the folder's DiffLlama weights no longer match its "
                       "shared_diff sidecar (edited after export?); import it as variant=diff")
  print(f"warning: {SIDECAR} does not reproduce the HF weights (edited after export?); using "
        "the HF weights with a unit sub-layer norm gain", flush=True)
  return ours
