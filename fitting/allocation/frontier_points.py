"""The compute frontier as measured: each compute group's lowest loss L*(C) and the size N*(C) there.

    measured = measure_frontier(params=N, tokens=D, loss=L, flops=C, groups=compute_groups(table))
    measured.points        # FrontierPoint per group: flops, loss, n_opt, used, ...
    measured.method        # one line: how the minima were located

By the table's groups (scalelab.fitting.uncertainty.compute_groups):

- IsoFLOP slices (FLOP budgets, FLOP bins, a group column): each slice with 3+ distinct sizes is
  fitted with the IsoFLOP curve's own asymmetric shape, its two exponents shared by the slices
  (scalelab.fitting.estimate.isoflop_shape: no parabola grid bias), in (N, D) so that a bin whose runs
  scatter in compute is read along its reference compute. Where the slices leave the shape
  unidentified (no residual degree of freedom, or an exponent at the edge of its range) each slice
  gets Chinchilla's parabola in ln N instead (Approach 2), and the method line says so. A slice whose
  minimum is not inside its sizes is reported but not used: its best run only bounds L* from above.
  A group of one or two sizes (the loop's compute-optimal run and its seed replicates) is a measured
  point of the frontier: the mean log loss of its best size.
- Loss curves (checkpoints of a few models): the envelope over models (Approach 1). Every model's
  curve is interpolated linearly in (log C, log L) within its own range; at each of ENVELOPE_BINS
  compute bins across the table's range (at least 0.1 decades apart) where two or more curves are
  live, the lowest is the frontier there, and its model N*. Where one curve alone is live the point
  measures that model's token scaling, not a choice between sizes, and is not a frontier point (a
  family whose sizes train to one token count overlaps little in compute: its envelope is short).
  N* is "bracketed" when a larger and a smaller live model lost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate.approaches import budget_minimum, curves_by_size
from scalelab.fitting.estimate.isoflop_shape import shape_minima
from scalelab.fitting.uncertainty.compute_groups import ComputeGroups

ENVELOPE_BINS = 24  # compute bins across a table of loss curves
MIN_ENVELOPE_DECADES = 0.1  # ... at least this far apart


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    flops: float  # the group's reference compute (its runs' geometric mean; an envelope bin's centre)
    flops_max: float  # its largest run's compute (a forward fold up to this point fits the runs up to it)
    loss: float  # L* there
    n_opt: float  # N* there (the best size of a point; the winning model of the envelope)
    n_interval: tuple[float, float] | None  # a located minimum's interval on N* (delta method)
    located: bool  # a slice's fitted minimum (False: a measured point, or the envelope)
    bracketed: bool  # N* lies between sizes that lost (enters the N*(C) line)
    used: bool  # enters the L*(C) fit
    num_runs: int

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FrontierPoint:
        iv = d.get("n_interval")
        return cls(**{**d, "n_interval": None if iv is None else (float(iv[0]), float(iv[1]))})


@dataclass(slots=True)
class MeasuredFrontier:
    points: list[FrontierPoint]
    method: str
    warnings: list[str] = field(default_factory=list)

    @property
    def used(self) -> list[FrontierPoint]:
        return [p for p in self.points if p.used]


def _points_of_small_groups(params, loss, flops, labels, keys) -> list[FrontierPoint]:
    out = []
    for k in keys:
        idx = np.flatnonzero(labels == k)
        sizes = np.unique(params[idx])
        means = [float(np.mean(np.log(loss[idx][params[idx] == n]))) for n in sizes]
        best = int(np.argmin(means))
        ref = float(np.exp(np.mean(np.log(flops[idx]))))
        top = float(flops[idx].max())
        out.append(FrontierPoint(ref, top, float(np.exp(means[best])), float(sizes[best]), None, False, False, True,
                                 idx.size))  # fmt: skip
    return out


def _slice_points(params, tokens, loss, flops, labels, keys, level) -> tuple[list[FrontierPoint], str, list[str]]:
    """Located minima of the slices `keys` (module docstring): the shared shape, else parabolas."""
    mask = np.isin(labels, keys)
    try:
        found, shape, warnings = shape_minima(
            params=params[mask],
            loss=loss[mask],
            flops=flops[mask],
            labels=labels[mask],
            level=level,
            tokens=tokens[mask],
        )
        identified = shape.interior(shape.alpha) and shape.interior(shape.beta)
    except UsageError:
        identified, warnings = False, []
    if identified:
        method = f"IsoFLOP shape fit (exponents {shape.alpha:.3f}, {shape.beta:.3f} shared by {len(keys)} slices)"
        tops = [float(flops[labels == k].max()) for k in np.unique(labels[mask])]  # shape_minima's order
        out = []
        for p, top in zip(found, tops):
            if p.x_star is None:
                out.append(
                    FrontierPoint(p.flops, top, p.loss_star, float("nan"), None, False, False, False, p.num_runs)
                )
                continue
            inside = p.x_range[0] < p.x_star < p.x_range[1]
            iv = None if p.x_interval is None else (float(np.exp(p.x_interval[0])), float(np.exp(p.x_interval[1])))
            n_opt = float(np.exp(p.x_star))
            out.append(FrontierPoint(p.flops, top, p.loss_star, n_opt, iv, True, inside, inside, p.num_runs))
        return out, method, warnings
    out = []
    for k in keys:
        idx = np.flatnonzero(labels == k)
        m = budget_minimum(params[idx], loss[idx], flops[idx], level=level)
        ok = m is not None and m.used
        top = float(flops[idx].max())
        out.append(FrontierPoint(m.flops, top, m.loss_opt, m.n_opt, m.n_opt_interval, ok, ok, ok, idx.size))
    return out, "parabolas in ln N per slice (the shared shape is not identified by these slices)", []


def envelope(params, tokens, loss, flops) -> list[FrontierPoint]:
    """The lower envelope of the models' loss curves in compute (module docstring)."""
    del tokens  # the envelope is read along compute; D follows from N
    curves = [(size, np.log10(flops[order]), np.log(loss[order])) for size, order in curves_by_size(params, flops)]
    if not curves:
        return []
    lo, hi = min(c[1][0] for c in curves), max(c[1][-1] for c in curves)
    num = max(2, min(ENVELOPE_BINS, int((hi - lo) / MIN_ENVELOPE_DECADES) + 1))
    out = []
    for g in np.linspace(lo, hi, num):
        live = [c for c in curves if c[1][0] <= g <= c[1][-1]]
        if len(live) < 2:
            continue
        values = np.array([np.interp(g, c[1], c[2]) for c in live])
        best = int(np.argmin(values))
        sizes = [c[0] for c in live]
        bracketed = min(sizes) < live[best][0] < max(sizes)
        out.append(
            FrontierPoint(
                float(10**g),
                float(10**g),
                float(np.exp(values[best])),
                live[best][0],
                None,
                False,
                bracketed,
                True,
                len(live),
            )
        )
    return out


