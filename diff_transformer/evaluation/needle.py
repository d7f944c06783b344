"""Multi-needle retrieval (protocol in docs/evaluation.md): city -> magic-number needles in real
held-out text.

A sample of `length` tokens holds N needles "The magic number for <city> is <number>." inserted at
line boundaries of a held-out haystack; R of them are asked for. The first asked ("answer")
needle sits at the requested depth (0 = first line, 1 = just before the query), the others at
random boundaries. Each query is a completion prompt: context + "\n\nThe magic number for <city>
is", decoded greedily with the KV cache; a query is right when the generated text starts with
exactly the needle's number (no further digit), a sample when all R are right.

Built at the token level so what the model reads is exactly what was planned: the needle's
" <number>" tokens are encoded once and reused in the needle and as the expected answer (the
number is tokenized identically wherever it appears). Every sample is verified after
construction: cities and numbers unique, absent from the haystack, each needle's tokens present
at its recorded position, each needle sentence exactly once in the decoded text.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
from tqdm import tqdm

from diff_transformer.evaluation import common, decoding
from diff_transformer.errors import EvalError

CITIES = (
    "Tokyo", "Nairobi", "Reykjavik", "Montevideo", "Ulaanbaatar", "Helsinki", "Santiago",
    "Jakarta", "Lagos", "Toronto", "Sydney", "Mumbai", "Seoul", "Lima", "Oslo", "Cairo",
    "Bogota", "Hanoi", "Manila", "Dakar", "Quito", "Riga", "Tbilisi", "Almaty", "Karachi",
    "Auckland", "Havana", "Caracas", "Kampala", "Accra", "Zagreb", "Vilnius", "Tallinn",
    "Kinshasa", "Shanghai", "Chicago", "Houston", "Denver", "Seattle", "Boston", "Melbourne",
    "Vancouver", "Montreal", "Stockholm", "Copenhagen", "Amsterdam", "Brussels", "Warsaw",
    "Prague", "Budapest", "Bucharest", "Sofia", "Istanbul", "Tehran", "Baghdad", "Riyadh",
    "Dubai", "Doha", "Kabul", "Dhaka", "Bangkok", "Singapore", "Taipei", "Beijing", "Osaka",
    "Perth", "Brisbane", "Johannesburg", "Casablanca", "Tunis", "Khartoum", "Addis Ababa",
)
NEEDLE = "The magic number for {city} is"
NUMBER_DIGITS = 7
_ANSWER = re.compile(r"\s*(\d+)")


@dataclasses.dataclass
class Needle:
  city: str
  number: str
  start: int  # first token in the context
  end: int  # one past the last token
  queried: bool
  answer: bool  # the queried needle placed at the requested depth


@dataclasses.dataclass
class Sample:
  context: list[int]  # haystack with needles, before the query
  needles: list[Needle]
  queries: list[tuple[str, str, list[int]]]  # (city, number, full prompt tokens)
  depth: float  # requested depth of the answer needle
  length: int  # prompt + answer budget
  answer_tokens: int  # max new tokens to decode

  @property
  def haystack_tokens(self) -> int:
    return len(self.context) - sum(n.end - n.start for n in self.needles)

  @property
  def answer_depth(self) -> float:
    """Measured depth: the share of the haystack that comes before the answer needle."""
    a = next(n for n in self.needles if n.answer)
    before = a.start - sum(n.end - n.start for n in self.needles if n.start < a.start)
    return before / max(1, self.haystack_tokens)


def correct(generated: str, number: str) -> bool:
  """Exact: the text starts (after whitespace) with the number and no further digit."""
  m = _ANSWER.match(generated)
  return m is not None and m.group(1) == number


class Haystack:
  """Held-out text split into lines, each tokenized once."""

  def __init__(self, texts: list[str], tokenizer):
    self.tokenizer = tokenizer
    self.lines = [l for t in texts for l in t.splitlines(keepends=True) if l.strip()]
    if not self.lines:
      raise EvalError("needle: no held-out text to build haystacks from")
    self.line_tokens = tokenizer.encode_batch(self.lines)
    self.total = sum(len(t) for t in self.line_tokens)

  def window(self, n_tokens: int, rng: np.random.Generator) -> tuple[list[list[int]], str]:
    """Consecutive lines (the last cut) totalling exactly n_tokens, and their text."""
    if n_tokens > self.total:
      raise EvalError(f"needle: held-out text has {self.total} tokens, fewer than the "
                      f"{n_tokens} a haystack needs")
    i = int(rng.integers(len(self.lines)))
    lines, texts, got = [], [], 0
    while got < n_tokens:
      toks = self.line_tokens[i % len(self.lines)][:n_tokens - got]
      lines.append(toks)
      texts.append(self.lines[i % len(self.lines)])
      got += len(toks)
      i += 1
    return lines, "".join(texts)


def build_sample(haystack: Haystack, length: int, num_needles: int, num_queries: int,
                 depth: float, rng: np.random.Generator) -> Sample:
  tok = haystack.tokenizer
  if not 1 <= num_queries <= num_needles:
    raise EvalError(f"needle: need 1 <= R <= N, got N={num_needles}, R={num_queries}")
  cities = [str(c) for c in rng.permutation(CITIES)]
  numbers: list[str] = []
  while len(numbers) < num_needles:
    n = str(int(rng.integers(10 ** (NUMBER_DIGITS - 1), 10 ** NUMBER_DIGITS)))
    if n not in numbers:
      numbers.append(n)
  number_toks = [tok.encode(" " + n) for n in numbers]
  answer_tokens = max(len(t) for t in number_toks) + 2
  end_toks = tok.encode(".\n")
  # Budget with the longest possible names, then fill the haystack exactly.
  prefix_len = max(len(tok.encode(NEEDLE.format(city=c))) for c in cities)
  query_sep = tok.encode("\n\n")
  prompt_budget = length - answer_tokens - len(query_sep) - prefix_len
  hay_len = prompt_budget - sum(prefix_len + len(t) + len(end_toks) for t in number_toks)
  if hay_len < 1:
    raise EvalError(f"needle: length {length} is too short for {num_needles} needles")
  lines, text = haystack.window(hay_len, rng)
  lowered = text.lower()
  cities = [c for c in cities if c.lower() not in lowered][:num_needles]
  if len(cities) < num_needles or any(n in text for n in numbers):
    raise EvalError("needle: not enough cities/numbers absent from the haystack")
  needle_toks = [tok.encode(NEEDLE.format(city=c)) + t + end_toks
                 for c, t in zip(cities, number_toks)]
  # Line boundaries (token offsets) where needles may go.
  bounds = np.cumsum([0] + [len(l) for l in lines])
  answer_at = int(bounds[np.argmin(np.abs(bounds - depth * bounds[-1]))])
  others = bounds[bounds != answer_at]  # the answer's boundary stays its own
  slots = [answer_at] + [int(b) for b in rng.choice(others if len(others) else bounds,
                                                      num_needles - 1)]
  queried = [0] + [int(i) for i in rng.permutation(np.arange(1, num_needles))[:num_queries - 1]]
  hay = [t for l in lines for t in l]
  order = sorted(range(num_needles), key=lambda i: (slots[i], i))
  context: list[int] = []
  placed: dict[int, Needle] = {}
  cursor = 0
  for i in order:
    context += hay[cursor:slots[i]]
    cursor = slots[i]
    placed[i] = Needle(cities[i], numbers[i], len(context), len(context) + len(needle_toks[i]),
                        i in queried, i == 0)
    context += needle_toks[i]
  context += hay[cursor:]
  queries = [(cities[i], numbers[i],
              context + query_sep + tok.encode(NEEDLE.format(city=cities[i])))
             for i in queried]
  needles = [placed[i] for i in range(num_needles)]
  sample = Sample(context, needles, queries, depth, length, answer_tokens)
  verify(sample, tok, needle_toks)
  return sample


def verify(sample: Sample, tok, needle_toks: list[list[int]]) -> None:
  """Raises unless every needle survived construction exactly once with a unique key."""
  cities = [n.city for n in sample.needles]
  if len(set(cities)) != len(cities) or len({n.number for n in sample.needles}) != len(cities):
    raise AssertionError("needle: duplicate city or number")
  text = tok.decode(sample.context)
  for n, toks in zip(sample.needles, needle_toks):
    if sample.context[n.start:n.end] != toks:
      raise AssertionError(f"needle for {n.city} not at tokens {n.start}:{n.end}")
    sentence = f"{NEEDLE.format(city=n.city)} {n.number}."
    if text.count(sentence) != 1 or text.count(n.city) != 1 or text.count(n.number) != 1:
      raise AssertionError(f"needle for {n.city} is not present exactly once")
  for _, _, prompt in sample.queries:
    if len(prompt) + sample.answer_tokens > sample.length:
      raise AssertionError("needle: prompt longer than planned")


def build_samples(haystack: Haystack, length: int, num_needles: int, num_queries: int,
                  depths, count: int, seed: int) -> list[Sample]:
  rng = np.random.default_rng([seed, length, num_needles, num_queries])
  return [build_sample(haystack, length, num_needles, num_queries, d, rng)
          for d in depths for _ in range(count)]


def model_generator(fns: common.Fns, batch_size: int, num_ids: int | None = None):
  """generate_fn(prompts, max_new) -> new tokens, greedy with the KV cache, in batches; ids from
  `num_ids` up (padded vocabulary rows) are never produced."""
  def generate_fn(prompts: list[list[int]], max_new: int) -> list[list[int]]:
    out = []
    for chunk in common.batched(prompts, batch_size):
      out += decoding.generate(fns, chunk, max_new, num_ids=num_ids)
    return out
  return generate_fn


def score(samples: list[Sample], generate_fn, tokenizer, progress: bool = False) -> list[bool]:
  """Per sample: all asked numbers produced exactly."""
  rows = [(s_i, number, prompt) for s_i, s in enumerate(samples) for _, number, prompt in s.queries]
  max_new = max(s.answer_tokens for s in samples)
  ok = [True] * len(samples)
  for chunk in tqdm(list(common.batched(rows, 16)), desc="needle", disable=not progress,
                    leave=False):
    gens = generate_fn([p for _, _, p in chunk], max_new)
    for (s_i, number, _), gen in zip(chunk, gens):
      ok[s_i] &= correct(tokenizer.decode(gen), number)
  return ok


def evaluate(samples_by_key: dict, generate_fn, tokenizer, progress: bool = False) -> dict:
  """{(N, R): {length: {depth: accuracy}}} for samples grouped by (N, R, length)."""
  acc: dict = {}
  for (n, r, length), samples in samples_by_key.items():
    ok = score(samples, generate_fn, tokenizer, progress)
    per_depth: dict[float, list[bool]] = {}
    for s, good in zip(samples, ok):
      per_depth.setdefault(s.depth, []).append(good)
    acc.setdefault(f"N={n},R={r}", {})[str(length)] = {
        f"{d:g}": float(np.mean(v)) for d, v in sorted(per_depth.items())}
  return acc


def lengths_for(model, settings) -> list[int]:
  limit = model.spec.max_seq_len
  lengths = list(settings.needle_lengths) or sorted({limit // 2, limit})
  for n in lengths:
    common.check_context(model, n, "needle")
  return lengths


def run(fns: common.Fns, tokenizer, texts: list[str], settings, out_dir) -> dict:
  haystack = Haystack(texts, tokenizer)
  lengths = lengths_for(fns.model, settings)
  groups = {(n, r, L): build_samples(haystack, L, n, r, settings.depths, settings.needle_samples,
                                     settings.seed)
            for n, r in settings.needle_configs for L in lengths}
  acc = evaluate(groups, model_generator(fns, settings.batch_size, tokenizer.vocab_size),
                 tokenizer, progress=True)
  summary = {cfg: float(np.mean([a for per_len in v.values() for a in per_len.values()]))
             for cfg, v in acc.items()}
  plot = heatmap(acc, out_dir / "needle.png")
  return dict(accuracy=acc, mean_accuracy=summary, samples_per_cell=settings.needle_samples,
              lengths=lengths, depths=list(settings.depths), plots=[plot],
              protocol="completion prompt per asked needle, greedy KV-cache decoding; a sample "
                       "is right when every asked number is produced exactly")


def heatmap(acc: dict, path) -> str:
  fig, axes = common.figure(len(acc), size=(3.4 * len(acc), 3))
  axes = axes if isinstance(axes, list) else [axes]
  for ax, (cfg, per_len) in zip(axes, acc.items()):
    lengths = list(per_len)
    depths = list(next(iter(per_len.values())))
    grid = np.array([[per_len[L][d] for L in lengths] for d in depths])
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), lengths)
    ax.set_yticks(range(len(depths)), [f"{float(d):.0%}" for d in depths])
    ax.set_xlabel("context length")
    ax.set_ylabel("answer depth")
    ax.set_title(cfg)
    for (i, j), a in np.ndenumerate(grid):
      ax.text(j, i, f"{a:.2f}", ha="center", va="center", fontsize=8)
  fig.colorbar(im, ax=axes, shrink=0.8)
  return common.save_figure(fig, path)
