"""Input checks (errors) and fit diagnostics (warnings stored in the FitResult, never just printed).

Errors (scalelab.errors.UsageError, one line each): a missing column, columns of different
lengths, fewer points than fitted parameters, non-positive / NaN / infinite inputs or losses,
duplicate rows (same inputs and same loss), bad weights.

Warnings (strings in FitResult.warnings):
- the best start ends on a bound (the optimum may lie outside the box);
- the optimiser stalled (iteration limit, or a failed line search with a large gradient);
- the objective is flat along a direction: an exponent whose delta-method standard error is
  comparable to its value, or a near-singular information matrix (e.g. an IsoFLOP design
  whose minima do not pin down the exponent);
- starts disagree: starts within 0.1% of the best objective end at exponents more than 0.05 apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.forms.laws import Law

BOUND_RTOL = 1e-6  # a fit parameter within this (relative) of a bound counts as on it
DISAGREE_REL_OBJECTIVE = 1e-3  # starts within 0.1% of the best objective are compared
DISAGREE_EXPONENT = 0.05  # ... and warned about when their exponents differ by more than this
FLAT_SE_RATIO = 0.5  # an exponent with SE > 0.5 * max(|value|, 0.05) is called unidentified
FLAT_EIG_RATIO = 1e-12  # smallest / largest eigenvalue of the scaled information matrix


def validate_data(
    law: Law, data: Mapping[str, Any], weights: Any = None
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray | None]:
    """Check and convert the data for a fit.

    Args:
        law: the law; data must hold law.inputs and "loss" (any mapping of array-likes, e.g. a
            dict of numpy arrays or a polars DataFrame).
        weights: optional per-point weights (n,), finite and >= 0 with a positive sum.

    Returns:
        (inputs as float64 arrays, loss, weights or None).

    Raises:
        UsageError: see the module docstring.
    """
    cols = (*law.inputs, "loss")
    have = list(data.keys()) if hasattr(data, "keys") else list(getattr(data, "columns", []))
    missing = [c for c in cols if c not in have]
    if missing:
        raise UsageError(f"{law.name} fit: data is missing columns {missing}; it needs {list(cols)}")
    arrays = {}
    for c in cols:
        a = np.asarray(data[c], dtype=np.float64)
        if a.ndim != 1:
            raise UsageError(f"{law.name} fit: column {c!r} must be 1-D, got shape {a.shape}")
        arrays[c] = a
    lengths = {c: a.size for c, a in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise UsageError(f"{law.name} fit: columns have different lengths {lengths}")
    n = arrays["loss"].size
    for c, a in arrays.items():
        floor_ok = c in law.nonnegative_inputs  # e.g. an annealing area, 0 before any decay
        bad = np.flatnonzero(~np.isfinite(a) | ((a < 0) if floor_ok else (a <= 0)))
        if bad.size:
            raise UsageError(
                f"{law.name} fit: column {c!r} has {bad.size} {'negative' if floor_ok else 'non-positive'} or "
                f"NaN/inf value(s), "
                f"first at row {bad[0]} ({a[bad[0]]}); drop or fix those runs"
            )
    n_free = law.n_params
    if n < n_free:
        raise UsageError(
            f"{law.name} fit: {n} point(s) for {n_free} parameters {law.param_names}; need at least {n_free}"
        )
    table = np.stack([arrays[c] for c in cols], axis=1)
    _, first, counts = np.unique(table, axis=0, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = table[first[np.argmax(counts > 1)]]
        rows = np.flatnonzero((table == dup).all(axis=1))
        raise UsageError(
            f"{law.name} fit: rows {rows.tolist()} are duplicates (same inputs and loss); "
            "deduplicate the runs (e.g. a run recorded twice)"
        )
    w = None
    if weights is not None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (n,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise UsageError(f"{law.name} fit: weights must be {n} finite values >= 0 with a positive sum")
    x = {c: arrays[c] for c in law.inputs}
    return x, arrays["loss"], w


def bound_warnings(law: Law, theta: np.ndarray) -> list[str]:
    """Warn for each fit parameter of the best start that sits on a bound."""
    out = []
    for name, fit_name, t, (lo, hi) in zip(law.param_names, law.fit_names, theta, law.fit_bounds):
        for side, b in (("lower", lo), ("upper", hi)):
            if np.isfinite(b) and abs(t - b) <= BOUND_RTOL * max(1.0, abs(b)):
                out.append(
                    f"best start ends on the {side} bound of {name} ({fit_name}={t:.6g}); "
                    "the optimum may lie outside the bounds or the parameter is not identified"
                )
    return out


def stall_warning(status: int, n_iter: int, grad_norm: float, status_text: str) -> list[str]:
    """Warn when the best start did not converge (iteration limit or failed line search)."""
    if status == 2 or (status == 3 and grad_norm > 1e-3):
        return [
            f"optimiser stalled: {status_text} after {n_iter} iterations "
            f"(max |projected gradient| = {grad_norm:.3g}); results may be off the optimum"
        ]
    return []


def disagreement_warning(law: Law, thetas: np.ndarray, values: np.ndarray) -> list[str]:
    """Warn when near-best starts (within 0.1% of the best objective) disagree on an exponent."""
    finite = np.isfinite(values)
    if not finite.any():
        return []
    best = values[finite].min()
    near = finite & (values <= best + DISAGREE_REL_OBJECTIVE * abs(best) + 1e-15)
    out = []
    for name in law.exponent_names():
        j = law.param_names.index(name)
        v = thetas[near, j]
        if v.size > 1 and v.max() - v.min() > DISAGREE_EXPONENT:
            out.append(
                f"starts disagree: {int(near.sum())} starts within 0.1% of the best objective end with "
                f"{name} in [{v.min():.3f}, {v.max():.3f}]; the optimum is poorly determined"
            )
    return out


def flatness_warnings(law: Law, theta: np.ndarray, info: np.ndarray, se: Mapping[str, float]) -> list[str]:
    """Warn for a near-singular information matrix J'WJ and for exponents with huge standard errors.

    Args:
        theta: fit-space optimum; info: (P, P) J'WJ in fit space; se: delta-method standard errors
            of the natural parameters.
    """
    out = []
    d = np.sqrt(np.clip(np.diag(info), 1e-300, None))
    scaled = info / np.outer(d, d)
    eig, vec = np.linalg.eigh(scaled)
    if eig[-1] <= 0 or eig[0] / eig[-1] < FLAT_EIG_RATIO:
        v = vec[:, 0]
        top = np.argsort(-np.abs(v))[:2]
        names = " and ".join(law.param_names[i] for i in top)
        out.append(
            f"objective is flat along a direction mixing {names} (scaled information eigenvalue ratio "
            f"{eig[0] / max(eig[-1], 1e-300):.2g}); those parameters are not identified by these runs"
        )
    values = law.to_natural(theta)
    for name in law.exponent_names():
        s = se.get(name, np.nan)
        if not np.isfinite(s) or s > FLAT_SE_RATIO * max(abs(values[name]), 0.05):
            out.append(
                f"exponent {name} is not identified: standard error {s:.3g} vs value {values[name]:.3g} "
                "(flat objective along it); add runs that vary the inputs it multiplies"
            )
    return out
