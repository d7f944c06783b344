"""Suites for runs trained on a synthetic task (data/synthetic.py), on fresh eval-split rows.

`task`      answer accuracy (argmax == value at every asked item) per slice: the trained setting,
            more stored pairs / needles, distractors on and off, and contexts longer than trained
            (length generalisation, with query slots spread uniformly so answers leave the
            trained positions); with accuracy by query position (the first query cannot be
            answered by elimination) and the floors of evaluation/floors.py (random, elimination,
            one key, one key + elimination) on the same rows. Every slice asks at most half of
            its stored items, as the trained settings do.
`attention` where each answer position's attention goes: the asked item's tokens (answer),
            its partial matches (distractors: items sharing a key token with it), the other
            stored items, and the rest of the context (noise); signed shares, absolute shares and
            negative mass as in evaluation/attention.py (differential variants: A1 - lambda A2).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from tqdm import tqdm

from diff_transformer.data import synthetic
from diff_transformer.evaluation import attention, common, floors
from diff_transformer.model.attention import variant_class

TASK_SPANS = ("answer", "distractors", "other_items", "noise")
NORMALISATION = (
    "For the map row M[q, :] of each asked item's answer position q (the token whose target is "
    "the value), M = A (softmax attention) or M = A1 - lambda A2 (differential map): signed "
    "share(span) = sum_{s in span} M[q, s] / sum_s |M[q, s]| (positive and negative entries "
    "cancel), absolute share = sum_{s in span} |M[q, s]| / sum_s |M[q, s]| (sums to 1), negative "
    "mass = sum_{s in span} max(-M[q, s], 0) / sum_s |M[q, s]|; per head, then averaged. Spans: "
    "answer = the asked item's tokens; distractors = stored items sharing a key token with it; "
    "other_items = the other stored items; noise = every other context token up to q.")


def slices(spec: synthetic.TaskSpec, max_len: int) -> dict[str, synthetic.TaskSpec]:
  """{name: task spec} to evaluate; impossible settings (vocab, length) are left out."""
  T = spec.seq_len
  if spec.name == "mqar":
    # Longer rows spread their queries uniformly (query_power 1) over the longer query region.
    options: list[dict[str, Any]] = [dict(), dict(seq_len=2 * T, query_power=1.0),
                                     dict(seq_len=4 * T, query_power=1.0)]
    options += [dict(num_keys=k) for k in (spec.num_keys - 1, spec.num_keys + 1,
                                           spec.num_keys + 2)]
  else:
    options = [dict(), dict(seq_len=2 * T), dict(seq_len=4 * T), dict(needles=2 * spec.needles),
               dict(distractors=0 if spec.distractors else 2)]
  out = {}
  for change in options:
    s = _fit(dataclasses.replace(spec, **change), max_len, cap=bool(change))
    if s is not None:
      out[name(s, spec)] = s
  return out


def _fit(s: synthetic.TaskSpec, max_len: int, cap: bool = True) -> synthetic.TaskSpec | None:
  """The spec (asking at most half its stored items when `cap`; the trained slice stays as
  trained) with seq_len raised in steps of 16 until its rows fit, or None."""
  if cap and s.name == "mqar":
    s = dataclasses.replace(s, num_queries=max(1, min(s.num_queries, s.stored // 2)))
  elif cap:
    s = dataclasses.replace(s, asked=max(1, min(s.asked, s.stored // 2)))
  while s.seq_len <= max_len:
    try:
      synthetic.check(s)
      return s
    except synthetic.RowTooShort:
      s = dataclasses.replace(s, seq_len=s.seq_len + 16)
    except ValueError:
      return None
  return None


def name(s: synthetic.TaskSpec, trained: synthetic.TaskSpec) -> str:
  parts = ["trained"] if s == trained else []
  if s.name == "mqar":
    parts += [f"keys={s.num_keys}", f"len={s.seq_len}"]
  else:
    parts += [f"needles={s.needles}", f"distractors={s.distractors}", f"len={s.seq_len}"]
  return ",".join(parts)


def accuracy(fns: common.Fns, s: synthetic.TaskSpec, rows: int, batch_size: int, seed: int
             ) -> dict:
  """{accuracy, by_query [R], rows, chance: {floor kind: accuracy}, floor: the highest} over
  `rows` eval-split rows (floors on the same rows)."""
  hits, floor_sums = [], dict.fromkeys(floors.KINDS, 0.0)
  for i in range(-(-rows // batch_size)):
    ex = synthetic.generate(s, "val", seed, i, min(batch_size, rows - i * batch_size))
    for k, v in floors.row_floors(s, ex).items():
      floor_sums[k] += v * len(ex["seq"]) / rows
    logits = np.asarray(fns.logits(ex["seq"][:, :-1]))
    b = np.arange(len(ex["seq"]))[:, None]
    guess = logits[b, ex["answer_pos"]].argmax(-1)
    hits.append(guess == ex["seq"][b, ex["answer_pos"] + 1])
  hit_BQ = np.concatenate(hits)
  return dict(accuracy=float(hit_BQ.mean()), by_query=hit_BQ.mean(0).tolist(), rows=rows,
              chance=floor_sums, floor=floors.highest(floor_sums), seq_len=s.seq_len,
              asked=s.answers_per_row, stored=s.stored)


def span_masks(s: synthetic.TaskSpec, ex: dict, row: int, r: int) -> dict[str, np.ndarray]:
  """Masks [seq_len] of the four spans for asked item r of one row."""
  T, L = s.seq_len, s.item_len
  seq, stored_at = ex["seq"][row], ex["stored_at"][row]
  target = ex["source_start"][row, r]
  first = 1 if s.name == "needle" else 0  # a needle's key follows its NEEDLE mark
  key_of = lambda at: tuple(seq[at + first:at + L - 1])
  asked_key = key_of(target)
  masks = {k: np.zeros(T, bool) for k in TASK_SPANS}
  for at in stored_at:
    key = key_of(at)
    if at == target:
      span = "answer"
    elif any(a == b for a, b in zip(key, asked_key)):
      span = "distractors"
    else:
      span = "other_items"
    masks[span][at:at + L] = True
  masks["noise"][:ex["answer_pos"][row, r] + 1] = True
  for k in ("answer", "distractors", "other_items"):
    masks["noise"] &= ~masks[k]
  return masks


def attention_shares(fns: common.Fns, s: synthetic.TaskSpec, rows: int, batch_size: int,
                     seed: int) -> dict[str, dict]:
  """{kind (signed, abs, negative): {layer_i | mean: {span: share}}} averaged over the rows'
  asked items."""
  per_item = []
  for i in range(-(-rows // batch_size)):
    ex = synthetic.generate(s, "val", seed + 1, i, min(batch_size, rows - i * batch_size))
    _, aux = fns.capture(ex["seq"][:, :-1])
    for r in range(ex["answer_pos"].shape[1]):
      rows_LBNS = attention.query_rows(aux, ex["answer_pos"][:, r])
      for b in range(rows_LBNS.shape[1]):
        masks = span_masks(s, ex, b, r)
        per_layer = [attention.shares(rows_LBNS[l, b], masks) for l in range(len(rows_LBNS))]
        per_item.append([[[m[kind][k] for k in TASK_SPANS] for m in per_layer]
                         for kind in attention.SHARE_KINDS])
  mean_KLC = np.mean(per_item, axis=0)
  out = {}
  for kind, mean_LC in zip(attention.SHARE_KINDS, mean_KLC):
    out[kind] = {f"layer_{l}": dict(zip(TASK_SPANS, map(float, mean_LC[l])))
                 for l in range(len(mean_LC))}
    out[kind]["mean"] = dict(zip(TASK_SPANS, map(float, mean_LC.mean(0))))
  return out


def run_task(fns: common.Fns, s: synthetic.TaskSpec, settings, out_dir) -> dict:
  rows = settings.task_rows
  results = {}
  for label, spec in tqdm(slices(s, fns.spec.max_seq_len).items(), desc="task slices",
                          leave=False):
    results[label] = accuracy(fns, spec, rows, settings.batch_size, settings.seed)
  trained = next(v for k, v in results.items() if k.startswith("trained"))
  return dict(task=s.name, trained=dataclasses.asdict(s), slices=results,
              accuracy=trained["accuracy"], chance=trained["chance"], floor=trained["floor"],
              by_query=trained["by_query"], plots=[plot(results, out_dir / "task.png")])


def run_attention(fns: common.Fns, s: synthetic.TaskSpec, settings, out_dir) -> dict:
  tables = attention_shares(fns, s, settings.task_attention_rows, settings.batch_size,
                            settings.seed)
  signed, absolute, negative = (tables[k] for k in attention.SHARE_KINDS)
  return dict(task=s.name, by_layer=signed, averaged=signed["mean"], by_layer_abs=absolute,
              averaged_abs=absolute["mean"], by_layer_negative=negative,
              averaged_negative=negative["mean"],
              rows=settings.task_attention_rows,
              map=variant_class(fns.spec.variant).map_name,
              normalisation=NORMALISATION)


def plot(results: dict, path) -> str:
  fig, ax = common.figure(size=(6, 3.2))
  labels = list(results)
  ax.bar(range(len(labels)), [results[k]["accuracy"] for k in labels], color="tab:blue")
  ax.scatter(range(len(labels)), [results[k]["floor"] for k in labels], color="k", marker="_",
             s=200, label="floor (best shortcut)", zorder=3)
  ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=7)
  ax.set_ylabel("answer accuracy")
  ax.set_ylim(0, 1)
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)


def task_summary(result: dict) -> dict:
  """The task suite's numbers a study records: accuracy and chance per slice, first-query
  accuracy."""
  return dict(accuracy={k: v["accuracy"] for k, v in result["slices"].items()},
              chance={k: v["chance"] for k, v in result["slices"].items()},
              first_query_accuracy=result["by_query"][0])


def attention_summary(result: dict) -> dict:
  """The attention suite's numbers a study records: signed and absolute attention shares on the
  answer, the distractors and the noise; the negative mass (in all and per span); per layer."""
  signed, absolute = result["averaged"], result["averaged_abs"]
  return dict(
      answer_share=signed["answer"], distractor_share=signed["distractors"],
      noise_share=signed["noise"], abs_answer_share=absolute["answer"],
      abs_distractor_share=absolute["distractors"], abs_noise_share=absolute["noise"],
      negative_mass=sum(result["averaged_negative"].values()),
      negative_by_span=result["averaged_negative"],
      shares_by_layer=dict(signed=result["by_layer"], abs=result["by_layer_abs"],
                           negative=result["by_layer_negative"]))
