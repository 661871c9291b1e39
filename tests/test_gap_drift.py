"""The paired gap's noise-corrected drift part (scalelab.fitting.comparisons.gap_drift) on synthetic truths: it
recovers a known drift exactly, takes out exactly the noise a fold's miss carries, keeps a drifting
gap out of the pure error, and on the demo's design covers drifting gaps while deciding steady ones
that the first version (backtest_t) could not."""

import math

import numpy as np
import pytest

from scalelab.errors import UsageError
from scalelab.fitting.comparisons.design_bootstrap import resample_design
from scalelab.fitting.comparisons.gap_drift import PureError, noise_corrected_drift, pure_error
from scalelab.fitting.comparisons.gap_model import GapPoints, fit_gap_line
from scalelab.fitting.comparisons.paired_gap import Measurement, paired_gap

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
    curved = _points(_truth(0.02, 0.03))
    actual = 0.03 + 0.02 * 1.5 + 0.03 * 1.5**2 - fit_gap_line(curved, drift=True).predict(TARGET)
    assert noise_corrected_drift(curved, drift=True, noise=noise).sd_at(1.5) == pytest.approx(actual, rel=0.05)


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


def _study(slope: float, curve: float, sigma: float, seed: int, method: str):
    rng = np.random.default_rng(seed)
    pts = _points(_truth(slope, curve) + rng.normal(0, sigma, X.size))
    counts = resample_design(pts.group, pts.log_budget, 32, seed).row_counts(pts.group)
    est = paired_gap(
        pts, target_log_budget=TARGET, counts=counts, measurement=Measurement(sizes=3, pairs=6), method=method
    )
    truth = 0.03 + slope * (TARGET - X.mean()) + curve * (TARGET - X.mean()) ** 2
    measured = truth + rng.normal(0, sigma / math.sqrt(6))  # its sizes' pattern averages to 0, as the design's
    return est.at_target, measured


# (slope per decade, curvature per decade^2) of the true gap in ln ratio, the least coverage of the
# measured gap over 60 studies (nominal 95%) and the most of the first version's median width; measured
# at SE_WEIGHT 0.5: coverage 1.0, 1.0 and 0.80 (the first version 0.92: a curvature two folds measure
# poorly, docs/studies.md 2.2), width 0.80, 0.60 and 0.71 of the first version's
CASES = {"steady": (0.0, 0.0, 0.9, 0.85), "drifting": (0.03, 0.0, 0.9, 0.85), "curving": (0.02, 0.01, 0.75, 0.85)}


@pytest.mark.parametrize("case", list(CASES))
def test_the_interval_covers_steady_drifting_and_curving_gaps_and_is_narrower_than_the_first_version(case):
    slope, curve, least, most = CASES[case]
    covered, width, old_width = [], [], []
    for r in range(60):  # the same draws for both methods
        g, measured = _study(slope, curve, 0.008, r, "noise_corrected")
        old, _ = _study(slope, curve, 0.008, r, "backtest_t")
        covered.append(g.lo <= measured <= g.hi)
        width.append(g.hi - g.lo)
        old_width.append(old.hi - old.lo)
    assert np.mean(covered) >= least, (case, np.mean(covered))
    assert np.median(width) < most * np.median(old_width), (case, np.median(width), np.median(old_width))


def test_an_unknown_method_is_refused():
    with pytest.raises(UsageError, match="method 'pooled' is not one of noise_corrected, backtest_t"):
        paired_gap(
            _points(_truth(0.0)),
            target_log_budget=TARGET,
            counts=np.ones((1, 12)),
            measurement=Measurement(),
            method="pooled",
        )


def test_a_design_without_pure_error_falls_back_on_the_line_residuals():
    x = np.array([11.3, 11.8, 12.3])
    pts = GapPoints(log_budget=x, size=[0, 0, 0], group=["a", "b", "c"], log_ratio=[0.031, 0.028, 0.032])
    est = paired_gap(pts, target_log_budget=TARGET, counts=np.ones((4, 3)), measurement=Measurement(sizes=3, pairs=6))
    assert pure_error(pts).dof == 0 and est.noise.dof == 0 and est.noise.sigma > 0
    assert math.isfinite(est.at_target.lo) and est.at_target.lo < 0.03 < est.at_target.hi
