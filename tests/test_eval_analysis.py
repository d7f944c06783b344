"""Attention shares on a hand-built map, logit quantisation, outlier statistics, ICL pieces."""
import numpy as np
import pytest
from flax import nnx

from diff_transformer.data import ByteTokenizer
from diff_transformer.evaluation import attention, common, icl, loss, needle, ngram, outliers
from diff_transformer.model import build_model
from diff_transformer.model.attention import make_spec


def hand_built_sample():
  """10 tokens: haystack 0-7 with the answer needle at 2-3 and a distractor at 6, query 8-9."""
  needles = [needle.Needle("Oslo", "1234567", 2, 4, True, True),
             needle.Needle("Lima", "7654321", 6, 7, False, False)]
  return needle.Sample(context=list(range(8)), needles=needles,
                       queries=[("Oslo", "1234567", list(range(10)))], depth=0.25, length=12,
                       answer_tokens=2)


def test_attention_shares_of_a_hand_built_softmax_map():
  # Two heads, padded to width 12 (right padding of a batch is never attended to).
  row = np.array([0.05, 0.05, 0.3, 0.3, 0.05, 0.05, 0.1, 0.0, 0.04, 0.06, 0.0, 0.0])
  masks = attention.span_masks(hand_built_sample(), prompt_len=10, width=12)
  got = attention.shares(np.stack([row, row]), masks)
  assert got["signed"] == pytest.approx(dict(answer=0.6, noise=0.2, other_needles=0.1, query=0.1))
  assert got["abs"] == pytest.approx(got["signed"])  # a softmax map has no negative mass
  assert got["negative"] == pytest.approx(dict(answer=0, noise=0, other_needles=0, query=0))


def test_attention_shares_of_a_hand_built_differential_map():
  """A1 - lambda A2 through query_rows, with the signed / sum|M| normalisation."""
  T = 10
  a1 = np.zeros((1, 1, 2, T, T))  # [L, B, H, T, S]
  a2 = np.zeros_like(a1)
  noise = [0, 1, 4, 5, 7]
  a1[..., 9, :] = [0.06, 0.06, 0.3, 0.3, 0.06, 0.06, 0.0, 0.06, 0.05, 0.05]
  a2[..., 9, noise] = 0.1
  a2[..., 9, [2, 3]] = 0.25
  lam = np.full((1, 1, T, 2), 0.5)  # [L, B, T, H]
  rows = attention.query_rows(dict(A1=a1, A2=a2, **{"lambda": lam}), np.array([9]))
  assert rows.shape == (1, 1, 2, T)
  # M: answer 2 x (0.3 - 0.125) = 0.35, noise 5 x (0.06 - 0.05) = 0.05, query 0.1; sum|M| 0.5
  got = attention.shares(rows[0, 0], attention.span_masks(hand_built_sample(), 10, T))
  assert got["signed"] == pytest.approx(dict(answer=0.7, noise=0.1, other_needles=0.0, query=0.2))
  # Anti-attention on noise: M noise = 0.06 - 0.5 * 0.2 = -0.04 per token, 5 tokens; sum|M| 0.65.
  a2[..., 9, noise] = 0.2
  rows = attention.query_rows(dict(A1=a1, A2=a2, **{"lambda": lam}), np.array([9]))
  got = attention.shares(rows[0, 0], attention.span_masks(hand_built_sample(), 10, T))
  assert got["signed"] == pytest.approx(dict(answer=0.35 / 0.65, noise=-0.2 / 0.65,
                                             other_needles=0.0, query=0.1 / 0.65))
  assert got["abs"] == pytest.approx(dict(answer=0.35 / 0.65, noise=0.2 / 0.65,
                                          other_needles=0.0, query=0.1 / 0.65))
  assert got["negative"]["noise"] == pytest.approx(0.2 / 0.65)
  assert sum(got["abs"].values()) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def sharp_model():
  """A random model with large weights, so attention logits are O(1) and quantisation bites."""
  spec = make_spec(variant="diff", vocab_size=257, d_model=64, num_layers=2, num_heads=2,
                   head_dim=16, ffn_dim=128, max_seq_len=64, init_std=0.3)
  return build_model(spec, nnx.Rngs(3))


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 97, (4, 65)).astype(np.int32)
  seg = np.ones((4, 64), np.int32)
  seg[:, 40:] = 2  # two packed documents per row
  pos = np.concatenate([np.arange(40), np.arange(24)])[None].repeat(4, 0).astype(np.int32)
  return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=seg, positions=pos,
              weights=np.ones((4, 64), np.float32))


