"""Needle generator and scorer: unique keys, needles at the requested depths, exact checker; a
perfect copier (a stub used only here, to test the scorer) scores 1.0, a random model about 0."""
import re

import numpy as np
import pytest
from flax import nnx

from diff_transformer.data import ByteTokenizer
from diff_transformer.evaluation import common, needle
from diff_transformer.model import build_model
from diff_transformer.model.attention import make_spec

DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture(scope="module")
def tok():
  return ByteTokenizer()


@pytest.fixture(scope="module")
def haystack(tok):
  """Fixed English pseudo-sentences, one short line each (independent of the repo's own docs,
  whose long table lines would make depth placement at line boundaries coarse)."""
  words = ("the king queen sword crown night day love death fool storm sea ship letter ghost "
           "castle honour blood tomorrow heaven earth father daughter brother poison wine bread "
           "war peace stars moon sun river field horse").split()
  rng = np.random.default_rng(0)
  texts = ["\n".join(" ".join(rng.choice(words, rng.integers(4, 12))).capitalize() + "."
                     for _ in range(200)) + "\n" for _ in range(6)]
  return needle.Haystack(texts, tok)


def test_exact_answer_checker():
  assert needle.correct(" 4821937.", "4821937")
  assert needle.correct("4821937", "4821937")
  assert needle.correct("\n 4821937 and", "4821937")
  assert not needle.correct(" 48219370", "4821937")  # an extra digit
  assert not needle.correct(" 482193", "4821937")  # a missing digit
  assert not needle.correct(" 4821936.", "4821937")
  assert not needle.correct(" is 4821937", "4821937")  # not the continuation
  assert not needle.correct("", "4821937")


@pytest.mark.parametrize("n,r", [(1, 1), (4, 2), (6, 2)])
def test_samples_unique_verified_and_at_requested_depths(haystack, tok, n, r):
  samples = needle.build_samples(haystack, 2048, n, r, DEPTHS, 3, seed=1)
  assert len(samples) == 3 * len(DEPTHS)
  for s in samples:
    assert len({x.city for x in s.needles}) == n and len({x.number for x in s.needles}) == n
    assert len(s.queries) == r and len({c for c, _, _ in s.queries}) == r
    assert s.queries[0][0] == next(x.city for x in s.needles if x.answer)
    text = tok.decode(s.context)
    for x in s.needles:
      sentence = f"The magic number for {x.city} is {x.number}.\n"
      assert tok.decode(s.context[x.start:x.end]) == sentence
      assert text.count(x.city) == 1 and text.count(x.number) == 1
    for city, number, prompt in s.queries:
      assert prompt[:len(s.context)] == s.context
      assert tok.decode(prompt[len(s.context):]) == f"\n\nThe magic number for {city} is"
      assert len(prompt) + s.answer_tokens <= 2048
    answer = next(x for x in s.needles if x.answer)
    if s.depth == 0.0:
      assert answer.start == 0
    elif s.depth == 1.0:
      assert answer.end == len(s.context)
    else:  # the line boundary nearest to the requested depth
      longest_line = max(len(t) for t in haystack.line_tokens)
      assert abs(s.answer_depth - s.depth) <= longest_line / s.haystack_tokens
    assert s.answer_depth == pytest.approx(s.depth, abs=0.1)


def test_too_short_length_is_one_clear_error(haystack):
  with pytest.raises(common.EvalError, match="too short for 6 needles"):
    needle.build_sample(haystack, 64, 6, 2, 0.5, np.random.default_rng(0))


def copier(tok):
  """The stub: reads the asked city from the prompt's last line and copies its needle's number."""
  def generate_fn(prompts, max_new):
    out = []
    for p in prompts:
      text = tok.decode(p)
      city = re.search(r"The magic number for (.+) is$", text).group(1)
      number = re.search(rf"The magic number for {city} is (\d+)\.", text).group(1)
      out.append(tok.encode(f" {number}.")[:max_new])
    return out
  return generate_fn


def test_perfect_copier_scores_one_and_random_model_about_zero(haystack, tok):
  groups = {(n, r, 256): needle.build_samples(haystack, 256, n, r, DEPTHS, 2, seed=0)
            for n, r in ((1, 1), (2, 2))}
  perfect = needle.evaluate(groups, copier(tok), tok)
  assert all(a == 1.0 for per_len in perfect.values() for per_d in per_len.values()
             for a in per_d.values())
  spec = make_spec(variant="diff", vocab_size=tok.vocab_size, d_model=64, num_layers=2,
                   num_heads=2, head_dim=16, ffn_dim=128, max_seq_len=256)
  fns = common.Fns(build_model(spec, nnx.Rngs(0)))
  random = needle.evaluate(groups, needle.model_generator(fns, 16), tok)
  scores = [a for per_len in random.values() for per_d in per_len.values() for a in per_d.values()]
  assert np.mean(scores) <= 0.05
