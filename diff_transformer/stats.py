"""Per-variant summaries, paired comparisons against the baseline over seeds (an exact sign-flip
test; for times censored at a budget, a sign test on the pairs whose order is known), Holm's
correction, medians of censored times, and what a design can reach.

Why these: at a handful of seeds a t interval rests on a normality nobody can check, so every
paired difference carries an exact p; with n pairs the smallest two-sided p is 2 / 2^n (0.0625 at
n = 5), and a Holm family of m comparisons cannot go below m times that (`smallest_holm_p`), which
is what a study's design check (study/definition.py) holds against 0.05.
"""
from __future__ import annotations

import math

import numpy as np


def _t_ppf(q: float, df: int) -> float:
  # scipy.stats takes about 2 s to import: only a report needs it, not every training process
  # that loads a study file.
  from scipy import stats
  return float(stats.t.ppf(q, df))


ALPHA = 0.05


def summarize(values: list[float]) -> dict:
  """{"mean", "std" (sample, ddof 1; nan for one value), "n"} over the finite values."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
  n = len(x)
  return dict(mean=float(x.mean()) if n else math.nan,
              std=float(x.std(ddof=1)) if n > 1 else math.nan, n=n)


# The most pairs an exact sign-flip p is computed for: it counts 2^n sign assignments from each
# half's 2^(n/2) sums (2^20 at 40 pairs); a study refuses more seeds before any run.
MAX_EXACT_PAIRS = 40


def _signed_sums(d: np.ndarray) -> np.ndarray:
  """The 2^len(d) sums of +-d_i, one per sign assignment."""
  sums = np.zeros(1)
  for x in d:
    sums = np.concatenate([sums + x, sums - x])
  return sums


def sign_flip_p(d: list[float] | np.ndarray) -> float:
  """Exact two-sided paired permutation p: the share of the 2^n sign assignments of the
  differences whose |sum| is at least the observed |sum| (nan for no pairs). Counted without
  listing them all: each assignment is a sum over the first half's signs plus one over the
  second's, so the second half's sums, sorted, are searched once per first-half sum."""
  d = np.asarray(d, np.float64)
  if len(d) == 0:
    return math.nan
  if len(d) > MAX_EXACT_PAIRS:
    raise ValueError(f"an exact sign-flip p is computed for at most {MAX_EXACT_PAIRS} pairs, "
                     f"got {len(d)}")
  observed = abs(d.sum())
  at_least = observed - 1e-12 * max(1.0, observed)  # the observed sum itself, summed otherwise
  if at_least <= 0:
    return 1.0
  first, second = _signed_sums(d[:len(d) // 2]), np.sort(_signed_sums(d[len(d) // 2:]))
  # Flipping every sign negates a sum, so |sum| >= at_least holds for twice as many assignments
  # as sum >= at_least, that is second >= at_least - first.
  above = len(second) - np.searchsorted(second, at_least - first)
  return float(2 * above.sum() / 2 ** len(d))


def min_p(n: int) -> float:
  """The smallest two-sided p the sign-flip test can give with n pairs."""
  return 2.0 / 2 ** n if n else math.nan


def smallest_holm_p(comparisons: int, seeds: int) -> float:
  """The smallest Holm-adjusted p a family of `comparisons` exact paired tests can reach with
  `seeds` pairs each: the smallest single p times the family size."""
  return min(1.0, comparisons * min_p(seeds)) if comparisons and seeds else math.nan


def seeds_needed(comparisons: int) -> int:
  return next(n for n in range(1, 64) if smallest_holm_p(comparisons, n) < ALPHA)


def holm(ps: dict) -> dict:
  """Holm's step-down adjusted p values for one family {key: p} (nan p stays nan, unranked)."""
  ranked = sorted((p, k) for k, p in ps.items() if not math.isnan(p))
  m, out, running = len(ranked), {k: math.nan for k in ps}, 0.0
  for i, (p, k) in enumerate(ranked):
    running = max(running, min(1.0, (m - i) * p))
    out[k] = running
  return out