def test_logit_quantisation_16_bits_keeps_loss_4_bits_changes_it(sharp_model, batch):
  losses = {b: loss.evaluate(common.Fns(common.with_logit_bits(sharp_model, b)), [batch])
            ["all"]["loss"] for b in (None, 16, 4)}
  plain = loss.evaluate(common.Fns(sharp_model), [batch])["all"]["loss"]
  assert abs(losses[None] - plain) < 1e-5  # the reference path is the model
  assert abs(losses[16] - losses[None]) < 1e-4
  assert abs(losses[4] - losses[None]) > 1e-3
  assert all(m.logit_bits is None for _, m in nnx.iter_modules(sharp_model)
             if hasattr(m, "logit_bits"))  # the original is untouched


def test_quantize_logits_grid():
  from diff_transformer.kernels.reference import quantize_logits
  x = np.array([[[[1.0, -0.5, 0.26, 3.0]]]], np.float32)  # [B, N, T, S]
  mask = np.array([[[True, True, True, False]]])  # the masked 3.0 must not set the scale
  q = np.asarray(quantize_logits(x, mask, 3))  # 3 levels each side: step 1/3
  np.testing.assert_allclose(q[..., :3], [[[[1.0, -2 / 3, 1 / 3]]]], atol=1e-6)


def test_outlier_stats_are_kth_largest_and_median():
  values = np.concatenate([-np.arange(1, 201, dtype=float), [0.5]])
  s = outliers.stats(values)
  assert (s["top1"], s["top2"], s["top3"], s["top10"], s["top100"]) == (200, 199, 198, 191, 101)
  assert s["median"] == 100


def test_outliers_suite_on_a_packed_batch(sharp_model, batch):
  r = outliers.analyse(common.Fns(sharp_model), batch)
  assert set(r["per_layer"]) == {"layer_0", "layer_1", "final"}
  assert r["overall"]["attention_logits"]["top1"] == max(
      r["per_layer"][f"layer_{l}"]["attention_logits"]["top1"] for l in range(2))
  assert r["tokens"] == 4 * 64


def test_ar_hits():
  x = np.array([[5, 6, 5, 6, 5, 7, 5, 6]])
  y = np.array([[6, 5, 6, 5, 7, 5, 6, 9]])
  seg = np.array([[1, 1, 1, 1, 1, 1, 2, 2]])
  # (5,6) seen at 0 -> hit at 2; (6,5) seen at 1 -> hit at 3; (5,7) new; (7,5) new;
  # position 6 starts a new segment, so (5,6) there is not a hit.
  assert loss.ar_hits(x, y, seg).tolist() == [[0, 0, 1, 1, 0, 0, 0, 0]]


def _brute_force_hits(x, y, seg, context):
  """Scan every earlier position of the same segment for the same (context + 1)-gram."""
  hits = np.zeros(x.shape, bool)
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      if t - context + 1 < 0 or len(set(seg[b, t - context + 1:t + 1].tolist())) > 1:
        continue
      gram = (*x[b, t - context + 1:t + 1].tolist(), y[b, t])
      hits[b, t] = any(
          seg[b, s - context + 1] == seg[b, s] == seg[b, t] and
          (*x[b, s - context + 1:s + 1].tolist(), y[b, s]) == gram
          for s in range(context - 1, t))
  return hits


@pytest.mark.parametrize("context", [1, 2, 4])
def test_ar_hit_mask_matches_a_brute_force_scan(context):
  rng = np.random.default_rng(context)
  stream = rng.integers(0, 2, (3, 81))  # 2 symbols: n-grams recur often
  x, y = stream[:, :-1], stream[:, 1:]
  seg = np.cumsum(rng.random((3, 80)) < 0.04, axis=1) + 1
  expected = _brute_force_hits(x, y, seg, context)
  assert expected.sum() > 10 and (~expected).sum() > 10  # both kinds occur
  assert (loss.ar_hits(x, y, seg, context) == expected).all()


def test_ngram_baseline_matches_a_hand_computation():
  # Training stream a b a b a c (ids 0, 1, 2), vocab 3, context 1 (a Witten-Bell bigram model).
  model = ngram.NGram(np.array([0, 1, 0, 1, 0, 2]), vocab=3, context=1)
  # unigram: c(a)=3, c(b)=2, c(c)=1, N=6, T=3 types: P0(w) = (c(w) + 3 * 1/3) / (6 + 3)
  p0 = {0: 4 / 9, 1: 3 / 9, 2: 2 / 9}
  # after a: followers b, b, c: c(a)=3, T(a)=2 -> P(b|a) = (2 + 2 P0(b)) / 5
  assert model.prob(np.array([[0]]), np.array([1]), np.array([1]))[0] == pytest.approx(
      (2 + 2 * p0[1]) / 5)
  assert model.prob(np.array([[0]]), np.array([1]), np.array([0]))[0] == pytest.approx(
      (0 + 2 * p0[0]) / 5)
  # after c: never seen as a context -> the unigram; no context available -> the unigram too
  assert model.prob(np.array([[2]]), np.array([1]), np.array([0]))[0] == pytest.approx(p0[0])
  assert model.prob(np.array([[0]]), np.array([0]), np.array([1]))[0] == pytest.approx(p0[1])
  # a distribution over the vocabulary for every history
  for h in range(3):
    total = model.prob(np.full((3, 1), h), np.ones(3, int), np.arange(3)).sum()
    assert total == pytest.approx(1.0)


