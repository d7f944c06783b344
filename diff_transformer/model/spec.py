"""ModelSpec: the model's hyper-parameters as a frozen (hashable, static) dataclass."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import ml_collections


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  variant: str = "diff"
  vocab_size: int = 8192
  d_model: int = 256
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int | None = None
  head_dim: int = 32
  ffn_dim: int = 704
  rope_theta: float = 10_000.0
  rope_pairs: str = "interleaved"
  tie_embeddings: bool = False
  max_seq_len: int = 256
  kernel: str = "xla"
  dtype: str = "float32"
  remat: str = "none"
  init_std: float = 0.02
  subln: bool = True
  lambda_init: float | None = None
  lambda_std: float = 0.1
  rank: int = 0
  lowrank_init: str = "fan_in"
  v2_pairing: str = "interleaved"
  v2_lambda: str = "sigmoid"
  short_conv: int = 0

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict) -> "ModelSpec":
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in model.to_dict().items() if k in fields})

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)
