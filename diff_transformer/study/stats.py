"""Per-variant summaries and paired differences against the baseline over seeds."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats


def summarize(values: list[float]) -> dict:
  """{"mean", "std" (sample, ddof 1; nan for one value), "n"} over the finite values."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
  n = len(x)
  return dict(mean=float(x.mean()) if n else math.nan,
              std=float(x.std(ddof=1)) if n > 1 else math.nan, n=n)


def paired(variant: dict[int, float], baseline: dict[int, float]) -> dict:
  """Mean of the per-seed differences variant - baseline with a two-sided 95% t interval
  (seeds present in both; nan bounds for fewer than two pairs)."""
  seeds = sorted(s for s in variant.keys() & baseline.keys()
                 if math.isfinite(variant[s]) and math.isfinite(baseline[s]))
  d = np.asarray([variant[s] - baseline[s] for s in seeds], np.float64)
  n = len(d)
  if n == 0:
    return dict(mean_diff_vs_transformer=math.nan, ci95_low=math.nan, ci95_high=math.nan, n=0)
  mean = float(d.mean())
  if n < 2:
    return dict(mean_diff_vs_transformer=mean, ci95_low=math.nan, ci95_high=math.nan, n=n)
  half = float(scipy_stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n))
  return dict(mean_diff_vs_transformer=mean, ci95_low=mean - half, ci95_high=mean + half, n=n)
