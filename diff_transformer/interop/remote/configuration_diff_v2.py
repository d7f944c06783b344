"""Config of a DIFF V2 causal LM exported by diff-transformer (trust_remote_code=True).

Same fields as LlamaConfig: num_attention_heads counts the 2h query heads (h output heads of width
head_dim), num_key_value_heads the h_kv key/value heads.
"""
from transformers import LlamaConfig


class DiffV2Config(LlamaConfig):
  model_type = "diff_v2"
