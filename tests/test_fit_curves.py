"""Loss-curve laws: LR areas, curve fits on simulated sweeps, predictions of prefixes, cooldown branches
and schedules never trained, and law selection by backtest (all on simulated data)."""

import math

import numpy as np
import polars as pl
import pytest

from scalelab.errors import UsageError
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.loss_curves.curves import RunCurve, curve_points, curves_from_table, fit_curves
from scalelab.fitting.loss_curves.lr_areas import lr_areas
from scalelab.fitting.selection.select import select_law
from scalelab.fitting.selection.simulate import simulate_curve
from scalelab.train.schedule import lr_at

TRUE = {"E": 1.0, "A": 60.0, "B": 80.0, "C": 0.25, "alpha": 0.3, "beta": 0.3}
DECAY = 0.99
TPS = 1024


def schedule(name: str, steps: int, *, warmup_steps: int = 20, decay_fraction: float = 0.2) -> np.ndarray:
    total = steps * TPS
    kw = dict(name=name, peak_lr=3e-3, total_tokens=total, warmup_tokens=warmup_steps * TPS)
    return np.array([lr_at((s - 1) * TPS, decay_fraction=decay_fraction, **kw) for s in range(1, steps + 1)])


def run(name, n, lr, seed, **kw):
    return simulate_curve(TRUE, run_id=name, params=n, lr=lr, tokens_per_step=TPS, decay=DECAY, seed=seed, **kw)


def ladder(schedules=("cosine",), sizes=(2e4, 5e4, 1.2e5), steps=(400, 800, 1600), noise=0.003):
    out, k = [], 0
    for n in sizes:
        for t in steps:
            for name in schedules:
                out.append(run(f"{name}-{n:.0e}-{t}", n, schedule(name, t), seed=k, noise_sigma=noise))
                k += 1
    return out


def rel(a, b):
    return abs(a - b) / b


# ---------------------------------------------------------------------------------------------
# areas
# ---------------------------------------------------------------------------------------------


def test_lr_areas_constant_schedule_is_tokens_and_no_annealing():
    s1, s2 = lr_areas(np.full(100, 3e-3), tokens_per_step=512)
    np.testing.assert_allclose(s1, 512 * np.arange(1, 101))
    np.testing.assert_allclose(s2, 0.0)


def test_lr_areas_anneal_area_is_the_delayed_lr_drop():
    lr = np.r_[np.linspace(0.1, 1.0, 10), np.linspace(1.0, 0.1, 91)[1:]]  # warmup, then linear decay
    s1, s2 = lr_areas(lr, decay=0.0)  # no momentum: S2 = the fraction of the peak shed so far
    shed = np.where(np.arange(lr.size) < 10, 0.0, 1.0 - lr / lr.max())  # the warmup's rise is not annealing
    np.testing.assert_allclose(s2, shed, atol=1e-12)
    np.testing.assert_allclose(s1[-1], lr.sum())
    _, s2m = lr_areas(lr, decay=0.95)  # momentum delays the area but keeps its sign
    assert np.all(s2m <= s2 + 1e-12) and s2m[-1] > 0.5 * s2[-1]


def test_curve_laws_are_the_written_formulas():
    from scalelab.fitting.forms.laws import get_law

    n, s1, s2 = np.array([2e4, 1e5]), np.array([3e5, 2e6]), np.array([0.0, 0.8])
    want = TRUE["E"] + TRUE["A"] / n ** TRUE["alpha"] + TRUE["B"] / s1 ** TRUE["beta"] - TRUE["C"] * s2
    np.testing.assert_allclose(get_law("lr_annealing").predict(TRUE, params=n, s1=s1, s2=s2), want, rtol=1e-12)
    no_c = {k: v for k, v in TRUE.items() if k != "C"}
    np.testing.assert_allclose(get_law("lr_area").predict(no_c, params=n, s1=s1), want + TRUE["C"] * s2, rtol=1e-12)


def test_lr_areas_rejects_bad_input():
    with pytest.raises(UsageError, match="decay"):
        lr_areas(np.ones(3), decay=1.0)
    with pytest.raises(UsageError, match="learning rate"):
        lr_areas(np.array([0.1, -1.0]))


# ---------------------------------------------------------------------------------------------
# fits and predictions
# ---------------------------------------------------------------------------------------------


