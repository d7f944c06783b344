"""The built-in default: a small DIFF V1 model trained on the Shakespeare corpus on CPU.

D=256, 4 layers, 4 differential heads of d=32 (h = D / 2d as in the paper), BPE vocab 8192,
sequence 128, batch 16 x 128 tokens, 450 steps (0.9M tokens, about two thirds of an epoch of
the 1.4M-token training split). Sized to train in about five minutes on 2 CPU cores, ending clearly
below the corpus' unigram baseline (6.33 nats/token for this tokenizer).
"""
from diff_transformer.config import base_config


def get_config():
  c = base_config()
  c.model.variant = "diff"
  c.model.d_model = 256
  c.model.num_layers = 4
  c.model.num_heads = 4
  c.model.head_dim = 32
  c.model.ffn_dim = 704  # 8/3 * 256 = 682.7, rounded up to a multiple of 64
  c.model.vocab_size = 8192
  c.model.max_seq_len = 256
  c.data.seq_len = 128
  c.train.steps = 450
  c.train.global_batch_size = 16
  c.train.lr = 2e-3
  c.train.final_lr = 2e-4
  c.train.warmup_steps = 30
  c.train.log_every = 10
  c.train.eval_every = 150
  c.train.eval_batches = 8
  c.train.checkpoint_every = 150
  c.source = "built-in CPU default; not a paper configuration"
  return c
