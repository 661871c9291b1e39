"""The `seeds:` section of a sweep spec: replicates of every design point, by initialisation, by data
order, or both, and optionally a seed of its own for every point.

    seeds: 3                                 # every point 3 times: train.seed = base seed + k (init and data)
    seeds: [0, 7]                            # those seeds
    seeds: {count: 2, vary: data}            # init fixed, data order moved: train.data_seed = base + k
    seeds: {count: 2, vary: init}            # data order fixed (train.data_seed = base), init moved
    seeds: {count: 1, distinct: true}        # no two points share a seed: point i takes base + i*count + k

`vary` says which source of run-to-run noise a replicate samples (scalelab.train.config: the data
order has its own seed, train.data_seed). With one seed for a whole design (the default), every run
sees the same data order, so the runs' noise is shared along D; `distinct` gives each design point its
own init and data order, so the fit sees independent noise (what `scalelab sweep plan --replication`
assumes when it prices a design's replicates). A replicate whose seeds equal the base run's is that
run (the same id).
"""

from __future__ import annotations

from typing import Any

from scalelab.errors import ConfigError
from scalelab.sweeps.specs.design_context import DesignContext, Point
from scalelab.sweeps.specs.spec_checks import check_keys, number

VARY = ("both", "init", "data")


def _count(value: Any, key: str) -> int:
    k = number(value, key, example="3")
    if not k.is_integer():
        raise ConfigError(key, f"{value!r} is not a whole number of seeds", "e.g. seeds: 3, or a list")
    return int(k)


def _overrides(seed: int, base: int, vary: str) -> dict[str, Any]:
    if vary == "both":
        return {"train.seed": seed}
    if vary == "init":
        return {"train.seed": seed, "train.data_seed": base}
    return {"train.data_seed": seed}


def seed_points(section: Any, ctx: DesignContext, points: list[Point]) -> list[Point]:
    """The design's points with the `seeds:` section applied (module docstring); ConfigError names the key."""
    if section is None:
        return points
    base = int((ctx.base.get("train") or {}).get("seed", 0))
    if isinstance(section, list):
        seeds = [int(number(s, "seeds", positive=False)) for s in section]
        return [({**o, "train.seed": s}, {**lab, "seed": s}) for o, lab in points for s in seeds]
    if not isinstance(section, dict):
        return [
            ({**o, "train.seed": s}, {**lab, "seed": s})
            for o, lab in points
            for s in range(base, base + _count(section, "seeds"))
        ]
    check_keys(section, ("count", "vary", "distinct"), "seeds")
    count = _count(section.get("count", 1), "seeds.count")
    vary = section.get("vary", "both")
    if vary not in VARY:
        raise ConfigError("seeds.vary", f"{vary!r} unknown", f"use one of {', '.join(VARY)}")
    distinct = section.get("distinct", False)
    if not isinstance(distinct, bool):
        raise ConfigError("seeds.distinct", f"{distinct!r} is not true or false", "write distinct: true")
    label = "data_seed" if vary == "data" else "seed"
    out = []
    for i, (o, lab) in enumerate(points):
        first = base + (i * count if distinct else 0)
        for s in range(first, first + count):
            out.append(({**o, **_overrides(s, base, vary)}, {**lab, label: s}))
    return out
