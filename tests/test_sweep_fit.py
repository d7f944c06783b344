import numpy as np
import pytest

from diff_transformer.sweeps import fit


@pytest.mark.parametrize("E,A,alpha", [(1.8, 420.0, 0.34), (2.5, 60.0, 0.2), (0.9, 4000.0, 0.5)])
def test_fit_recovers_known_power_law(E, A, alpha):
  n = np.geomspace(2e6, 3e9, 7)
  law = fit.fit_power_law(n, E + A * n ** -alpha)
  assert abs(law.E / E - 1) < 0.02 and abs(law.A / A - 1) < 0.02
  assert abs(law.alpha / alpha - 1) < 0.02


def test_fit_with_noise_reports_uncertainty():
  rng = np.random.default_rng(0)
  n = np.geomspace(1e7, 1e10, 8)
  loss = 2.0 + 300 * n ** -0.3 + rng.normal(0, 0.003, n.shape)
  law = fit.fit_power_law(n, loss)
  assert abs(law.alpha - 0.3) < 4 * law.alpha_err + 0.03
  assert 0 < law.alpha_err < 0.2


def test_matching_ratio_inverts_the_law():
  transformer = fit.PowerLaw(E=1.7, A=500.0, alpha=0.3)
  # A DIFF model at 6.8B reaching the loss the Transformer reaches at 11B.
  ratio = fit.matching_ratio(transformer, 6.8e9, float(transformer(11e9)))
  assert abs(ratio["matched_x"] / 11e9 - 1) < 1e-9
  assert fit.headline("DIFF", 6.8e9, ratio) == "DIFF 6.8B matches Transformer 11B (61.8%)"


def test_too_few_points_is_an_error():
  with pytest.raises(ValueError, match="at least 3"):
    fit.fit_power_law([1e6, 1e7], [3.0, 2.5])


def test_headline_when_the_transformer_never_reaches_the_loss():
  transformer = fit.PowerLaw(E=2.0, A=50.0, alpha=0.3)
  ratio = fit.matching_ratio(transformer, 1e9, 1.9)
  assert ratio["matched_x"] == float("inf")
  assert "below the Transformer fit's floor" in fit.headline("diff_v2", 1e9, ratio)


def test_headline_refuses_an_unsupported_fit():
  n = np.geomspace(1e5, 3e6, 4)
  good = fit.fit_power_law(n, 2.0 + 300 * n ** -0.3)
  ratio = fit.matching_ratio(good, 3e6, float(good(2e6)))
  assert "matches Transformer" in fit.headline("diff", 3e6, ratio, reference=good)
  # Far outside the measured range: said, not extrapolated.
  far = fit.matching_ratio(good, 3e6, float(good(1e9)))
  assert "more than 10x outside the measured range" in fit.headline("diff", 3e6, far,
                                                                     reference=good)
  # Noise without a trend: a poor or undetermined fit gives no number.
  rng = np.random.default_rng(1)
  noisy = fit.fit_power_law(n, 3.0 + rng.normal(0, 0.05, n.shape))
  text = fit.headline("diff", 3e6, fit.matching_ratio(noisy, 3e6, 3.0), reference=noisy)
  assert "not meaningful" in text and "%" not in text
  three = fit.fit_power_law(n[:3], 2.0 + 300 * n[:3] ** -0.3)
  assert "3 points for 3 parameters" in fit.headline(
      "diff", 1e6, fit.matching_ratio(three, 1e6, 2.5), reference=three)
