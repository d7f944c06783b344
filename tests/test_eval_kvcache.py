"""KV-cache decoding equals full-sequence recomputation; cache sizes follow model/cache.py's layout
table."""
import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

from diff_transformer.evaluation import common, decoding
from diff_transformer.model import build_model
from diff_transformer.model import cache as kv_cache
from diff_transformer.model.attention import make_spec, variant_class
from diff_transformer.model.spec import ModelSpec
from tests.helpers.variant_table import VARIANTS, entry

VOCAB = 61
# Every variant (by its name) with grouped-query attention (h_kv < heads), plus plain MHA for the
# baseline.
CASES = {
    **{v: dict(variant=v, num_heads=entry(v).tiny.num_heads, head_dim=16,
                        num_kv_heads=entry(v).tiny.num_kv_heads,
                        **dataclasses.asdict(entry(v).tiny.options))
       for v in VARIANTS},
    "transformer_mha": dict(variant="transformer", num_heads=4, head_dim=16),
    # model.short_conv keeps the last inputs per row in the cache (ragged prefill included).
    "diff_short_conv": dict(variant="diff", num_heads=2, num_kv_heads=1, head_dim=16,
                            short_conv=3),
}


def tiny(kernel="xla", **kw) -> ModelSpec:
  return make_spec(vocab_size=VOCAB, d_model=64, num_layers=2, ffn_dim=128, max_seq_len=48,
                   kernel=kernel, init_std=0.1, **kw)


@pytest.fixture(scope="module", params=list(CASES))
def fns(request):
  return common.Fns(build_model(tiny(**CASES[request.param]), nnx.Rngs(0)))


def test_incremental_decode_matches_full_forward(fns):
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 20), 0, VOCAB), np.int32)
  full = np.asarray(fns.logits(tokens))
  logits, cache = fns.prefill(tokens[:, :7], 32)
  steps = [np.asarray(logits)]
  for t in range(7, 20):  # then one token at a time
    logits, cache = fns.decode(tokens[:, t:t + 1], cache)
    steps.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5, rtol=0)
  assert cache.lengths.tolist() == [20, 20]


def test_right_padded_prefill_of_different_lengths(fns):
  """Rows of a batch may hold prompts of different lengths (what needle/ICL decoding does)."""
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, VOCAB, n).tolist() for n in (5, 11, 8)]
  new = decoding.generate(fns, prompts, 6)
  full, _ = common.pad_rows([p + g[:-1] for p, g in zip(prompts, new)])  # causal: padding after
  greedy = np.asarray(fns.logits(full)).argmax(-1)  # is never seen
  for i, (p, g) in enumerate(zip(prompts, new)):
    assert greedy[i, len(p) - 1:len(p) + 5].tolist() == g


