"""Learning-rate schedules: warmup, cosine end points, WSD stable/decay phases, branch agreement."""

import math

import pytest

from scalelab.train.schedule import lr_at

KW = dict(peak_lr=1.0, total_tokens=1000, warmup_tokens=100, min_lr_ratio=0.1)


def test_warmup_is_linear_and_reaches_peak():
    assert lr_at(0, name="cosine", **KW) == pytest.approx(0.01)
    assert lr_at(49, name="cosine", **KW) == pytest.approx(0.5)
    assert lr_at(100, name="constant", **KW) == 1.0


def test_cosine_ends_at_min_lr_and_is_monotone():
    values = [lr_at(t, name="cosine", **KW) for t in range(100, 1001, 10)]
    assert values[0] == pytest.approx(1.0)
    assert values[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert lr_at(550, name="cosine", **KW) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))


@pytest.mark.parametrize("shape", ["linear", "sqrt", "cosine"])
def test_wsd_stable_then_decay(shape):
    kw = dict(KW, decay_fraction=0.2, decay_shape=shape)
    assert lr_at(799, name="wsd", **kw) == 1.0  # stable until 80% of the run
    assert lr_at(800, name="wsd", **kw) == pytest.approx(1.0)
    assert lr_at(1000, name="wsd", **kw) == pytest.approx(0.1)
    mid = lr_at(900, name="wsd", **kw)
    expected = {"linear": 0.5, "sqrt": 1 - math.sqrt(0.5), "cosine": 0.5}[shape]
    assert mid == pytest.approx(0.1 + 0.9 * expected)


def test_wsd_branch_matches_long_stable_run_before_its_decay():
    # A cooldown branch of 500 tokens (decay over its last 20%) agrees with a 1000-token stable run
    # up to where the branch starts decaying, because warmup is in absolute tokens.
    long = dict(KW, decay_fraction=0.2)
    branch = dict(KW, total_tokens=500, decay_fraction=0.2)
    for t in range(0, 400, 7):
        assert lr_at(t, name="wsd", **long) == lr_at(t, name="wsd", **branch)
    assert lr_at(450, name="wsd", **branch) < lr_at(450, name="wsd", **long)


def test_unknown_schedule_raises():
    with pytest.raises(ValueError):
        lr_at(5, name="step", **KW)
