"""A study's matched decisive measurement: both arms at the target, at the same sizes and seeds.

    points = decisive_points(n_star=254_000, study=study, raw=spec)   # [DecisivePoint], one per (size, seed)
    planned_runs(points, target)              # the (N, D) each arm's run will have, before resolution
    candidates = decisive_candidates(points, ctxs, target)             # [(arm, Candidate, seed, point)]

At the target budget C*, `study.decisive.sizes` sizes a factor 2 apart centred on N* (the baseline's
compute-optimal size there: N*/2, N*, 2 N* for three), each trained with `study.decisive.seeds`
seeds (the design's seeds first, then the next ones), by every arm. A size is sized in each arm's
own design context from the same target N, exactly as the IsoFLOP generator sizes a design point
(an arm that keeps the shape rule's N gets the same N, D and shape; one that changes N, tied
embeddings say, gets its own N at the same budget), and labelled with its `size_index` and
`target_params`, so the runs pair up as the design's do (scalelab.sweeps.studies.study_pairs). Its mean gap
over the pairs is the measured gap, with a standard error from the pairs' spread
(scalelab.store.ledger); one pair per arm could not say how far its own gap is from the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalelab.sweeps.closed_loop.propose import Candidate
from scalelab.sweeps.specs.design_context import DesignContext
from scalelab.sweeps.studies.study_spec import StudySpec

SIZE_FACTOR = 2.0  # neighbouring sizes of the measurement, in N


@dataclass(frozen=True, kw_only=True, slots=True)
class DecisivePoint:
    size_index: int
    target_params: float  # N asked of the shape rule
    seed: int


def decisive_seeds(raw: dict[str, Any], k: int) -> list[int]:
    """The measurement's k training seeds: the design's (`seeds:`), then the next ones."""
    base = int(((raw.get("base") or {}).get("train") or {}).get("seed", 0))
    given = raw.get("seeds")
    seeds = [int(s) for s in given] if isinstance(given, list) else [base]
    while len(seeds) < k:
        seeds.append(max(seeds) + 1)
    return seeds[:k]


def decisive_points(n_star: float, study: StudySpec, raw: dict[str, Any]) -> list[DecisivePoint]:
    """Every (size, seed) of the measurement, sizes ascending (module docstring)."""
    k = study.decisive_sizes
    sizes = [n_star * SIZE_FACTOR ** (j - (k - 1) / 2) for j in range(k)]
    return [
        DecisivePoint(size_index=j, target_params=n, seed=s)
        for j, n in enumerate(sizes)
        for s in decisive_seeds(raw, study.decisive_seeds)
    ]


def planned_runs(points: list[DecisivePoint], target: float) -> list[tuple[float, float]]:
    """(N, D = C / 6N) of each point before the shape rule rounds N: the prediction's points until
    the round is resolved."""
    return [(p.target_params, target / (6.0 * p.target_params)) for p in points]


def decisive_candidates(
    points: list[DecisivePoint], ctxs: dict[str, DesignContext], target: float
) -> list[tuple[str, Candidate, DecisivePoint]]:
    """Every arm's run at every point, sized in its own context (module docstring)."""
    return [
        (arm, Candidate.at(ctx, p.target_params, target, "decisive"), p) for p in points for arm, ctx in ctxs.items()
    ]