def test_random_intercept_weights_cap_a_densely_logged_run():
    dense = run("dense", 5e4, schedule("cosine", 1600), seed=1, log_every=1)
    sparse = run("sparse", 5e4, schedule("cosine", 1600), seed=2, log_every=100)
    pts = curve_points([dense, sparse], decay=DECAY, max_points_per_run=48, sigma_run=0.005)
    w = [pts["weight"][pts["run"] == r].sum() for r in (0, 1)]
    assert pts["loss"][pts["run"] == 0].size == 48  # grouped
    assert w[0] / w[1] < 1.5  # 1600 logged steps do not outweigh 16 (the run offset dominates)


def test_curve_fit_recovers_the_law_and_its_momentum():
    curves = ladder(schedules=("cosine", "wsd"))
    cf = fit_curves(curves, "lr_annealing")
    assert cf.decay == DECAY
    for c in curves:
        assert rel(cf.predict_final(c), c.final_loss) < 0.01
    assert cf.params["C"] == pytest.approx(TRUE["C"], rel=0.25)


def test_sized_curve_law_recovers_a_size_dependent_data_term():
    """A ladder whose larger models gain less per token (B N^gamma, gamma = 0.3): lr_annealing_sized
    recovers gamma and the final losses; lr_annealing, whose B is the same for every size, cannot."""
    true = {**TRUE, "B": 80.0 / 5e4**0.3, "gamma": 0.3}  # B N^gamma = 80 at N = 5e4
    curves = [
        simulate_curve(
            true,
            run_id=f"{n:.0e}-{t}",
            params=n,
            lr=schedule("cosine", t),
            tokens_per_step=TPS,
            decay=DECAY,
            seed=k,
            noise_sigma=0.003,
            law="lr_annealing_sized",
        )
        for k, (n, t) in enumerate((n, t) for n in (2e4, 5e4, 1.2e5) for t in (400, 800, 1600))
    ]
    sized = fit_curves(curves, "lr_annealing_sized")
    assert sized.params["gamma"] == pytest.approx(0.3, abs=0.1)
    assert max(rel(sized.predict_final(c), c.final_loss) for c in curves) < 0.01
    plain = fit_curves(curves, "lr_annealing")
    assert max(rel(plain.predict_final(c), c.final_loss) for c in curves) > 0.015


def test_final_loss_predicted_from_the_first_30_percent():
    curves = ladder()
    target = curves[-1]  # the largest size at the longest run
    prefix = target.prefix(0.3)
    assert prefix.steps.max() <= 0.3 * target.num_steps
    cf = fit_curves([*curves[:-1], prefix], "lr_annealing")
    assert rel(cf.predict_final(target), target.final_loss) < 0.01
    lo, hi = cf.final_interval(target, n_boot=24)
    noise_free = cf.predict(target, np.array([target.num_steps]), params=TRUE)[0]  # the simulated law
    assert lo < noise_free < hi, (lo, noise_free, hi)


def test_cooldown_branch_predicted_from_the_stable_run_alone():
    stable = run("stable", 5e4, schedule("wsd", 2000), seed=3)
    # a WSD branch of 1000 steps with the same absolute warmup: the stable run's schedule up to its decay
    branch = run("branch", 5e4, schedule("wsd", 1000), seed=4)
    assert np.allclose(branch.lr[:800], stable.lr[:800])
    cf = fit_curves([stable], "lr_annealing")
    assert rel(cf.predict_final(branch), branch.final_loss) < 0.01
    # a branch logs its stable run's points up to the branch point: fitted together, those count once
    shared = run("stable", 5e4, schedule("wsd", 2000), seed=3)
    shared.run_id = "copy"
    both = fit_curves([stable, shared], "lr_area")
    assert both.points["loss"].size == fit_curves([stable], "lr_area").points["loss"].size
    # the forward area alone cannot see the cooldown's drop: this is what the annealing term buys
    area = fit_curves([stable], "lr_area")
    assert rel(area.predict_final(branch), branch.final_loss) > 2 * rel(cf.predict_final(branch), branch.final_loss)


def test_cosine_run_predicted_from_constant_lr_runs_with_a_cooldown():
    sizes = (2e4, 5e4, 1.2e5)
    train = [run(f"c{n:.0e}", n, schedule("constant", 1600), seed=i) for i, n in enumerate(sizes)]
    train += [run(f"w{n:.0e}", n, schedule("wsd", 800), seed=10 + i) for i, n in enumerate(sizes)]
    cosine = run("cos", 5e4, schedule("cosine", 1600), seed=20)
    cf = fit_curves(train, "lr_annealing")
    assert rel(cf.predict_final(cosine), cosine.final_loss) < 0.01


