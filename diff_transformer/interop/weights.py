"""Exact parameter maps between this codebase and Hugging Face causal LMs (numpy only).

A variant class names its HF target (`Attention.hf_target`, None: not exportable); each target
is one module with its config, to-HF and from-HF maps:

  transformer          -> LlamaForCausalLM       (hf_llama.py)
  diff, shared_diff    -> DiffLlamaForCausalLM   (hf_diff_llama.py)
  diff_v2              -> DiffV2ForCausalLM      (hf_diff_v2.py; its modelling file is bundled
                                                  with the export, see remote/)

This module chooses the target once and maps what every target shares (hf_common.py).
"""
from __future__ import annotations

import numpy as np

from diff_transformer.interop import InteropError, hf_diff_llama, hf_diff_v2, hf_llama
from diff_transformer.interop.hf_common import (SIDECAR, Params, Target, base_config,
                                                layer_from_hf, layer_to_hf)
from diff_transformer.model.attention import known_variant, variant_class, variant_names
from diff_transformer.model.spec import ModelSpec

__all__ = ["SIDECAR", "TARGETS", "architecture", "check_exportable", "check_hf_config",
           "constants", "from_hf", "hf_config", "target", "to_hf"]

TARGETS: dict[str, Target] = {"llama": hf_llama.TARGET, "diff_llama": hf_diff_llama.TARGET,
                              "diff_v2": hf_diff_v2.TARGET}


def target(spec: ModelSpec) -> Target:
  """The variant's HF target, or one line saying it has none."""
  name = variant_class(spec.variant).hf_target if known_variant(spec.variant) else None
  if name not in TARGETS:
    have = [v for v in variant_names() if variant_class(v).hf_target in TARGETS]
    raise InteropError(f"model.variant: '{spec.variant}' has no Hugging Face class to export to "
                       f"or import from (these have: {', '.join(have)})")
  return TARGETS[name]


def architecture(spec: ModelSpec) -> str:
  return target(spec).architecture


def check_exportable(spec: ModelSpec) -> Target:
  """The target, after refusing (one line naming the field) what it cannot represent exactly."""
  t = target(spec)
  if spec.short_conv:
    raise InteropError(f"model.short_conv: {spec.short_conv} (a short convolution before "
                       "attention) has no equivalent in the Hugging Face classes")
  t.check(spec)
  return t


def constants(spec: ModelSpec) -> Params:
  """The non-trained variables (e.g. DIFF's per-layer lambda_init) the target fixes."""
  return target(spec).constants(spec)


def hf_config(spec: ModelSpec, eot_id: int) -> dict:
  """The fields of the target's config.json (architectures and the shape it needs)."""
  t = check_exportable(spec)
  return t.config(spec, base_config(spec, eot_id, t))


def check_hf_config(spec: ModelSpec, cfg: dict, folder) -> None:
  """The HF folder's config must describe exactly the model `spec` builds (one line if not)."""
  want = hf_config(spec, 0)  # refuses what the target class cannot hold
  arch = (cfg.get("architectures") or ["?"])[0]
  if arch != want["architectures"][0]:
    raise InteropError(f"model.variant: {folder} holds a {arch}; variant '{spec.variant}' "
                       f"imports a {want['architectures'][0]}")
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


def to_hf(spec: ModelSpec, params: Params, constants: Params) -> tuple[Params, Params]:
  """(HF tensors by name, sidecar tensors) for the model's parameters (float32 numpy)."""
  t = check_exportable(spec)
  p = {k: np.asarray(v, np.float32) for k, v in params.items()}
  out: Params = {"model.embed_tokens.weight": p["embed.embedding"],
                 "model.norm.weight": p["final_norm.scale"]}
  if not spec.tie_embeddings:
    out["lm_head.weight"] = p["lm_head.kernel"].T
  sidecar = t.sidecar(spec, p, constants)
  for l in range(spec.num_layers):
    a, pre = (lambda name: p[f"blocks.{name}"][l]), f"model.layers.{l}."
    out.update(layer_to_hf(a, pre))
    out.update(t.attention_to_hf(spec, a, pre + "self_attn.", l))
  return out, sidecar


def from_hf(spec: ModelSpec, hf: Params, sidecar: Params | None = None,
            folder: str = "the HF folder") -> Params:
  """Our flat parameters from HF tensors (the inverse of to_hf); a target uses the sidecar's
  tensors only when re-exporting them reproduces the HF tensors bit for bit."""
  t = target(spec)
  t.check_import(spec, sidecar, folder)

  def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in hf:
      raise InteropError(f"{folder}: tensor {name} is missing")
    tensor = np.asarray(hf[name], np.float32)
    if tensor.shape != shape:
      raise InteropError(f"{folder}: tensor {name} has shape {tensor.shape}, this config needs "
                         f"{shape}")
    return tensor

  D, V = spec.d_model, spec.vocab_size
  out: Params = {"embed.embedding": get("model.embed_tokens.weight", (V, D)),
                 "final_norm.scale": get("model.norm.weight", (D,))}
  if not spec.tie_embeddings:
    out["lm_head.kernel"] = get("lm_head.weight", (V, D)).T
  layers: dict[str, list] = {}
  put = lambda name, value: layers.setdefault(name, []).append(value)
  width = t.shapes(spec)
  for l in range(spec.num_layers):
    pre, attn = f"model.layers.{l}.", f"model.layers.{l}.self_attn."
    layer_from_hf(spec, get, pre, put)
    q, k, v = (get(attn + f"{x}_proj.weight", (width[x], D)) for x in "qkv")
    o = get(attn + "o_proj.weight", (D, width["o"]))
    t.attention_from_hf(spec, q, k, v, o, get, attn, put, l)
  out.update({f"blocks.{k}": np.stack(v) for k, v in layers.items()})
  return t.after_import(spec, out, hf, sidecar, to_hf)
