"""Learning: on the built-in corpus (Shakespeare, default BPE tokenizer) every variant's loss
falls in a short run, and the run leaves a restorable checkpoint and its logs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.helpers.variant_table import VARIANTS, entry

STEPS = 25


def short_config(variant: str):
  from diff_transformer.config import base_config, validate
  from diff_transformer.model.attention import set_model
  c = base_config()  # data: the default corpus and tokenizer
  m = c.model
  m.variant, m.d_model, m.num_layers, m.ffn_dim, m.max_seq_len, m.head_dim = (
      variant, 64, 2, 192, 64, 16)
  m.num_heads, m.num_kv_heads = entry(variant).learning_heads
  set_model(m, **dict(entry(variant).learning_options))  # its own options (its section)
  c.data.seq_len = 64
  c.train.update(dict(steps=STEPS, global_batch_size=8, lr=3e-3, final_lr=1e-3, warmup_steps=5,
                      log_every=1, eval_every=STEPS, eval_batches=2, checkpoint_every=1000))
  return validate(c)


@pytest.fixture(scope="module", autouse=True)
def default_corpus():
  """The built-in corpus prepared once, as train.py does on first use (under a lock the test
  workers share), so this module passes when run alone."""
  from filelock import FileLock
  from diff_transformer.data import ensure_prepared
  from diff_transformer.data.common import cache_root
  data = short_config("diff").data
  root = cache_root(data.cache_dir)
  root.mkdir(parents=True, exist_ok=True)
  with FileLock(str(root / "shakespeare.lock")):
    return ensure_prepared(data)


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_falls_on_default_corpus(variant, tmp_path):
  from diff_transformer.runs.restore import restore_model
  from diff_transformer.training import train
  summary = train(short_config(variant), tmp_path)
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  train_rows = [r for r in rows if r["kind"] == "train"]
  losses = [r["loss"] for r in train_rows]
  assert len(losses) == STEPS and np.isfinite(losses).all()
  first, last = losses[0], float(np.mean(losses[-5:]))
  assert first > 8.5  # ~ln(8192) at init: the default BPE tokenizer is in use
  assert last < first - 1.5, losses
  assert summary["val_loss"] < first - 1.5, summary
  # The logs carry the promised keys, lambda per layer included where the variant logs it.
  keys = set(train_rows[-1])
  assert {"loss", "perplexity", "lr", "grad_norm", "tokens_per_s", "mfu", "hfu"} <= keys
  # The MFU's peak and its source, and both FLOP counts, are on record.
  [flops] = [r for r in rows if r["kind"] == "flops"]
  assert flops["peak_tflops_per_device"] > 0 and flops["peak_source"].startswith("measured")
  assert flops["kernel"] == "xla" and flops["executed_flops_per_step"] > 0
  assert flops["layer_loop"] == "unroll"  # model.layer_loop auto, on CPU
  if entry(variant).logs_lambda:
    assert {"lambda/l0", "lambda/l1", "lambda/mean", "lambda/min", "lambda/max"} <= keys
  assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
  model, config, step = restore_model(tmp_path)
  assert step == STEPS and config.model.variant == variant
