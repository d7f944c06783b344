"""Synthetic retrieval tasks: generator invariants, train/eval disjointness, the answer-only loss,
the short convolution, exact resume, one-line errors for impossible settings, and the task
suite's slices (lengthened where their rows do not fit)."""
from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from diff_transformer.config import ConfigError, base_config, validate
from diff_transformer.data import synthetic
from diff_transformer.model.layers import ShortConv
from diff_transformer.training import train
from diff_transformer.mesh import make_mesh
from diff_transformer.training.step import Trainer


def task(name="mqar", seq_len=96, **fields) -> synthetic.TaskSpec:
  return synthetic.TaskSpec(name=name, seq_len=seq_len, vocab_size=fields.pop("vocab_size", 256),
                            **fields)


def test_mqar_rows_hold_every_answer_and_2g_minus_2_distractors():
  s = task(num_keys=4, num_queries=8)
  ex = synthetic.generate(s, "train", 3, 0, 64)
  seq, g = ex["seq"], s.num_keys
  assert seq.shape == (64, 97) and ex["answer_pos"].shape == (64, 8)
  pools = s.pools()
  for row in range(64):
    items = seq[row, :3 * g * g].reshape(g * g, 3)
    assert np.all((items[:, 0] >= pools["key1"][0]) & (items[:, 0] < pools["key2"][0]))
    assert np.all((items[:, 2] >= pools["value"][0]) & (items[:, 2] < s.vocab_size))
    assert len({tuple(k) for k in items[:, :2]}) == g * g  # the full g x g grid, once each
    assert len(set(items[:, 2])) == g * g  # distinct values
    asked = set()
    for r, pos in enumerate(ex["answer_pos"][row]):
      k1, k2, answer = seq[row, pos - 1], seq[row, pos], seq[row, pos + 1]
      match = [i for i in items if i[0] == k1 and i[1] == k2]
      assert len(match) == 1 and match[0][2] == answer  # the answer is in the context
      assert ex["source_start"][row, r] == 3 * np.flatnonzero((items[:, 0] == k1) &
                                                              (items[:, 1] == k2))[0]
      partial = [i for i in items if (i[0] == k1) != (i[1] == k2)]
      assert len(partial) == 2 * (g - 1) and all(i[2] != answer for i in partial)
      asked.add((k1, k2))
    assert len(asked) == 8 < g * g  # a strict subset: no answer by elimination


def test_plain_mqar_and_needles_place_what_they_ask():
  s = task(compositional=False, num_keys=8, num_queries=4, seq_len=64)
  ex = synthetic.generate(s, "val", 0, 0, 16)
  for row, pos in zip(ex["seq"], ex["answer_pos"]):
    stored = dict(zip(row[:16:2], row[1:16:2]))
    assert all(stored[row[p]] == row[p + 1] for p in pos)
  n = task("needle", seq_len=128, needles=4, asked=2, distractors=2)
  ex = synthetic.generate(n, "train", 0, 0, 16)
  for b, row in enumerate(ex["seq"]):
    needles = [tuple(row[a:a + 4]) for a in ex["stored_at"][b]]
    assert all(t[0] == synthetic.NEEDLE for t in needles) and len(needles) == 6
    for r, pos in enumerate(ex["answer_pos"][b]):
      assert row[pos - 2] == synthetic.QUERY
      match = [t for t in needles if t[1:3] == (row[pos - 1], row[pos])]
      assert len(match) == 1 and match[0][3] == row[pos + 1]
      # The key grid: one other needle shares ka, another shares kb, so neither key alone answers.
      assert sum(t[1] == row[pos - 1] for t in needles) == 2
      assert sum(t[2] == row[pos] for t in needles) == 2


@pytest.mark.parametrize("filler", ["random", "blank"])
def test_mqar_query_region_filler(filler):
  s = task(num_keys=4, num_queries=8, filler=filler)
  ex = synthetic.generate(s, "train", 1, 0, 32)
  pools = s.pools()
  for b, row in enumerate(ex["seq"]):
    free = np.ones(len(row), bool)
    free[:3 * s.stored] = False
    for start in ex["query_start"][b]:
      free[start:start + 3] = False
    fill = row[free]
    if filler == "blank":
      assert np.all(fill == synthetic.BLANK)
    else:  # key-pool ids only: filler looks like keys, never like a value or a special id
      assert np.all((fill >= pools["key1"][0]) & (fill < pools["value"][0]))
      assert len(set(fill)) > 4


def test_generation_is_deterministic_and_splits_are_disjoint():
  s = task(num_keys=3, num_queries=4, seq_len=48)
  a = synthetic.generate(s, "train", 7, 5, 32)["seq"]
  assert np.array_equal(a, synthetic.generate(s, "train", 7, 5, 32)["seq"])
  assert not np.array_equal(a, synthetic.generate(s, "train", 8, 5, 32)["seq"])
  train = np.concatenate([synthetic.generate(s, "train", 0, i, 512)["seq"] for i in range(8)])
  val = synthetic.generate(s, "val", 0, 0, 512)["seq"]
  assert np.all(synthetic.content_bucket(train, s.heldout_buckets) != 0)
  assert np.all(synthetic.content_bucket(val, s.heldout_buckets) == 0)
  assert not {r.tobytes() for r in train} & {r.tobytes() for r in val}


