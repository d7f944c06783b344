"""Text generation with the KV cache: greedy and temperature / top-k sampling, any variant.

Also records the cache layout per token (model/cache.py) and checks that greedy decoding with the
cache picks the same tokens as the argmax of a full-sequence forward over the same text.
"""
from __future__ import annotations

import numpy as np

from diff_transformer.evaluation import common, decoding
from diff_transformer.model.attention import variant_class


def prompts_for(tokenizer, texts: list[str], settings, count: int = 3) -> list[str]:
  if settings.prompt:
    return [settings.prompt]
  out = []
  for t in texts[:count]:
    toks = tokenizer.encode(t.lstrip())[:24]
    out.append(tokenizer.decode(toks))
  if not out:
    raise common.EvalError("generate: no prompt given (--prompt) and no held-out text")
  return out


def matches_full_forward(fns: common.Fns, prompts: list[list[int]], new: list[list[int]]
                         ) -> list[bool]:
  """Per prompt: its greedy tokens equal the argmax of a full forward over prompt + generated
  text (one forward over the right-padded rows; causal, so the padding changes nothing)."""
  tokens, _ = common.pad_rows([p + n[:-1] for p, n in zip(prompts, new)])
  pred_BT = np.asarray(fns.logits(tokens)).argmax(-1)
  return [pred_BT[i, len(p) - 1:len(p) - 1 + len(n)].tolist() == n
          for i, (p, n) in enumerate(zip(prompts, new))]


def run(fns: common.Fns, tokenizer, texts: list[str], settings, out_dir) -> dict:
  del out_dir
  prompts = prompts_for(tokenizer, texts, settings)
  encoded = [tokenizer.encode(p) for p in prompts]
  longest = max(len(e) for e in encoded)
  common.check_context(fns.model, longest + settings.max_new_tokens, "generate")
  greedy = decoding.generate(fns, encoded, settings.max_new_tokens, num_ids=tokenizer.vocab_size)
  sampled = decoding.generate(fns, encoded, settings.max_new_tokens,
                              temperature=settings.temperature, top_k=settings.top_k,
                              seed=settings.seed, num_ids=tokenizer.vocab_size)
  (kh, kw), (vh, vw) = variant_class(fns.spec.variant).cache_layout(fns.spec)
  samples = [dict(prompt=p, greedy=tokenizer.decode(g), sampled=tokenizer.decode(s),
                  greedy_matches_full_forward=m)
             for p, g, s, m in zip(prompts, greedy, sampled,
                                   matches_full_forward(fns, encoded, greedy))]
  for s in samples:
    print(f"  [{s['prompt']!r}] greedy: {s['greedy']!r}", flush=True)
  return dict(samples=samples, max_new_tokens=settings.max_new_tokens,
              sampling=dict(temperature=settings.temperature, top_k=settings.top_k,
                            seed=settings.seed),
              kv_cache=dict(key_heads=kh, key_width=kw, value_heads=vh, value_width=vw,
                            values_per_token=fns.model.init_cache(1, 1).values_per_token))
