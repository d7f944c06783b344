"""The Transformer as LlamaForCausalLM: plain multi-head (GQA) attention, the base map."""
from __future__ import annotations

from diff_transformer.interop import InteropError
from diff_transformer.interop.hf_common import Target
from diff_transformer.model.spec import ModelSpec


class Llama(Target):
  architecture = "LlamaForCausalLM"

  def check(self, spec: ModelSpec) -> None:
    if spec.options.head_norm:
      raise InteropError(f"model.{spec.variant}.head_norm: a per-head output norm has no "
                         "equivalent in LlamaForCausalLM")

  def config(self, spec: ModelSpec, cfg: dict) -> dict:
    return dict(cfg, mlp_bias=False)


TARGET = Llama()
