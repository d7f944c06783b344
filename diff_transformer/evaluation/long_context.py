"""Cumulative average NLL by position on the longest held-out documents (DIFF Figure 5 style).

Each document is read from its start (eot, t_0, t_1, ...) up to the context length; nll[p] is
the loss of the token at position p averaged over the documents that reach p, and the curve is
its running mean: cum[p] = mean(nll[0..p]).
"""
from __future__ import annotations

import numpy as np

from diff_transformer.evaluation import common


def cumulative_nll(fns: common.Fns, documents: list[np.ndarray], eot_id: int, context: int,
                   batch_size: int) -> dict:
  if not documents:
    raise common.EvalError("long_context: no held-out documents")
  sums = np.zeros(context)
  counts = np.zeros(context)
  for chunk in common.batched(documents, batch_size):
    frames = [np.concatenate([[eot_id], d[:context]]).astype(np.int32) for d in chunk]
    inputs, lengths = common.pad_rows([f[:-1].tolist() for f in frames], length=context)
    targets, _ = common.pad_rows([f[1:].tolist() for f in frames], length=context)
    nll = fns.nll(inputs, targets)
    valid = np.arange(context)[None, :] < lengths[:, None]
    sums += (nll * valid).sum(0)
    counts += valid.sum(0)
  reach = int((counts > 0).sum())
  per_pos = sums[:reach] / counts[:reach]
  cum = np.cumsum(per_pos) / np.arange(1, reach + 1)
  return dict(nll_by_position=per_pos.tolist(), cumulative_nll=cum.tolist(),
              documents_per_position=counts[:reach].astype(int).tolist())


def run(fns: common.Fns, documents: list[np.ndarray], eot_id: int, settings, out_dir) -> dict:
  context = common.check_context(fns.model, settings.context_len or fns.spec.max_seq_len,
                                 "long_context")
  longest = sorted(documents, key=len, reverse=True)[:settings.long_docs]
  result = cumulative_nll(fns, longest, eot_id, context, settings.batch_size)
  cum = result["cumulative_nll"]
  marks = {str(p): cum[p - 1] for p in (16, 64, 256, 1024, 4096, 16384, 65536) if p <= len(cum)}
  marks[str(len(cum))] = cum[-1]
  return dict(result, context=context, documents=len(longest),
              document_tokens=[int(len(d)) for d in longest], cumulative_at=marks,
              plots=[plot({"this run": cum}, out_dir / "long_context.png")])


def plot(curves: dict[str, list[float]], path) -> str:
  fig, ax = common.figure()
  for name, cum in curves.items():
    ax.plot(np.arange(1, len(cum) + 1), cum, label=name)
  ax.set_xscale("log")
  ax.set_xlabel("position")
  ax.set_ylabel("cumulative average NLL")
  ax.legend()
  return common.save_figure(fig, path)
