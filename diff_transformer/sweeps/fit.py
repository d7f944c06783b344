"""Scaling-law fits L(X) = E + A X^-alpha (X = parameters N or training tokens D) and the papers'
headline ratios ("DIFF 6.8B matches Transformer 11B (62.2%)")."""
from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class PowerLaw:
  E: float
  A: float
  alpha: float
  # One-sigma uncertainties from the fit covariance (nan when the fit has no spare points).
  E_err: float = math.nan
  A_err: float = math.nan
  alpha_err: float = math.nan
  x_scale: float = 1.0  # X is fitted as X / x_scale for conditioning; A refers to raw X
  # What the fit rests on: its points, their X range and the goodness of fit in loss space.
  n_points: int = 0
  x_min: float = math.nan
  x_max: float = math.nan
  r2: float = math.nan

  def __call__(self, x) -> np.ndarray:
    return self.E + self.A * np.asarray(x, np.float64) ** -self.alpha

  def inverse(self, loss: float) -> float:
    """The X at which the law reaches `loss` (inf when loss <= E)."""
    return math.inf if loss <= self.E else (self.A / (loss - self.E)) ** (1 / self.alpha)


def fit_power_law(x, loss) -> PowerLaw:
  """Least squares in loss space, on X normalised by its geometric mean for conditioning."""
  x, loss = np.asarray(x, np.float64), np.asarray(loss, np.float64)
  if len(x) < 3 or len(np.unique(x)) < 3:
    raise ValueError(f"fit: need at least 3 distinct points, got {len(np.unique(x))}")
  scale = float(np.exp(np.mean(np.log(x))))
  u = x / scale

  def law(u, E, a, alpha):
    return E + a * u ** -alpha

  E0 = max(0.0, loss.min() - 0.5 * (loss.max() - loss.min()) - 1e-3)
  slope = -np.polyfit(np.log(u), np.log(np.maximum(loss - E0, 1e-9)), 1)[0]
  p0 = (E0, float(np.exp(np.mean(np.log(np.maximum(loss - E0, 1e-9))))), max(float(slope), 0.05))
  from scipy import optimize  # about 1 s to import: only when fitting, not at sweep.py's start
  popt, pcov = optimize.curve_fit(law, u, loss, p0=p0, maxfev=20_000,
                                  bounds=([0.0, 0.0, 0.0], [np.inf, np.inf, 5.0]))
  E, a, alpha = popt
  errs = np.sqrt(np.diag(pcov)) if len(x) > 3 and np.isfinite(pcov).all() else [math.nan] * 3
  A = a * scale ** alpha  # a u^-alpha = a scale^alpha x^-alpha
  A_err = errs[1] * scale ** alpha if np.isfinite(errs[1]) else math.nan
  residual = loss - law(u, *popt)
  spread = float(np.sum((loss - loss.mean()) ** 2))
  r2 = 1.0 - float(np.sum(residual ** 2)) / spread if spread > 0 else math.nan
  return PowerLaw(float(E), float(A), float(alpha), float(errs[0]), float(A_err), float(errs[2]),
                  x_scale=scale, n_points=len(x), x_min=float(x.min()), x_max=float(x.max()),
                  r2=r2)


# When a fit may be read off: spare points beyond its 3 parameters, a good fit, a determined
# exponent, and no extrapolation beyond one order of magnitude outside the measured X range.
MIN_POINTS = 4
MIN_R2 = 0.9
MAX_ALPHA_REL_ERR = 0.5
MAX_EXTRAPOLATION = 10.0


def unsupported(law: PowerLaw, x: float) -> str | None:
  """Why reading `law` at `x` is not meaningful, or None when it is supported."""
  if law.n_points < MIN_POINTS:
    return f"{law.n_points} points for 3 parameters (need >= {MIN_POINTS})"
  if not law.r2 >= MIN_R2:
    return f"poor fit (R^2 = {law.r2:.2f} < {MIN_R2})"
  if not (law.alpha > 0 and law.alpha_err / law.alpha <= MAX_ALPHA_REL_ERR):
    return f"exponent undetermined (alpha = {law.alpha:.3g} ± {law.alpha_err:.2g})"
  if not law.x_min / MAX_EXTRAPOLATION <= x <= law.x_max * MAX_EXTRAPOLATION:
    return (f"{_fmt_params(x)} lies more than {MAX_EXTRAPOLATION:g}x outside the measured range "
            f"{_fmt_params(law.x_min)}-{_fmt_params(law.x_max)}")
  return None


def matching_ratio(reference: PowerLaw, x: float, loss: float) -> dict:
  """How much X the `reference` law (the Transformer) needs to reach `loss`, reached by another
  model at `x`: {'x', 'matched_x', 'ratio' = x / matched_x}."""
  matched = reference.inverse(loss)
  return dict(x=float(x), matched_x=float(matched),
              ratio=float(x / matched) if matched else math.nan)


def headline(variant: str, x: float, ratio: dict, unit: str = "params",
             reference: PowerLaw | None = None) -> str:
  """The papers' sentence, or why it cannot be said when the `reference` law does not support
  reading it at the matched X."""
  fmt = _fmt_params if unit == "params" else _fmt_tokens
  why = unsupported(reference, ratio["matched_x"]) if reference is not None and math.isfinite(
      ratio["matched_x"]) else None
  if reference is not None and why is None and not math.isfinite(ratio["matched_x"]):
    why = unsupported(reference, x)
  if why is not None:
    return (f"{variant} {fmt(x)}: no matching Transformer size is stated; the Transformer fit is "
            f"not meaningful there ({why})")
  if not math.isfinite(ratio["matched_x"]):
    return (f"{variant} {fmt(x)} reaches a loss below the Transformer fit's floor E (no "
            f"Transformer size matches it)")
  return (f"{variant} {fmt(x)} matches Transformer {fmt(ratio['matched_x'])} "
          f"({100 * ratio['ratio']:.1f}%)")


def _fmt_params(n: float) -> str:
  if not math.isfinite(n):
    return "inf"
  for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if n >= size:
      return f"{n / size:.3g}{unit}"
  return f"{n:.3g}"


def _fmt_tokens(n: float) -> str:
  return _fmt_params(n).replace("B", "B tokens").replace("M", "M tokens").replace("K", "K tokens")
