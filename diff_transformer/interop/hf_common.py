"""What every Hugging Face target shares: the RoPE row order, head reordering, the config fields
and the per-layer tensors outside attention (embeddings, norms, SwiGLU), and the `Target` base a
target architecture's module (hf_llama.py, hf_diff_llama.py, hf_diff_v2.py) fills in.

Our parameters are a flat dict of dotted paths ("blocks.attn.wq.kernel", stacked over layers);
HF tensors use transformers' names and [out, in] weights. RoPE: this codebase rotates pairs
(2i, 2i+1) by default, HF pairs (i, i + d/2): each query/key head's rows are permuted (identity
for runs trained with rope_pairs=half).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from diff_transformer.model.spec import ModelSpec

SIDECAR = "diff_transformer_params.safetensors"
RMS_EPS = 1e-5  # model/layers.py NORM_EPS

Params = dict[str, np.ndarray]
Layer = Callable[[str], np.ndarray]  # our stacked parameter "blocks.<name>" at one layer
Get = Callable[[str, tuple[int, ...]], np.ndarray]  # an HF tensor by name, shape-checked
Put = Callable[[str, np.ndarray], None]  # one layer's value of our "blocks.<name>"


def rope_rows(spec: ModelSpec) -> np.ndarray:
  """Row order inside one head that turns our RoPE pairs into HF's rotate-half pairs."""
  d = spec.head_dim
  if spec.rope_pairs == "half":
    return np.arange(d)
  return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def reorder_heads(w_out_in: np.ndarray, head_order, head_dim: int, rows: np.ndarray) -> np.ndarray:
  """[heads*d, D] weight with its heads taken in `head_order` and each head's rows in `rows`."""
  heads = w_out_in.reshape(-1, head_dim, w_out_in.shape[-1])
  return heads[np.asarray(head_order)][:, rows].reshape(-1, w_out_in.shape[-1])


def inverse(order) -> np.ndarray:
  return np.argsort(np.asarray(order))


def lambda_init(layer: int) -> float:
  """DiffLlama's (and DIFF V1's default) per-layer lambda_init, 0-based layer index."""
  return 0.8 - 0.6 * math.exp(-0.3 * layer)


class Target:
  """One HF architecture. The base maps a plain multi-head attention (q, k, v, o projections);
  a target overrides what its attention adds or arranges differently."""
  architecture = ""
  q_heads_per_head = 1  # HF query heads per our head (DIFF V2: 2)
  sub_heads = 1  # HF counts d-wide sub-heads (DiffLlama: 2 per differential head)
  bundled_files: tuple[str, ...] = ()  # modelling files (interop/remote/) copied into the export
  auto_map: dict[str, str] = {}  # how AutoConfig / AutoModel find bundled classes

  def config_class(self):
    """The transformers config class of this architecture (the hf extra's transformers)."""
    import transformers  # the hf extra: loaded only by an export
    return getattr(transformers, self.architecture.replace("ForCausalLM", "Config"))

  def config_object(self, fields: dict):
    """The config object an export writes: its class, architecture and any auto_map."""
    config = self.config_class()(**fields)
    config.architectures = [self.architecture]
    if self.auto_map:
      config.auto_map = dict(self.auto_map)
    return config

  def check(self, spec: ModelSpec) -> None:
    """Refuses, in one line naming the field, what this class cannot represent exactly."""

  def config(self, spec: ModelSpec, cfg: dict) -> dict:
    return cfg

  def constants(self, spec: ModelSpec) -> Params:
    """The model's non-trained variables this target fixes (e.g. DIFF's lambda_init)."""
    return {}

  def sidecar(self, spec: ModelSpec, params: Params, constants: Params) -> Params:
    """Our tensors the HF ones cannot give back bit for bit (written beside the export): W_O
    itself where a fixed model.norm_out_scale is folded into o_proj."""
    if branch_scale(spec) == 1.0:
      return {}
    return {"blocks.attn.wo.kernel": params["blocks.attn.wo.kernel"]}

  def shapes(self, spec: ModelSpec) -> dict[str, int]:
    """Rows of q_proj, k_proj, v_proj and columns of o_proj in the HF tensors."""
    d, h, K = spec.head_dim, spec.num_heads, spec.kv_heads
    return dict(q=self.q_heads_per_head * h * d, k=self.sub_heads * K * d,
                v=self.sub_heads * K * d, o=self.sub_heads * h * d)

  def attention_to_hf(self, spec: ModelSpec, a: Layer, attn: str, layer: int) -> Params:
    """Layer `layer`'s attention tensors under the HF prefix `attn`."""
    del layer
    rows, d = rope_rows(spec), spec.head_dim
    return {attn + "q_proj.weight": reorder_heads(a("attn.wq.kernel").T,
                                                  range(self.q_heads_per_head * spec.num_heads),
                                                  d, rows),
            attn + "k_proj.weight": reorder_heads(a("attn.wk.kernel").T, range(spec.kv_heads),
                                                  d, rows),
            attn + "v_proj.weight": a("attn.wv.kernel").T,
            attn + "o_proj.weight": (a("attn.wo.kernel") * branch_scale(spec)).T}

  def attention_from_hf(self, spec: ModelSpec, q, k, v, o, get: Get, attn: str, put: Put,
                        layer: int) -> None:
    del layer
    rows, d = inverse(rope_rows(spec)), spec.head_dim
    put("attn.wq.kernel", reorder_heads(q, range(self.q_heads_per_head * spec.num_heads), d,
                                        rows).T)
    put("attn.wk.kernel", reorder_heads(k, range(spec.kv_heads), d, rows).T)
    put("attn.wv.kernel", v.T)
    put("attn.wo.kernel", o.T / branch_scale(spec))

  def check_import(self, spec: ModelSpec, sidecar: Params | None, folder: str) -> None:
    """Refuses an import this target cannot rebuild from the folder."""

  def after_import(self, spec: ModelSpec, ours: Params, hf: Params, sidecar: Params | None,
                   to_hf: Callable) -> Params:
    """Our parameters with the sidecar's unfolded tensors, if they re-export to exactly the HF
    tensors (else the HF weights' own unfolding, with a warning)."""
    exact = reexports_exactly(spec, ours, hf, sidecar, to_hf, self.constants(spec))
    if sidecar and exact is None:
      print(f"warning: {SIDECAR} does not reproduce the HF weights (edited after export?); using "
            "the HF weights unfolded", flush=True)
    return exact or ours


