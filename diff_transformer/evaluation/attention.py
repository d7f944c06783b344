"""Attention to the answer span versus noise on needle prompts (DIFF Table 3, Shared DIFF Table 5).

For each needle prompt the map row of the query position q (the last prompt token, the one that
predicts the first answer token) is split over the context: the answer needle's tokens, the other
needles, the query suffix, and the haystack ("noise"). Softmax variants use their map A; the
differential variants use A1 - lambda A2 (lambda per layer, or per token and head for DIFF V2).
"""
from __future__ import annotations

import numpy as np
from tqdm import tqdm

from diff_transformer.evaluation import common, needle
from diff_transformer.model.attention import variant_class

NORMALISATION = (
    "share(span) = sum_{s in span} M[q, s] / sum_s |M[q, s]| for the map row of the last prompt "
    "token q, where M = A (softmax attention; rows sum to 1, so this is the plain attention "
    "share) or M = A1 - lambda A2 (differential map; its entries can be negative, so shares are "
    "signed and |shares| sum to at most 1). Spans: answer = the answer needle's tokens; "
    "other_needles = the distractor needles; query = the separator and question after the "
    "context; noise = all haystack tokens. Averaged over heads, then over samples; 'mean' "
    "averages the layers.")
SPANS = ("answer", "noise", "other_needles", "query")
SHARE_KINDS = ("signed", "abs", "negative")


def span_masks(sample: needle.Sample, prompt_len: int, width: int) -> dict[str, np.ndarray]:
  """Boolean [width] masks of the four spans for a prompt of prompt_len tokens."""
  masks = {k: np.zeros(width, bool) for k in SPANS}
  for n in sample.needles:
    masks["answer" if n.answer else "other_needles"][n.start:n.end] = True
  masks["query"][len(sample.context):prompt_len] = True
  masks["noise"][:len(sample.context)] = True
  masks["noise"] &= ~(masks["answer"] | masks["other_needles"])
  return masks


def shares(row_NS: np.ndarray, masks: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
  """{kind: {span: share}} of one query row, per head then averaged over heads: signed (see
  NORMALISATION; a differential map's negative entries cancel positive ones), abs (sum |M| over
  the span / sum |M|: where the map's mass sits, whatever its sign) and negative (the span's
  negative mass / sum |M|). abs = signed + 2 * negative."""
  row_NS = np.asarray(row_NS, np.float64)
  total_N = np.abs(row_NS).sum(-1)
  total_N = np.where(total_N > 0, total_N, 1.0)
  part = lambda x_NS, m: float(np.mean(x_NS[:, m].sum(-1) / total_N))
  return dict(signed={k: part(row_NS, m) for k, m in masks.items()},
              abs={k: part(np.abs(row_NS), m) for k, m in masks.items()},
              negative={k: part(np.maximum(-row_NS, 0.0), m) for k, m in masks.items()})


def query_rows(aux: dict, query_B: np.ndarray) -> np.ndarray:
  """[L, B, N, S]: each row's map at its query position (differential map where there is one)."""
  a1 = np.asarray(aux["A1"])
  b = np.arange(a1.shape[1])
  rows = a1[:, b, :, query_B]  # advanced indices first: [B, L, N, S]
  if "A2" in aux:
    a2 = np.asarray(aux["A2"])[:, b, :, query_B]
    lam = np.moveaxis(np.asarray(aux["lambda"])[:, b, query_B], 0, 1)  # [L, B, N] -> [B, L, N]
    rows = rows - lam[..., None] * a2
  return np.moveaxis(rows, 0, 1)


def analyse(fns: common.Fns, samples: list[needle.Sample], batch_size: int,
            progress: bool = False) -> dict:
  """{depth: {layer or 'mean': {span: share}}} over the samples' answer queries."""
  per_depth: dict[float, list[np.ndarray]] = {}
  for chunk in tqdm(list(common.batched(samples, batch_size)), desc="attention",
                    disable=not progress, leave=False):
    prompts = [s.queries[0][2] for s in chunk]  # the answer needle is always asked first
    tokens, lengths = common.pad_rows(prompts, limit=fns.spec.max_seq_len)
    _, aux = fns.capture(tokens)
    rows = query_rows(aux, lengths - 1)
    for i, s in enumerate(chunk):
      masks = span_masks(s, int(lengths[i]), tokens.shape[1])
      per_layer = [[share["signed"][k] for k in SPANS]
                   for share in (shares(rows[l, i], masks) for l in range(rows.shape[0]))]
      per_depth.setdefault(s.depth, []).append(np.asarray(per_layer))
  out = {}
  for depth, vals in sorted(per_depth.items()):
    mean_LC = np.mean(vals, axis=0)
    table = {f"layer_{l}": dict(zip(SPANS, map(float, mean_LC[l]))) for l in range(len(mean_LC))}
    table["mean"] = dict(zip(SPANS, map(float, mean_LC.mean(0))))
    out[f"{depth:g}"] = table
  return out


def run(fns: common.Fns, tokenizer, texts: list[str], settings, out_dir) -> dict:
  haystack = needle.Haystack(texts, tokenizer)
  length = fns.spec.max_seq_len
  num_needles = max(n for n, _ in settings.needle_configs)
  samples = needle.build_samples(haystack, length, num_needles, 1, settings.depths,
                                 settings.attention_samples, settings.seed + 1)
  by_depth = analyse(fns, samples, settings.batch_size, progress=True)
  averaged = {k: float(np.mean([t["mean"][k] for t in by_depth.values()])) for k in SPANS}
  return dict(by_depth=by_depth, averaged=averaged, needles=num_needles, length=length,
              samples_per_depth=settings.attention_samples,
              map=variant_class(fns.spec.variant).map_name,
              normalisation=NORMALISATION, plots=[plot(by_depth, out_dir / "attention.png")])


def plot(by_depth: dict, path) -> str:
  depths = list(by_depth)
  fig, ax = common.figure(size=(5, 3))
  for k in ("answer", "noise"):
    ax.plot([float(d) for d in depths], [by_depth[d]["mean"][k] for d in depths], "o-", label=k)
  ax.set_xlabel("answer depth")
  ax.set_ylabel("attention share (layer mean)")
  ax.legend()
  return common.save_figure(fig, path)
