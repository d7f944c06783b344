"""DIFF V2 causal LM (diff-transformer export), loaded with trust_remote_code=True.

A Llama decoder (pre-norm blocks, SwiGLU, RMSNorm, rotate-half RoPE, no biases) whose attention is
DIFF V2: 2h query heads over h_kv key/value heads in one causal softmax attention (query head n
reads kv head n // (2h / h_kv)), then out_j = o_{2j} - sigmoid(lambda_j) * o_{2j+1} with
lambda = x W_lambda per token and head (x: the block's normalised input); no sub-layer norm.
The KV cache is a plain Llama cache (h_kv keys and values of width head_dim per token).
"""
import torch
from torch import nn
from transformers import LlamaForCausalLM
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

from .configuration_diff_v2 import DiffV2Config


class DiffV2Attention(nn.Module):
  def __init__(self, config: DiffV2Config, layer_idx: int):
    super().__init__()
    self.config = config
    self.layer_idx = layer_idx
    self.head_dim = config.head_dim
    self.num_query_heads = config.num_attention_heads  # 2h
    self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
    if self.num_query_heads % 2 or self.num_key_value_groups % 2:
      raise ValueError("DIFF V2 needs an even number of query heads per key/value head")
    self.scaling = self.head_dim ** -0.5
    self.attention_dropout = 0.0
    self.is_causal = True
    hidden, heads = config.hidden_size, self.num_query_heads // 2
    self.q_proj = nn.Linear(hidden, self.num_query_heads * self.head_dim, bias=False)
    self.k_proj = nn.Linear(hidden, config.num_key_value_heads * self.head_dim, bias=False)
    self.v_proj = nn.Linear(hidden, config.num_key_value_heads * self.head_dim, bias=False)
    self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)
    self.lambda_proj = nn.Linear(hidden, heads, bias=False)

  def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None,
              past_key_values=None, **kwargs):
    input_shape = hidden_states.shape[:-1]
    shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    # The decoder layer hands the cache over as past_key_values (transformers 5.23) or as cache
    # (5.24 on): take either, or the cache is never filled and each cached step sees only itself.
    cache = cache if cache is not None else past_key_values
    if cache is not None:
      k, v = cache.update(k, v, self.layer_idx)
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                   eager_attention_forward)
    out, weights = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
                          **kwargs)  # [B, T, 2h, d]
    lam = torch.sigmoid(self.lambda_proj(hidden_states).float())[..., None]  # [B, T, h, 1]
    out = (out[:, :, 0::2].float() - lam * out[:, :, 1::2].float()).to(out.dtype)
    return self.o_proj(out.reshape(*input_shape, -1)), weights


class DiffV2ForCausalLM(LlamaForCausalLM):
  config_class = DiffV2Config

  def __init__(self, config: DiffV2Config):
    super().__init__(config)
    for i, layer in enumerate(self.model.layers):
      layer.self_attn = DiffV2Attention(config, i)
    self.post_init()
