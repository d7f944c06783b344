"""Tiny model configs for the sharding and kernel-in-the-model tests, and the loss and
gradients of one train step."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from configs import default
from diff_transformer.config import validate
from diff_transformer.mesh import make_mesh
from diff_transformer.model.attention import set_model
from diff_transformer.training.step import Trainer
from tests.helpers.variant_table import entry, tiny


def sharding_config(variant: str, mesh=(1, 1, 1), micro: int = 1):
  from diff_transformer.config import base_config
  c = base_config()
  m = c.model
  m.variant, m.vocab_size, m.d_model, m.num_layers, m.ffn_dim, m.max_seq_len = (
      variant, 96, 32, 2, 64, 16)
  spec = entry(variant).tiny
  m.num_heads, m.num_kv_heads = spec.num_heads, max(2, spec.kv_heads)  # kv heads split by tensor=2
  m.head_dim = 8
  set_model(m, **dataclasses.asdict(spec.options))  # its own keys (Shared DIFF's rank)
  c.data.seq_len = 16
  c.train.global_batch_size = 16
  c.train.micro_batches = micro
  c.train.z_loss = 1e-4  # exercised everywhere
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
  return c


TINY = dict(d_model=32, num_layers=2, head_dim=8, ffn_dim=64, vocab_size=96, max_seq_len=40)


def kernel_config(variant: str, kernel: str, **model):
  c = default.get_config()
  c.model.update(TINY)
  c.model.variant, c.model.kernel = variant, kernel
  spec = tiny(variant)  # GQA
  c.model.num_heads, c.model.num_kv_heads = spec.num_heads, spec.num_kv_heads
  set_model(c.model, **dataclasses.asdict(spec.options), **model)
  c.data.seq_len = 40
  c.train.global_batch_size = 4
  return validate(c)


def batch(seed=0, B=4, T=40):
  rng = np.random.default_rng(seed)
  seg = np.repeat(np.array([[1] * 17 + [2] * 23]), B, 0).astype(np.int32)  # packed documents
  pos = np.concatenate([np.arange(17), np.arange(23)])[None].repeat(B, 0).astype(np.int32)
  tok = rng.integers(0, 96, (B, T + 1)).astype(np.int32)
  return dict(inputs=tok[:, :-1], targets=tok[:, 1:], segment_ids=seg, positions=pos,
              weights=np.ones((B, T), np.float32))


def loss_and_grads(variant, kernel, mesh=None, **model):
  config = kernel_config(variant, kernel, **model)
  trainer = Trainer(config, mesh or make_mesh(config.mesh, devices=jax.devices()[:1]))
  state = trainer.init(0)
  grads, loss = trainer.grads(state, batch())
  return float(loss), jax.tree.map(np.asarray, grads)
