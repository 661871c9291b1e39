"""Where a run leaves its curve law: level shifts in the residual between consecutive checkpoints.

    deps = departures(cf, curve)     # cf: a fitting.loss_curves.curves.CurveFit; curve: a RunCurve
    for d in deps:
        print(d.step_before, d.step_after, d.jump)    # jump: change of log(observed / predicted)

A curve law predicts a run from the LR schedule it is given. When the run's real schedule differed
from that one (an LR lowered by hand at a restart, as the OPT-175B logbook records) or its data or
code changed mid-run, the run's residual against the law steps at that checkpoint and stays
shifted. A residual that drifts smoothly is the law's shape being slightly off; a one-point spike
is an evaluation outlier. Neither is a departure.

The test, on the log residuals r_k = log(observed_k / predicted_k) at the run's logged steps past
the fit's `drop_first` of the schedule (a densely logged run's residuals are first averaged over at
most `max_points` groups of consecutive steps, as the fit groups them, so that a shift spread over
the annealing momentum's few hundred steps lands between a few consecutive points):
  - the change between consecutive checkpoints, detrended by the run's median change per step:
    c_k = (r_k - r_{k-1}) - m (step_k - step_{k-1});
  - its noise scale s = 1.4826 MAD(c) (robust: a few jumps do not inflate it);
  - a departure is a c_k with |c_k| > z s and |c_k| > min_jump that is not half of a spike (a big
    change into a point and a big change out of it with |c_k + c_{k+1}| <= z s: a one-point outlier).
A negative jump means the run got better than the law says from that checkpoint on (its loss
fell faster than its given schedule explains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate.intervals import robust_scale
from scalelab.fitting.loss_curves.curves import CurveFit, RunCurve

Z_DEPARTURE = 5.0  # robust sds of a checkpoint-to-checkpoint change that make a level shift
MIN_JUMP = 0.005  # and at least this much log loss (0.5%): a shift too small to matter is not one
MAX_POINTS = 48  # groups of consecutive logged steps (fitting.loss_curves.curves.curve_points groups alike)


@dataclass(frozen=True, kw_only=True)
class Departure:
    """A level shift of a run's residual between two consecutive logged checkpoints."""

    run_id: str
    step_before: int
    step_after: int
    jump: float  # change of log(observed / predicted), detrended; < 0: the run got better than the law
    scale: float  # the robust sd of the run's checkpoint-to-checkpoint changes

    @property
    def z(self) -> float:
        return self.jump / self.scale if self.scale > 0 else math.inf

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "step_before": self.step_before, "step_after": self.step_after,
                "jump": self.jump, "z": self.z}  # fmt: skip


def residual_path(
    cf: CurveFit, curve: RunCurve, *, drop_first: float | None = None, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """(steps, log(observed / predicted)) at the run's logged steps past `drop_first` of its schedule
    (default: the fit's own drop_first), averaged over at most `max_points` groups of consecutive
    steps (a group's step: the mean of its steps)."""
    first = cf.drop_first if drop_first is None else drop_first
    keep = curve.steps > math.ceil(first * curve.num_steps)
    steps = curve.steps[keep]
    if steps.size == 0:
        return np.zeros(0), np.zeros(0)
    r = np.log(curve.loss[keep]) - np.log(cf.predict(curve, steps))
    groups = np.array_split(np.arange(steps.size), min(max_points, steps.size))
    return np.array([steps[g].mean() for g in groups]), np.array([r[g].mean() for g in groups])


def departures(
    cf: CurveFit,
    curve: RunCurve,
    *,
    z: float = Z_DEPARTURE,
    min_jump: float = MIN_JUMP,
    drop_first: float | None = None,
    max_points: int = MAX_POINTS,
) -> list[Departure]:
    """The checkpoints where `curve` shifts away from the law of `cf` (module docstring), in step order.

    Args:
        cf: a curve fit (any curve law, or an (N, D) law fitted on checkpoints).
        curve: the run to check (fitted or held out), with the schedule the law should see.
        z: robust sds a change must exceed.
        min_jump: the smallest |change of log residual| reported.
        drop_first: ignore checkpoints in this first fraction of the schedule (default: cf's).
        max_points: residuals are averaged over at most this many groups of consecutive steps.
    Returns:
        list of Departure (empty when the run follows the law, or has fewer than 5 checkpoints:
        too few changes to estimate their noise). step_before / step_after are the (mean) steps of
        the two points, rounded.
    Raises:
        UsageError: z or min_jump not positive.
    """
    if not (z > 0 and min_jump >= 0 and max_points >= 5):
        raise UsageError(
            f"departures: need z > 0, min_jump >= 0, max_points >= 5; got z={z}, min_jump={min_jump}, "
            f"max_points={max_points}"
        )
    steps, r = residual_path(cf, curve, drop_first=drop_first, max_points=max_points)
    if steps.size < 5:
        return []
    gap = np.diff(steps)
    change = np.diff(r)
    change = change - np.median(change / gap) * gap
    scale = robust_scale(change)
    big = (np.abs(change) > z * scale) & (np.abs(change) > min_jump)
    # a spike at a point: a big change into it and a big change out of it that cancel
    cancels = np.abs(change[:-1] + change[1:]) <= z * scale
    spike_in = np.r_[big[:-1] & big[1:] & cancels, False]
    spike_out = np.r_[False, spike_in[:-1]]
    return [
        Departure(
            run_id=curve.run_id,
            step_before=int(round(steps[k])),
            step_after=int(round(steps[k + 1])),
            jump=float(change[k]),
            scale=float(scale),
        )
        for k in np.flatnonzero(big & ~spike_in & ~spike_out)
    ]