@pytest.mark.parametrize("field, value, message", [
    ("num_queries", 16, "data.task.num_queries: must be in \\[1, 15\\]"),
    ("vocab_size", 30, "data.task.vocab_size: 30 leaves 14 value ids"),
    ("num_keys", 1, "data.task.num_keys: must be >= 2"),
    ("heldout_buckets", 1, "data.task.heldout_buckets"),
    ("filler", "zeros", "data.task.filler: 'zeros' is not one of random, blank for mqar"),
])
def test_impossible_task_settings_are_one_line(field, value, message):
  c = base_config()
  c.data.name, c.data.seq_len, c.model.vocab_size = "mqar", 128, 256
  c.data.task[field] = value
  with pytest.raises(ConfigError, match=message) as e:
    validate(c)
  assert "\n" not in str(e.value)


def test_short_sequences_and_large_task_vocab_are_refused():
  c = base_config()
  c.data.name, c.data.seq_len, c.model.vocab_size = "mqar", 32, 256
  with pytest.raises(ConfigError, match="data.seq_len: 32 is too short"):
    validate(c)
  c.data.seq_len, c.data.task.vocab_size = 128, 512
  with pytest.raises(ConfigError, match="data.task.vocab_size: 512 exceeds model.vocab_size"):
    validate(c)


def test_short_conv_matches_float64_and_stays_inside_segments():
  conv = ShortConv(6, 3, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 6)).astype(np.float32)
  seg = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 0], [1] * 9], np.int32)
  w = np.asarray(conv.weight[...], np.float64)
  want = x.astype(np.float64).copy()
  for b in range(2):
    for t in range(9):
      for j in range(3):
        if t - j >= 0 and seg[b, t - j] == seg[b, t]:
          want[b, t] += w[j] * x[b, t - j]
  np.testing.assert_allclose(np.asarray(conv(x, seg)), want, atol=1e-5)


def small_config(**over):
  from configs import synthetic as presets
  c = presets.get_config("diff-mqar_plain")
  c.train.global_batch_size, c.train.log_every, c.train.eval_every = 8, 1, 3
  c.train.eval_batches, c.train.checkpoint_every, c.train.steps = 1, 3, 6
  for k, v in over.items():
    a, b = k.split(".")
    c[a][b] = v
  return validate(c)


def test_loss_counts_only_answer_positions():
  config = small_config()
  trainer = Trainer(config, make_mesh(config.mesh))
  state = trainer.init()
  spec = synthetic.task_spec(config.data)
  batch = synthetic.to_batch(synthetic.generate(spec, "val", 0, 0, 8))
  assert batch["weights"].sum() == 8 * spec.num_queries
  # One jitted forward (the eager model call compiles op by op).
  logits = np.asarray(trainer.logits(state, {"inputs": batch["inputs"]}), np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  nll = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
  want = (nll * batch["weights"]).sum() / batch["weights"].sum()
  nll_sum, tokens, _ = trainer.eval_step(state, batch)
  assert float(tokens) == batch["weights"].sum()
  np.testing.assert_allclose(float(nll_sum) / float(tokens), want, rtol=1e-5)
  _, metrics = trainer.train_step(state, jax.tree.map(np.asarray, batch))
  np.testing.assert_allclose(float(metrics["loss"]), want, rtol=1e-5)
  assert float(metrics["tokens"]) == batch["weights"].sum()


def test_resume_on_a_synthetic_task_is_bitwise(tmp_path):
  straight = small_config()
  train(straight, tmp_path / "a")
  first = small_config(**{"train.steps": 3})
  train(first, tmp_path / "b")
  train(straight, tmp_path / "b")

  def log(run):
    rows = [json.loads(l) for l in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    return {(r["kind"], r["step"]): (r.get("loss"), r.get("val_loss")) for r in rows
            if r["kind"] in ("train", "val")}  # not the per-launch flops record

  a, b = log("a"), log("b")
  assert a == b and ("train", 6) in a and ("val", 6) in a


def test_eval_slices_lengthen_rows_that_do_not_fit_and_leave_out_impossible_ones():
  """The task suite's slices: a slice whose rows (or needle depth band) do not fit is lengthened
  in steps of 16 to the first length that fits; one the vocabulary cannot hold is left out."""
  from diff_transformer.evaluation import tasks
  got = lambda s: {k: (v.seq_len, v.num_queries)  # noqa: E731
                   for k, v in tasks.slices(s, 1024).items()}
  assert got(task(seq_len=64, num_keys=3)) == {
      "trained,keys=3,len=64": (64, 8), "keys=3,len=128": (128, 4), "keys=3,len=256": (256, 4),
      "keys=2,len=64": (64, 2), "keys=4,len=80": (80, 8), "keys=5,len=112": (112, 8)}
  # 18 value ids cannot hold keys=5's 25 distinct values.
  assert not [k for k in got(task(seq_len=64, num_keys=3, vocab_size=40)) if "keys=5" in k]
  needle = task("needle", seq_len=64, needles=4, asked=2, depth_max=0.5)
  with pytest.raises(synthetic.RowTooShort, match="depth band"):  # 8 needles in 64 tokens' band
    synthetic.check(dataclasses.replace(needle, needles=8))
  assert set(tasks.slices(needle, 1024)) == {
      "trained,needles=4,distractors=0,len=64", "needles=4,distractors=0,len=128",
      "needles=4,distractors=0,len=256", "needles=8,distractors=0,len=80",
      "needles=4,distractors=2,len=64"}
  assert tasks.slices(needle, 100).keys() == {"trained,needles=4,distractors=0,len=64",
                                              "needles=8,distractors=0,len=80",
                                              "needles=4,distractors=2,len=64"}
