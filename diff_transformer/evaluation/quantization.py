"""Attention-logit quantisation (DIFF Figure 8): validation loss and needle accuracy when the
attention logits are quantised to 16/8/6/4 bits.

Dynamic absmax, per query row (see kernels/reference.py): the row's scaled logits over the keys
it may attend to are rounded to a symmetric grid of 2^(bits-1) - 1 steps of absmax / (2^(bits-1)
- 1) and dequantised before the softmax; both maps of a differential variant are quantised. The
"full" row is the same reference kernel without quantisation.
"""
from __future__ import annotations

import numpy as np

from diff_transformer.evaluation import common, loss, needle


def run(model, val_batches: list[dict], tokenizer, texts: list[str], settings, out_dir) -> dict:
  haystack = needle.Haystack(texts, tokenizer)
  n, r = settings.needle_configs[-1]
  length = model.spec.max_seq_len
  samples = {(n, r, length): needle.build_samples(haystack, length, n, r, settings.depths,
                                                  settings.quant_needle_samples, settings.seed + 2)}
  rows = {}
  for bits in (None, *settings.quant_bits):
    fns = common.Fns(common.with_logit_bits(model, bits))
    name = "full" if bits is None else str(bits)
    val = loss.evaluate(fns, val_batches, progress=True)["all"]["loss"]
    generate_fn = needle.model_generator(fns, settings.batch_size, tokenizer.vocab_size)
    acc = needle.evaluate(samples, generate_fn, tokenizer)
    rows[name] = dict(loss=val, needle_accuracy=float(np.mean(list(
        next(iter(next(iter(acc.values())).values())).values()))))
    needle_acc = rows[name]['needle_accuracy']
    print(f"  quantization {name:>4} bits: loss {val:.4f}  needle {needle_acc:.2f}", flush=True)
  full = rows["full"]["loss"]
  for row in rows.values():
    row["loss_change"] = row["loss"] - full
  return dict(by_bits=rows, needle=f"N={n},R={r}", length=length,
              needle_samples=settings.quant_needle_samples * len(settings.depths),
              method="dynamic absmax per query row over allowed keys, both maps; reference kernel",
              plots=[plot({"this run": rows}, out_dir / "quantization.png")])


def plot(runs: dict[str, dict], path) -> str:
  fig, (a, b) = common.figure(2, size=(8, 3))
  for name, rows in runs.items():
    keys = [k for k in rows if k != "full"]
    xs = [int(k) for k in keys]
    a.plot(xs, [rows[k]["loss"] for k in keys], "o-", label=name)
    b.plot(xs, [rows[k]["needle_accuracy"] for k in keys], "o-", label=name)
  for ax, label in ((a, "validation loss"), (b, "needle accuracy")):
    ax.set_xlabel("attention-logit bits")
    ax.set_ylabel(label)
    ax.invert_xaxis()
    ax.legend()
  return common.save_figure(fig, path)
