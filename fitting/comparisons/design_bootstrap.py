"""One bootstrap over design points, shared by every arm and every estimator of a comparison.

    res = resample_design(groups, strata, replicates=64, seed=0)   # groups: a design point per row
    res.row_counts(pair_groups)        # (64, n_pairs): the gap model's weights, replicate by replicate
    res.row_counts(run_groups)         # (64, n_runs): the joint law's, from the same draws

A design point is one (budget, size) of the design: both arms' runs there, and their seeds, are
drawn together, so replicate r of one arm and of the other, and of the gap model and of the joint
law, see the same points. Within each stratum (a budget) its design points are drawn with
replacement, as many as it has: every replicate keeps every budget, which the gap's drift in log C
and the laws need, and resamples what varies within one. A stratum with one point holds it fixed.
Runs that match no other arm's (a remedy run) are design points of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True)
class DesignResample:
    groups: tuple  # the distinct design points, in the order of `counts`' columns
    counts: np.ndarray  # (replicates, groups): times each design point was drawn

    @property
    def replicates(self) -> int:
        return int(self.counts.shape[0])

    def row_counts(self, row_groups: Sequence) -> np.ndarray:
        """(replicates, rows): each row weighted by its design point's draws."""
        index = {g: i for i, g in enumerate(self.groups)}
        cols = [index[g] for g in row_groups]
        return self.counts[:, cols] if cols else np.zeros((self.replicates, 0))


def resample_design(groups: Sequence, strata: Sequence, replicates: int, seed: int) -> DesignResample:
    """Draw `replicates` resamples of the design points (module docstring).

    Args:
        groups: the design point of each row (rows of one point may repeat: its seeds, its arms).
        strata: the stratum (budget) of each row; a design point lies in one stratum.
        replicates: resamples to draw (0: none).
        seed: the generator's seed; the same groups, strata and seed give the same draws.
    """
    first: dict = {}
    for g, s in zip(groups, strata):
        first.setdefault(g, s)
    names = tuple(first)
    by_stratum: dict = {}
    for i, g in enumerate(names):
        by_stratum.setdefault(first[g], []).append(i)
    rng = np.random.default_rng(seed)
    counts = np.zeros((max(int(replicates), 0), len(names)))
    for members in by_stratum.values():
        idx = np.asarray(members)
        for r in range(counts.shape[0]):
            np.add.at(counts[r], idx[rng.integers(0, idx.size, idx.size)], 1.0)
    return DesignResample(groups=names, counts=counts)
