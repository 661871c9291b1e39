"""Departures of a run from its curve law (fitting/loss_curves/curve_departures.py), on simulated runs: an LR cut
the law is not told about is found at its checkpoint; a run that follows the law, or has one
outlier point, has none; law selection reports the held-out run's departures."""

import numpy as np
import pytest

from scalelab.errors import UsageError
from scalelab.fitting.loss_curves.curve_departures import departures, residual_path
from scalelab.fitting.loss_curves.curves import RunCurve, fit_curves
from scalelab.fitting.selection.select import format_selection, select_law
from scalelab.fitting.selection.simulate import simulate_curve
from scalelab.train.schedule import lr_at

TRUE = {"E": 1.0, "A": 60.0, "B": 80.0, "C": 0.5, "alpha": 0.3, "beta": 0.3}
DECAY = 0.9
TPS = 1024
CUT_STEP = 900  # where the "real" schedule of the checked run halves its LR


def cosine(steps: int) -> np.ndarray:
    kw = dict(name="cosine", peak_lr=3e-3, total_tokens=steps * TPS, warmup_tokens=20 * TPS, decay_fraction=0.2)
    return np.array([lr_at((s - 1) * TPS, **kw) for s in range(1, steps + 1)])


def sim(run_id, n, lr, seed, log_every=50):
    return simulate_curve(
        TRUE,
        run_id=run_id,
        params=n,
        lr=lr,
        tokens_per_step=TPS,
        decay=DECAY,
        seed=seed,
        log_every=log_every,
        noise_sigma=0.003,
    )


@pytest.fixture(scope="module")
def ladder():
    sizes_steps = [(n, t) for n in (2e4, 5e4, 1.2e5) for t in (400, 800)]
    return [sim(f"r{k}", n, cosine(t), k) for k, (n, t) in enumerate(sizes_steps)]


@pytest.fixture(scope="module")
def law_fit(ladder):
    return fit_curves(ladder, "lr_annealing", decays=(DECAY,))


def cut_run(run_id: str, n: float, seed: int) -> RunCurve:
    """A run whose LR was cut to 0.3x at CUT_STEP, carrying the planned schedule that does not show it."""
    planned = cosine(1600)
    real = planned.copy()
    real[CUT_STEP:] *= 0.3
    return with_schedule(sim(run_id, n, real, seed), planned)


def with_schedule(curve: RunCurve, lr: np.ndarray) -> RunCurve:
    return RunCurve(
        run_id=curve.run_id, params=curve.params, lr=lr, steps=curve.steps, loss=curve.loss, tokens_per_step=TPS
    )


def test_an_lr_cut_the_law_is_not_given_is_found_at_its_checkpoint(law_fit):
    run = cut_run("cut", 5e4, 99)  # lowered by hand at a restart; the logged schedule does not say so
    found = departures(law_fit, run)
    assert found, "the lowered LR was not found"
    first = found[0]
    assert first.step_before <= CUT_STEP < first.step_after > CUT_STEP
    assert first.jump < -0.005  # the run's loss fell below what its planned schedule explains
    assert first.z < -5
    # told the real schedule, the law explains the same losses: nothing departs
    real = cosine(1600)
    real[CUT_STEP:] *= 0.3
    assert departures(law_fit, with_schedule(run, real)) == []


def test_a_run_that_follows_the_law_or_has_one_outlier_has_no_departure(law_fit):
    run = sim("clean", 1.2e5, cosine(1600), 7)
    assert departures(law_fit, run) == []
    k = run.steps.size // 2
    run.loss[k] *= 1.05  # one bad evaluation: a spike, not a level shift
    steps, r = residual_path(law_fit, run, max_points=200)
    assert np.argmax(r) == np.searchsorted(steps, run.steps[k])
    assert departures(law_fit, run, max_points=200) == []


def test_departures_rejects_bad_settings(law_fit):
    run = sim("clean", 1.2e5, cosine(800), 3)
    with pytest.raises(UsageError, match="z > 0"):
        departures(law_fit, run, z=0.0)
    assert departures(law_fit, run.prefix(max_step=60)) == []  # too few checkpoints to judge


def test_law_selection_reports_a_held_out_run_that_departs(ladder):
    kw = dict(score="tail", candidates=["lr_annealing"], curve_kwargs={"decays": (DECAY,)}, refit=False)
    clean = select_law(curves=[*ladder, sim("big", 3e5, cosine(1600), 5)], **kw)
    assert clean.holdout == ["big"] and clean.departures == []
    sel = select_law(curves=[*ladder, cut_run("big", 3e5, 5)], **kw)
    assert [d.run_id for d in sel.departures][:1] == ["big"]
    assert sel.departures[0].step_before <= CUT_STEP < sel.departures[0].step_after
    assert sel.to_dict()["departures"][0]["jump"] < 0
    assert "held-out run big leaves the chosen law" in format_selection(sel)
