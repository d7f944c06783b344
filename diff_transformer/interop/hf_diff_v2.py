"""DIFF V2 as DiffV2ForCausalLM (the modelling file bundled with the export, see remote/): 2h
query heads in our order (pairs 2j, 2j+1), and the per-token lambda projection."""
from __future__ import annotations

from diff_transformer.interop import InteropError
from diff_transformer.interop.hf_common import Get, Layer, Params, Put, Target
from diff_transformer.model.spec import ModelSpec


class DiffV2(Target):
  architecture = "DiffV2ForCausalLM"
  q_heads_per_head = 2
  bundled_files = ("configuration_diff_v2.py", "modeling_diff_v2.py")
  auto_map = {"AutoConfig": "configuration_diff_v2.DiffV2Config",
              "AutoModelForCausalLM": "modeling_diff_v2.DiffV2ForCausalLM"}

  def config_class(self):
    """The bundled config class (the export copies its file beside the weights)."""
    # the bundled file imports transformers (the hf extra): loaded only by an export
    from diff_transformer.interop.remote.configuration_diff_v2 import DiffV2Config
    return DiffV2Config

  def check(self, spec: ModelSpec) -> None:
    if spec.options.v2_pairing != "interleaved":
      raise InteropError(f"model.{spec.variant}.v2_pairing: '{spec.options.v2_pairing}' is not "
                         "exported (the bundled DIFF V2 model pairs query heads 2j, 2j+1)")
    if spec.options.v2_lambda != "sigmoid":
      raise InteropError(f"model.{spec.variant}.v2_lambda: '{spec.options.v2_lambda}' is not "
                         "exported (the bundled DIFF V2 model applies sigmoid(x W_lambda))")

  def config(self, spec: ModelSpec, cfg: dict) -> dict:
    return dict(cfg, num_attention_heads=2 * spec.num_heads)  # query heads; h of them output

  def attention_to_hf(self, spec: ModelSpec, a: Layer, attn: str, layer: int) -> Params:
    return dict(super().attention_to_hf(spec, a, attn, layer),
                **{attn + "lambda_proj.weight": a("attn.wlambda.kernel").T})

  def attention_from_hf(self, spec: ModelSpec, q, k, v, o, get: Get, attn: str, put: Put,
                        layer: int) -> None:
    super().attention_from_hf(spec, q, k, v, o, get, attn, put, layer)
    put("attn.wlambda.kernel", get(attn + "lambda_proj.weight", (spec.num_heads,
                                                                  spec.d_model)).T)


TARGET = DiffV2()
