"""Matched design points of two arms of a study: the pairs of runs a paired comparison rests on.

    pairs = match_arms(runs, "swiglu", "gelu", loss="final_val_loss")
    pairs.points()                  # GapPoints (fitting.comparisons.gap_model): budget, size, design point, ln ratio
    pairs.run_ids, pairs.n, pairs.d, pairs.loss      # (baseline's, arm's), one entry per pair
    rows = joint_rows(runs, "swiglu", "gelu", pairs, loss="final_val_loss")   # both arms' runs, for one law

Two done runs pair when they are the same design point of the two arms: the same FLOP budget (the
`flops_budget` label), the same design size (the `size_index` label the IsoFLOP generator and the
matched decisive measurement give, else `target_params`) and the same training seed. Runs without a
design size (a remedy round's) pair with nothing; the joint law still fits them, each its own design
point of the shared bootstrap (scalelab.fitting.comparisons.design_bootstrap).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from scalelab.fitting.comparisons.gap_model import NO_SIZE, GapPoints
from scalelab.sweeps.closed_loop.store_fit import number_or_none
from scalelab.sweeps.studies.study_spec import ARM_LABEL


def design_key(row: dict, loss: str) -> tuple[float, str, int] | None:
    """(budget, size key, seed) of a done run with a loss and a design size; None otherwise."""
    if row.get("status") != "done" or number_or_none(row.get(loss)) is None:
        return None
    budget = number_or_none(row.get("flops_budget"))
    size = number_or_none(row.get("size_index"))
    target = number_or_none(row.get("target_params"))
    if budget is None or (size is None and target is None):
        return None
    key = f"s{int(size)}" if size is not None else f"n{int(target)}"
    return budget, key, int(number_or_none(row.get("seed")) or 0)


def group_name(budget: float, size_key: str) -> str:
    """The design point's id: its budget and size (its seeds and both arms share it)."""
    return f"{budget:.6g}/{size_key}"


@dataclass(kw_only=True)
class MatchedPairs:
    """One entry per pair; the tuples hold (the baseline's, the arm's)."""

    budget: np.ndarray
    size: np.ndarray  # the design size index (NO_SIZE when the runs were matched by target_params)
    seed: np.ndarray
    group: list[str]
    run_ids: tuple[list[str], list[str]]
    n: tuple[np.ndarray, np.ndarray]
    d: tuple[np.ndarray, np.ndarray]
    loss: tuple[np.ndarray, np.ndarray]

    @property
    def count(self) -> int:
        return int(self.budget.size)

    def points(self) -> GapPoints:
        return GapPoints(
            log_budget=np.log10(self.budget),
            size=self.size,
            group=np.asarray(self.group),
            log_ratio=np.log(self.loss[1] / self.loss[0]),
        )

    def where(self, mask) -> MatchedPairs:
        mask = np.asarray(mask, dtype=bool)
        pick = lambda pair: tuple(np.asarray(x)[mask] for x in pair)  # noqa: E731
        return MatchedPairs(
            budget=self.budget[mask],
            size=self.size[mask],
            seed=self.seed[mask],
            group=[g for g, m in zip(self.group, mask) if m],
            run_ids=tuple([r for r, m in zip(ids, mask) if m] for ids in self.run_ids),
            n=pick(self.n),
            d=pick(self.d),
            loss=pick(self.loss),
        )


def _keyed(runs: pl.DataFrame, arm: str, loss: str) -> dict[tuple, dict]:
    if ARM_LABEL not in runs.columns:
        return {}
    out = {}
    for row in runs.filter(pl.col(ARM_LABEL) == arm).iter_rows(named=True):
        key = design_key(row, loss)
        if key is not None:
            out.setdefault(key, row)  # a design point run twice (linked twice): its first row
    return out


def match_arms(runs: pl.DataFrame, baseline: str, arm: str, *, loss: str) -> MatchedPairs:
    """The pairs of module docstring, ordered by budget, size and seed."""
    a, b = _keyed(runs, baseline, loss), _keyed(runs, arm, loss)
    keys = sorted(set(a) & set(b))
    rows = [(a[k], b[k]) for k in keys]
    col = lambda side, c: np.array([float(r[side][c]) for r in rows])  # noqa: E731
    return MatchedPairs(
        budget=np.array([k[0] for k in keys], dtype=float),
        size=np.array([int(k[1][1:]) if k[1][0] == "s" else NO_SIZE for k in keys], dtype=int),
        seed=np.array([k[2] for k in keys], dtype=int),
        group=[group_name(k[0], k[1]) for k in keys],
        run_ids=([str(r[0]["run_id"]) for r in rows], [str(r[1]["run_id"]) for r in rows]),
        n=(col(0, "params"), col(1, "params")),
        d=(col(0, "tokens"), col(1, "tokens")),
        loss=(col(0, loss), col(1, loss)),
    )


@dataclass(kw_only=True)
class JointRows:
    """Both arms' done runs for one law: arm 0 the baseline, 1 the other; a design point per run."""

    n: np.ndarray
    d: np.ndarray
    arm: np.ndarray
    loss: np.ndarray
    budget: np.ndarray
    group: list[str]


def joint_rows(runs: pl.DataFrame, baseline: str, arm: str, pairs: MatchedPairs, *, loss: str) -> JointRows:
    """Every done run of the two arms with a loss; a paired run's design point is its pair's, any
    other run is a design point of its own (module docstring)."""
    paired = {rid: g for ids in pairs.run_ids for rid, g in zip(ids, pairs.group)}
    out: dict[str, list] = {k: [] for k in ("n", "d", "arm", "loss", "budget", "group")}
    for i, name in enumerate((baseline, arm)):
        sub = runs.filter(pl.col(ARM_LABEL) == name) if ARM_LABEL in runs.columns else runs.clear()
        for row in sub.iter_rows(named=True):
            y, n, d = (
                number_or_none(row.get(loss)),
                number_or_none(row.get("params")),
                number_or_none(row.get("tokens")),
            )
            if row.get("status") != "done" or y is None or n is None or d is None:
                continue
            budget = number_or_none(row.get("flops_budget")) or 6.0 * n * d
            out["n"].append(n)
            out["d"].append(d)
            out["arm"].append(float(i))
            out["loss"].append(y)
            out["budget"].append(budget)
            out["group"].append(paired.get(str(row["run_id"]), f"run/{row['run_id']}"))
    arrays = {k: np.asarray(v, dtype=float) for k, v in out.items() if k != "group"}
    return JointRows(**arrays, group=out["group"])