def paired(variant: dict[int, float], baseline: dict[int, float]) -> dict:
  """Per-seed differences variant - baseline (seeds present in both): mean, two-sided 95% t
  interval and standard deviation (nan below two pairs), exact sign-flip p, n."""
  seeds = sorted(s for s in variant.keys() & baseline.keys()
                 if math.isfinite(variant[s]) and math.isfinite(baseline[s]))
  d = np.asarray([variant[s] - baseline[s] for s in seeds], np.float64)
  n = len(d)
  mean = float(d.mean()) if n else math.nan
  low = high = sd = math.nan
  if n >= 2:
    sd = float(d.std(ddof=1))
    half = _t_ppf(0.975, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
  return dict(mean_diff=mean, ci95_low=low, ci95_high=high, sd=sd, p=sign_flip_p(d), n=n)


def censored_median(times: list[float], reached: list[bool]) -> float:
  """Kaplan-Meier median of times censored at the budget (a run that never reached the level
  counts as 'later than its last step'); inf when half or more never reached it. With every
  run censored at the same budget this is the sample median with censored runs ranked last."""
  order = sorted(zip(times, reached), key=lambda tr: (tr[0], not tr[1]))
  alive, surviving = len(order), 1.0
  for t, event in order:
    if event:
      surviving *= 1 - 1 / alive
      if surviving <= 0.5 + 1e-12:
        return float(t)
    alive -= 1
  return math.inf


def sign_test_p(earlier: int, later: int) -> float:
  """Exact two-sided sign test on the determined, untied pairs (nan for none)."""
  from scipy import stats  # see _t_ppf
  n = earlier + later
  return float(stats.binomtest(earlier, n, 0.5).pvalue) if n else math.nan


def paired_censored(variant: dict[int, tuple[float, bool]], baseline: dict[int, tuple[float, bool]]
                    ) -> dict:
  """Per-seed comparison of times censored at a budget ({seed: (time, reached)}; a run that never
  reached the level has time = its last step, a lower bound on when it would have).

  Each pair is earlier (the variant reached the level first, or the baseline never did by the
  variant's time), later, tied, or undetermined (both censored, or one censored before the other's
  time). p is an exact sign test on the determined untied pairs. The mean difference is exact only
  when no pair is censored; when every censored pair bounds it from the same side it is that bound
  ('<=' or '>='), otherwise it is not bounded ('undetermined'). No t interval for such a metric."""
  seeds = sorted(variant.keys() & baseline.keys())
  earlier = later = tied = 0
  diffs: list[float] = []
  sides: set[str] = set()
  for s in seeds:
    (tv, rv), (tb, rb) = variant[s], baseline[s]
    diffs.append(tv - tb)
    if rv and rb:
      earlier, later, tied = earlier + (tv < tb), later + (tv > tb), tied + (tv == tb)
    elif rv and tv <= tb:  # the baseline had not reached it by tv: the true difference is < tv - tb
      earlier, sides = earlier + 1, sides | {"<="}
    elif rb and tb <= tv:
      later, sides = later + 1, sides | {">="}
    else:
      sides.add("undetermined")
  n = len(seeds)
  bound = None if not sides else (sides.pop() if len(sides) == 1 else "undetermined")
  mean = float(np.mean(diffs)) if n else math.nan
  return dict(mean_diff=mean if bound != "undetermined" else math.nan, bound=bound, n=n,
              n_determined=earlier + later + tied, earlier=earlier, later=later, tied=tied,
              p=sign_test_p(earlier, later), censored=True)


def smallest_effect(n: int, comparisons: int, power: float = 0.8) -> float:
  """The paired effect, in standard deviations of the paired differences, that a design of n
  seeds detects with `power` at the strictest Holm step (alpha / comparisons, two-sided): the
  paired t approximation (t_{1-a/2} + t_power) / sqrt(n) to the exact sign-flip test, which
  needs at least this much."""
  if n < 2 or comparisons < 1:
    return math.inf
  df = n - 1
  alpha = ALPHA / comparisons
  return (_t_ppf(1 - alpha / 2, df) + _t_ppf(power, df)) / math.sqrt(n)