def measure_frontier(params, tokens, loss, flops, groups: ComputeGroups, level: float = 0.95) -> MeasuredFrontier:
    """The measured frontier of a table's runs (module docstring)."""
    n, d, y, c = (np.asarray(a, dtype=float) for a in (params, tokens, loss, flops))
    if groups.kind == "models":
        return MeasuredFrontier(envelope(n, d, y, c), "envelope over the models' loss curves (Approach 1)")
    labels = np.asarray(groups.labels)
    keys = list(dict.fromkeys(labels.tolist()))
    slices = [k for k in keys if np.unique(n[labels == k]).size >= 3]
    small = [k for k in keys if k not in slices]
    points, warnings = _points_of_small_groups(n, y, c, labels, small), []
    method = "no IsoFLOP slice (3+ sizes)"
    if slices:
        located, method, warnings = _slice_points(n, d, y, c, labels, slices, level)
        points += located
    if small:
        method += f"; {len(small)} group(s) of one or two sizes taken as measured points"
    points.sort(key=lambda p: p.flops)
    dropped = [p for p in points if not p.used]
    if dropped:
        where = ", ".join(f"{p.flops:.3g}" for p in dropped)
        warnings.append(
            f"frontier: {len(dropped)} slice(s) without a minimum inside their sizes left out (C = {where})"
        )
    return MeasuredFrontier(points, method, warnings)
