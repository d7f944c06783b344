"""Per-variant summaries, paired comparisons against the baseline over seeds, an exact sign-flip
test, Holm's correction and medians of censored times.

Why these: at 3-5 seeds a t interval rests on a normality nobody can check, so every paired
difference also carries an exact permutation p (all 2^n sign flips of the per-seed
differences); with n pairs the smallest two-sided p is 2 / 2^n (0.0625 at n = 5), which is what
n can show. Secondary metrics are many, so their p values are Holm-adjusted as one family.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import stats as scipy_stats


def summarize(values: list[float]) -> dict:
  """{"mean", "std" (sample, ddof 1; nan for one value), "n"} over the finite values."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
  n = len(x)
  return dict(mean=float(x.mean()) if n else math.nan,
              std=float(x.std(ddof=1)) if n > 1 else math.nan, n=n)


def sign_flip_p(d: list[float] | np.ndarray) -> float:
  """Exact two-sided paired permutation p: the share of the 2^n sign assignments of the
  differences whose |sum| is at least the observed |sum| (nan for no pairs)."""
  d = np.asarray(d, np.float64)
  if len(d) == 0:
    return math.nan
  signs = np.asarray(list(itertools.product((1.0, -1.0), repeat=len(d))))
  sums = np.abs(signs @ d)
  observed = abs(d.sum())
  return float(np.mean(sums >= observed - 1e-12 * max(1.0, observed)))


def min_p(n: int) -> float:
  """The smallest two-sided p the sign-flip test can give with n pairs."""
  return 2.0 / 2 ** n if n else math.nan


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
  interval (nan below two pairs), exact sign-flip p, n."""
  seeds = sorted(s for s in variant.keys() & baseline.keys()
                 if math.isfinite(variant[s]) and math.isfinite(baseline[s]))
  d = np.asarray([variant[s] - baseline[s] for s in seeds], np.float64)
  n = len(d)
  mean = float(d.mean()) if n else math.nan
  low = high = math.nan
  if n >= 2:
    half = float(scipy_stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
  return dict(mean_diff=mean, ci95_low=low, ci95_high=high, p=sign_flip_p(d), n=n)


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