def test_loss_suite_scores_the_ngram_baseline_on_the_same_tokens(sharp_model, batch):
  rng = np.random.default_rng(3)
  rows = np.tile(rng.integers(0, 50, (4, 16)), (1, 5))[:, :65]  # each row repeats 16 tokens
  repeated = dict(inputs=rows[:, :-1], targets=rows[:, 1:], weights=np.ones((4, 64), np.float32),
                  positions=np.broadcast_to(np.arange(64), (4, 64)),
                  segment_ids=np.ones((4, 64), np.int32))
  model = ngram.NGram(np.asarray(batch["inputs"]).reshape(-1), sharp_model.spec.vocab_size, 2)
  r = loss.evaluate(common.Fns(sharp_model), [repeated], context=2, ngram=model)
  # the gram (x_15, x_0, y_0) first ends at t = 16, so from t = 17 on every gram repeats
  assert r["ar_hit"]["tokens"] == 4 * (64 - 17)
  for key in ("all", "ar_hit", "others"):
    assert np.isfinite(r[key]["ngram_loss"]) and r[key]["ngram_loss"] > 0
  n = r["all"]["tokens"]
  mixed = (r["ar_hit"]["ngram_loss"] * r["ar_hit"]["tokens"] +
           r["others"]["ngram_loss"] * r["others"]["tokens"]) / n
  assert mixed == pytest.approx(r["all"]["ngram_loss"])


def test_icl_alternating_order_and_constrained_scoring(sharp_model):
  pool = [icl.Example(f"t{i}", l) for i, l in enumerate("aaabbbccc")]
  order = icl.order_demos(pool, ["a", "b", "c"], "alternating", np.random.default_rng(0))
  labels = [e.label for e in order]
  assert sorted(labels) == sorted("aaabbbccc") and labels[:3] == labels[3:6] == labels[6:]
  task = icl.Task(ByteTokenizer(), pool)
  fns = common.Fns(sharp_model)
  prompts = [task.query(pool[0]), task.query(pool[4])]
  scores = icl.decoding.score_candidates(fns, prompts, task.candidates)
  for p, row in zip(prompts, scores):  # each candidate's log-probability, computed directly
    for cand, got in zip(task.candidates, row):
      lp = np.log(_softmax(np.asarray(fns.logits(np.asarray([p + cand])))[0]))
      want = sum(lp[len(p) - 1 + i, t] for i, t in enumerate(cand))
      assert got == pytest.approx(want, abs=1e-4)


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_loss_by_position_and_frequency_matches_the_per_token_losses(sharp_model, batch):
  """Each bin's loss is the mean NLL of the targets at those positions of their own segment
  (packed rows restart at 0), each class's the mean over targets of that training frequency."""
  fns = common.Fns(sharp_model)
  weights = np.ones((4, 64), np.float32)
  weights[0, 5:9] = 0  # weight-0 targets count nowhere
  b = dict(batch, weights=weights)
  train = np.random.default_rng(1).integers(0, 97, 5000) ** 2 % 97  # uneven id frequencies
  classes = loss.frequency_classes(train, sharp_model.spec.vocab_size)
  r = loss.evaluate(fns, [b], classes=classes)
  nll = np.asarray(fns.nll(b["inputs"], b["targets"], b["positions"], b["segment_ids"]), float)
  position = np.concatenate([np.arange(40), np.arange(24)])  # the two segments of each row
  for i, got in enumerate(r["by_position"]["loss"]):
    mask = (position[None] // loss.POSITION_BIN == i) & (weights > 0)
    assert r["by_position"]["tokens"][i] == mask.sum()
    assert got == pytest.approx(nll[mask].mean(), rel=1e-6)
  assert len(r["by_position"]["loss"]) == 2  # positions 0-39: bins 0 and 1
  counts = np.bincount(train, minlength=sharp_model.spec.vocab_size)
  for c, got in enumerate(r["by_frequency"]["loss"]):
    mask = (classes[b["targets"]] == c) & (weights > 0)
    assert got == pytest.approx(nll[mask].mean(), rel=1e-6)
    mass = counts[classes == c].sum() / counts.sum()
    assert 0 < mass and (c > 0 or 0.5 <= mass < 0.75)  # the frequent ids just pass half
  assert sum(r["by_frequency"]["tokens"]) == r["all"]["tokens"]
  flat = loss.summary(dict(loss=r["all"]["loss"], ar_hit=r["ar_hit"], others=r["others"],
                           by_position=r["by_position"], by_frequency=r["by_frequency"]))
  assert flat["loss_at_pos_032"] == r["by_position"]["loss"][1]
  assert flat["loss_on_rare"] == r["by_frequency"]["loss"][2]
