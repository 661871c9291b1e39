"""Learning-rate areas of a schedule: the inputs of the schedule-aware loss-curve laws.

Tissue et al. 2024 ("Scaling Law with Learning Rate Annealing") write the loss at step s as
L(s) = L0 + A S1^-alpha - C S2, with S1 the area under the LR curve and S2 the annealing area.
scalelab computes both per optimizer step from the LR actually used at every step (metrics.parquet
has it; a planned schedule gives the future steps), in these units:

    S1(s) = sum_{i<=s} (eta_i / eta_ref) * tokens_i
            the forward area, in tokens at the reference LR: at a constant LR equal to eta_ref it
            is the number of tokens seen, so the curve law reduces to Chinchilla's L(N, D).
    m_i   = lam * m_{i-1} + (1 - lam) * (eta_{i-1} - eta_i) / eta_ref     (m = 0 before the peak)
    S2(s) = sum_{i<=s} m_i
            the annealing area: the fraction of eta_ref shed so far, seen through a momentum of
            about 1 / (1 - lam) steps (lam = 0.999 in the paper; smaller for runs of a few hundred
            steps, so the fitter profiles it). This is the paper's S2 times (1 - lam) / eta_ref,
            a constant rescaling of their C: S2 runs from 0 to about 1 - eta_min / eta_ref.

eta_ref is the run's own peak LR by default: a sweep tunes (or transfers) the LR per size, so the
areas measure data seen and the schedule's shape rather than the LR's level. Steps before the LR
first reaches its peak (the warmup) add their tokens to S1 at their LR and nothing to S2; curve
points inside the warmup are not fitted (fitting/loss_curves/curves.py).

    s1, s2 = lr_areas(lr_per_step, tokens_per_step=1024, decay=0.99)
    s1[k], s2[k]          # areas after step k + 1
"""

from __future__ import annotations

import numpy as np
from scipy import signal

from scalelab.errors import UsageError

DEFAULT_DECAY = 0.999  # Tissue et al.'s momentum lambda (per optimizer step)


def warmup_end(lr: np.ndarray) -> int:
    """Index of the first step at the schedule's peak LR (0 when there is no warmup)."""
    lr = np.asarray(lr, dtype=np.float64)
    return int(np.argmax(lr >= lr.max() * (1.0 - 1e-9)))


def lr_areas(
    lr: np.ndarray,
    *,
    tokens_per_step: float | np.ndarray = 1.0,
    decay: float = DEFAULT_DECAY,
    lr_ref: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Forward area S1 and annealing area S2 after every step of a schedule (module docstring).

    Args:
        lr: learning rate of every optimizer step, in order (steps 1..T), all >= 0.
        tokens_per_step: tokens of each step (a constant, or one value per step).
        decay: the momentum lam of the annealing area, in [0, 1).
        lr_ref: the reference LR eta_ref (default: the schedule's peak).
    Returns:
        (s1, s2), each of shape (T,): the areas after steps 1..T.
    Raises:
        UsageError: an empty or negative schedule, a decay outside [0, 1).
    """
    lr = np.asarray(lr, dtype=np.float64).reshape(-1)
    if lr.size == 0 or not np.all(np.isfinite(lr)) or np.any(lr < 0) or lr.max() <= 0:
        raise UsageError("lr schedule: need one finite learning rate >= 0 per step, not all zero")
    if not 0.0 <= decay < 1.0:
        raise UsageError(f"decay must be in [0, 1), got {decay}")
    ref = float(lr.max() if lr_ref is None else lr_ref)
    if ref <= 0:
        raise UsageError(f"lr_ref must be > 0, got {lr_ref}")
    frac = lr / ref
    tps = np.broadcast_to(np.asarray(tokens_per_step, dtype=np.float64), lr.shape)
    s1 = np.cumsum(frac * tps)
    drop = np.zeros_like(frac)
    drop[1:] = frac[:-1] - frac[1:]
    drop[: warmup_end(lr) + 1] = 0.0  # the warmup's rising LR is not annealing
    # m_i = lam m_{i-1} + (1 - lam) drop_i: a first-order IIR filter, linear time for 1e6 steps
    m = signal.lfilter([1.0 - decay], [1.0, -decay], drop)
    return s1, np.cumsum(m)
