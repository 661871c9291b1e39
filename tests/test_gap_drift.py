"""The paired gap's noise-corrected drift part (scalelab.fitting.gap_drift) on synthetic truths: it
recovers a known drift exactly, takes out exactly the noise a fold's miss carries, keeps a drifting
gap out of the pure error, and on the demo's design covers drifting gaps while deciding steady ones
that the first version (backtest_t) could not."""

import math

import numpy as np
import pytest

from scalelab.errors import UsageError
from scalelab.fitting.design_bootstrap import resample_design
from scalelab.fitting.gap_drift import PureError, noise_corrected_drift, pure_error
from scalelab.fitting.gap_model import GapPoints
from scalelab.fitting.paired_gap import Measurement, paired_gap

X = np.repeat([11.3, 11.8, 12.3], 4)  # the demo's budgets (log10 2e11, 6.3e11, 2e12), 4 sizes each
SIZE = np.tile(np.arange(4), 3)
PATTERN = np.array([0.02, -0.01, 0.0, -0.01])  # a size pattern, the same at every budget
TARGET = 13.3


def _points(y) -> GapPoints:
    return GapPoints(log_budget=X, size=SIZE, group=[f"{a}/{b}" for a, b in zip(X, SIZE)], log_ratio=y)


def _truth(slope: float, curve: float = 0.0) -> np.ndarray:
    dx = X - X.mean()
    return 0.03 + slope * dx + curve * dx**2 + PATTERN[SIZE]


def test_a_constant_gap_fitted_to_a_drifting_truth_is_charged_its_drift_exactly():
    noise = pure_error(_points(_truth(0.02)))
    assert noise.sigma == pytest.approx(0.0, abs=1e-12)  # the drift does not leak into the pure error
    assert noise.tau == pytest.approx(float(np.std(PATTERN, ddof=1)))
    term = noise_corrected_drift(_points(_truth(0.02)), drift=False, noise=noise)
    # every fold misses by slope x its distance from the training centroid; so does the target
    assert [abs(r["miss"]) / r["decades"] for r in term.misses] == pytest.approx([0.02] * 4)
    assert term.k2 == pytest.approx(0.02**2) and term.se == pytest.approx(0.0, abs=1e-15)
    assert term.sd_at(TARGET - X.mean()) == pytest.approx(0.02 * 1.5)
    steady = noise_corrected_drift(_points(_truth(0.0)), drift=False, noise=noise)
    assert steady.per_decade == pytest.approx(0.0, abs=1e-9)
    # a drifting line follows a linear truth; it is charged for curvature only
    assert noise_corrected_drift(_points(_truth(0.02)), drift=True, noise=noise).k2 == pytest.approx(0, abs=1e-12)
    assert noise_corrected_drift(_points(_truth(0.02, 0.03)), drift=True, noise=noise).k2 > 1e-4


def test_the_noise_taken_out_of_each_fold_is_what_its_miss_carries():
    """With no drift, a fold's mean squared miss over many draws is its noise_var: nothing more is
    subtracted, nothing less (the noise a constant and a drifting line carry differ)."""
    rng = np.random.default_rng(0)
    sigma = 0.006
    for drift in (False, True):
        m2, v = [], []
        for _ in range(400):
            pts = _points(_truth(0.0) + rng.normal(0, sigma, X.size))
            term = noise_corrected_drift(pts, drift=drift, noise=PureError(sigma=sigma, tau=0.0, dof=6))
            m2.append([r["miss"] ** 2 for r in term.misses])
            v.append([r["noise_var"] for r in term.misses])
        ratio = np.mean(m2, axis=0) / np.mean(v, axis=0)
        assert ratio == pytest.approx(np.ones_like(ratio), abs=0.2), (drift, ratio)


def test_the_pure_error_is_unbiased_whatever_the_gap_does_with_scale():
    rng = np.random.default_rng(1)
    sig = [pure_error(_points(_truth(0.05, 0.04) + rng.normal(0, 0.005, X.size))).sigma ** 2 for _ in range(300)]
    assert math.sqrt(np.mean(sig)) == pytest.approx(0.005, rel=0.08)


def _study(slope: float, sigma: float, seed: int, method: str):
    rng = np.random.default_rng(seed)
    pts = _points(_truth(slope) + rng.normal(0, sigma, X.size))
    counts = resample_design(pts.group, pts.log_budget, 32, seed).row_counts(pts.group)
    est = paired_gap(
        pts, target_log_budget=TARGET, counts=counts, measurement=Measurement(sizes=3, pairs=6), method=method
    )
    truth = 0.03 + slope * (TARGET - X.mean())
    measured = truth + rng.normal(0, sigma / math.sqrt(6))  # its sizes' pattern averages to 0, as the design's
    return est.at_target, measured


@pytest.mark.parametrize("slope", [0.0, 0.01, 0.03])
def test_the_interval_covers_steady_and_drifting_gaps_and_is_narrower_than_the_first_version(slope):
    covered, width, old_width = [], [], []
    for r in range(60):  # the same draws for both methods
        g, measured = _study(slope, 0.008, r, "noise_corrected")
        old, _ = _study(slope, 0.008, r, "backtest_t")
        covered.append(g.lo <= measured <= g.hi)
        width.append(g.hi - g.lo)
        old_width.append(old.hi - old.lo)
    assert np.mean(covered) >= 0.9, (slope, np.mean(covered))  # nominal 95%: 60 studies
    # measured: 0.78, 0.76 and 0.7 of the first version's median width (slopes 0, 0.01, 0.03)
    assert np.median(width) < 0.85 * np.median(old_width), (slope, np.median(width), np.median(old_width))


def test_an_unknown_method_is_refused():
    with pytest.raises(UsageError, match="method 'pooled' is not one of noise_corrected, backtest_t"):
        paired_gap(
            _points(_truth(0.0)),
            target_log_budget=TARGET,
            counts=np.ones((1, 12)),
            measurement=Measurement(),
            method="pooled",
        )