def test_prefill_equals_decoding_into_an_empty_cache(fns):
  """The prefill (causal within the prompt, the model's kernel) and a decode into an empty cache
  (the explicit mask over the cache) agree: logits, the cache's entries and its lengths, with
  right-padded rows."""
  tokens = np.asarray(jax.random.randint(jax.random.key(3), (2, 12), 0, VOCAB), np.int32)
  lengths = np.asarray([12, 7], np.int32)
  fresh, fresh_cache = fns.prefill(tokens, 16, lengths)
  masked, masked_cache = fns.decode(tokens, fns.model.init_cache(2, 16), lengths)
  np.testing.assert_allclose(fresh, masked, atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(fresh_cache), jax.tree.leaves(masked_cache)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert fresh_cache.lengths.tolist() == [12, 7]
  with pytest.raises(ValueError, match="prefill: a prompt of 12 tokens does not fit a cache of 8"):
    fns.prefill(tokens, 8)


def test_reference_kernel_decode_matches_full_forward():
  spec = tiny("reference", **CASES["diff"])
  f = common.Fns(build_model(spec, nnx.Rngs(2)))
  tokens = np.arange(12, dtype=np.int32)[None] % VOCAB
  full = np.asarray(f.logits(tokens))
  cache = f.model.init_cache(1, 16)
  first, cache = f.decode(tokens[:, :11], cache)
  last, _ = f.decode(tokens[:, 11:], cache)
  np.testing.assert_allclose(np.concatenate([first, last], 1), full, atol=1e-5, rtol=0)


def _empty_cache(spec, batch, max_len):
  return kv_cache.init(spec, variant_class(spec.variant).cache_layout(spec), batch, max_len)


@pytest.mark.parametrize("name", list(CASES))
def test_cache_size_per_token_follows_spec(name):
  spec = tiny(**CASES[name])
  cache = _empty_cache(spec, 1, 4)
  key_shape, value_shape = cache.k.shape[2::2], cache.v.shape[2::2]  # [L, B, heads, S, width]
  want_key, want_value = entry(spec.variant).cache(spec)
  assert key_shape == want_key and value_shape == want_value
  assert cache.values_per_token == spec.num_layers * (np.prod(want_key) + np.prod(want_value))


def test_decode_beyond_max_seq_len_is_one_clear_error(fns):
  with pytest.raises(common.EvalError, match="exceeds the model's max_seq_len 48"):
    decoding.generate(fns, [[1] * 40], 10)


def test_top_k_sampling_with_the_cache_draws_from_the_top_k(fns):
  prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1, 8]]
  a = decoding.generate(fns, prompts, 6, temperature=1.0, top_k=3, seed=5)
  assert a == decoding.generate(fns, prompts, 6, temperature=1.0, top_k=3, seed=5)
  full, _ = common.pad_rows([p + g[:-1] for p, g in zip(prompts, a)])
  top3 = np.argsort(np.asarray(fns.logits(full)), axis=-1)[..., -3:]
  for i, (p, g) in enumerate(zip(prompts, a)):
    assert all(tok in top3[i, len(p) - 1 + t] for t, tok in enumerate(g))


def test_top_p_keeps_the_nucleus_and_num_ids_masks_padded_rows():
  logits_BV = jax.numpy.asarray([[2.0, 1.0, 0.0, -1.0, 3.0]])  # p ~ .23 .09 .03 .01 .64
  keys = jax.random.split(jax.random.key(0), 400)
  picks = {int(decoding._pick(logits_BV, k, 1.0, 0, top_p=0.85)[0]) for k in keys}
  assert picks == {4, 0}  # mass before id 0 is .64 < .85; before id 1 it is .87
  assert {int(decoding._pick(logits_BV, k, 1.0, 0, top_p=0.5)[0]) for k in keys[:50]} == {4}
  assert len({int(decoding._pick(logits_BV, k, 1.0, 0)[0]) for k in keys}) == 5
  with pytest.raises(common.EvalError, match="decoding: .* 0 < top_p <= 1 required"):
    decoding.generate(None, [[1]], 1, top_p=0.0)


def test_generation_never_picks_padded_vocab_rows(fns):
  prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1, 8]]
  greedy = decoding.generate(fns, prompts, 6)
  allowed = max(max(g) for g in greedy)  # ids from it on play the tokenizer's padding
  masked = decoding.generate(fns, prompts, 6, num_ids=allowed)
  assert max(max(g) for g in masked) < allowed and masked != greedy
  sampled = decoding.generate(fns, prompts, 6, temperature=2.0, seed=1, num_ids=10)
  assert max(max(g) for g in sampled) < 10


def test_the_decode_benchmark_times_every_variant(tmp_path, monkeypatch):
  import sys
  from benchmarks import decode_step
  out = tmp_path / "decode_step.json"
  monkeypatch.setattr(sys, "argv", ["decode_step.py", "--quick", "--out", str(out)])
  decode_step.main()
  record = json.loads(out.read_text())
  assert [r["variant"] for r in record["results"]] == ["transformer", "diff", "shared_diff",
                                                       "diff_v2"]
  assert all(r["ms_per_step"]["n"] == 2 and r["ms_per_step"]["min"] > 0
             for r in record["results"])