def branch_scale(spec: ModelSpec) -> np.float32:
  """A fixed model.norm_out_scale of heads without a per-head norm, which an export folds into
  o_proj (1 under the rule); targets with a norm of their own fold theirs themselves."""
  fixed = spec.options.fixed_norm_out_scale
  return np.float32(1.0 if fixed is None else fixed)


def reexports_exactly(spec: ModelSpec, ours: Params, hf: Params, sidecar: Params | None,
                      to_hf: Callable, constants: Params) -> Params | None:
  """`ours` with the sidecar's tensors, if that re-exports to exactly the HF tensors; else None."""
  if not sidecar:
    return None
  candidate = dict(ours)
  candidate.update({k: np.asarray(v, np.float32) for k, v in sidecar.items()})
  try:
    again, _ = to_hf(spec, candidate, constants)
  except KeyError:
    again = {}
  if again.keys() == hf.keys() and all(np.array_equal(again[k], np.asarray(hf[k], np.float32))
                                       for k in again):
    return candidate
  return None


def base_config(spec: ModelSpec, eot_id: int, target: Target) -> dict:
  """The config.json fields every target shares (a target's `config` adds its own)."""
  return dict(
      architectures=[target.architecture], vocab_size=spec.vocab_size,
      hidden_size=spec.d_model, intermediate_size=spec.ffn_dim,
      num_hidden_layers=spec.num_layers, num_attention_heads=target.sub_heads * spec.num_heads,
      num_key_value_heads=target.sub_heads * spec.kv_heads, head_dim=spec.head_dim,
      hidden_act="silu", max_position_embeddings=spec.max_seq_len, rms_norm_eps=RMS_EPS,
      tie_word_embeddings=spec.tie_embeddings,
      rope_parameters=dict(rope_type="default", rope_theta=float(spec.rope_theta)),
      attention_bias=False, attention_dropout=0.0, bos_token_id=eot_id, eos_token_id=eot_id,
      dtype="float32")


def layer_to_hf(a: Layer, pre: str) -> Params:
  """A block's norms and SwiGLU as HF tensors."""
  out = {pre + "input_layernorm.weight": a("attn_norm.scale"),
         pre + "post_attention_layernorm.weight": a("mlp_norm.scale")}
  for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
    out[pre + f"mlp.{theirs}.weight"] = a(f"mlp.{ours}.kernel").T
  return out


def layer_from_hf(spec: ModelSpec, get: Get, pre: str, put: Put) -> None:
  D, F = spec.d_model, spec.ffn_dim
  put("attn_norm.scale", get(pre + "input_layernorm.weight", (D,)))
  put("mlp_norm.scale", get(pre + "post_attention_layernorm.weight", (D,)))
  put("mlp.gate.kernel", get(pre + "mlp.gate_proj.weight", (F, D)).T)
  put("mlp.up.kernel", get(pre + "mlp.up_proj.weight", (F, D)).T)
  put("mlp.down.kernel", get(pre + "mlp.down_proj.weight", (D, F)).T)