def test_curve_fit_needs_curve_inputs_and_points():
    c = run("a", 5e4, schedule("cosine", 200), seed=0)
    with pytest.raises(UsageError, match="unique_tokens"):
        fit_curves([c], "data_constrained")
    with pytest.raises(UsageError, match="warmup"):
        fit_curves([c.prefix(max_step=10)], "lr_annealing")
    with pytest.raises(UsageError, match="steps must lie"):
        RunCurve(run_id="x", params=1e4, lr=np.ones(5), steps=np.array([6]), loss=np.array([2.0]))


def test_curves_from_table_round_trip():
    curves = ladder(sizes=(2e4, 5e4), steps=(300,))
    rows = [
        {
            "run_id": c.run_id,
            "step": int(s),
            "lr": float(c.lr[s - 1]),
            "params": c.params,
            "loss": float(v),
            "tokens": float(s * TPS),
        }
        for c in curves
        for s, v in zip(c.steps, c.loss)
    ]
    final, back = curves_from_table(pl.DataFrame(rows))
    assert final.height == len(curves) and [b.run_id for b in back] == [c.run_id for c in curves]
    for b, c in zip(back, curves):
        np.testing.assert_allclose(b.lr, c.lr)
        np.testing.assert_allclose(b.areas(DECAY)[1], c.areas(DECAY)[1])


# ---------------------------------------------------------------------------------------------
# law selection
# ---------------------------------------------------------------------------------------------


def _table(curves):
    return read_runs(
        {
            "run_id": [c.run_id for c in curves],
            "params": [c.params for c in curves],
            "tokens": [float(c.tokens(np.array([c.num_steps]))[0]) for c in curves],
            "loss": [c.final_loss for c in curves],
        }
    )


def test_select_law_picks_the_curve_law_when_runs_anneal_differently():
    # cosine and WSD runs of the same (N, D) end at different losses: (N, D) laws cannot tell them apart
    curves = ladder(schedules=("cosine", "wsd"), sizes=(2e4, 5e4, 1.2e5), steps=(400, 800, 1600))
    sel = select_law(_table(curves), curves)
    assert sel.chosen in ("lr_annealing", "average")
    cands = sel.candidates
    assert cands["data_constrained"].skipped and cands["data_constrained"].backtest is None
    for name in ("chinchilla", "kaplan", "lr_annealing", "lr_area", "average"):
        assert cands[name].backtest is not None and math.isfinite(cands[name].backtest.mare)
    assert cands["lr_annealing"].backtest.mare < 0.5 * cands["chinchilla"].backtest.mare
    members = [cands[n].backtest.predicted for n in ("chinchilla", "kaplan", "lr_annealing", "lr_area")]
    np.testing.assert_allclose(cands["average"].backtest.predicted, np.exp(np.mean(np.log(members), axis=0)))
    assert sel.to_dict()["chosen"] == sel.chosen


def test_select_law_keeps_the_incumbent_unless_clearly_beaten():
    rng = np.random.default_rng(0)
    n = np.repeat([2e7, 5e7, 1e8, 2e8, 5e8], 4)
    d = np.tile([1e9, 3e9, 1e10, 3e10], 5)
    loss = (1.8 + 480 / n**0.35 + 2000 / d**0.37) * np.exp(0.003 * rng.standard_normal(n.size))
    table = read_runs({"params": n, "tokens": d, "loss": loss})
    sel = select_law(table)
    assert sel.chosen == "chinchilla"
    assert "no loss curves" in sel.candidates["lr_annealing"].skipped
    plain = select_law(table, incumbent=None)
    assert plain.chosen == plain.ranking()[0].name


def test_select_law_tail_protocol_on_checkpoints():
    curves = ladder(sizes=(1e4, 2e4, 5e4, 1.2e5), steps=(1600,))
    sel = select_law(curves=curves, score="tail", candidates=["chinchilla", "lr_annealing", "average"])
    assert sel.holdout == [curves[-1].run_id]
    assert sel.candidates["lr_annealing"].backtest.mare < 0.01
    assert set(sel.fits) == ({"chinchilla", "lr_annealing"} if sel.chosen == "average" else {sel.chosen})
