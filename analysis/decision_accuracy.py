"""Decision accuracy of a study, as DataDecide measures it: does a cheaper ranking pick the winner at the target?

    table = decision_accuracy("results/studies/study-arch")
    print(format_decisions(table))
    pooled = pool([table_a, table_b, table_c])           # several studies together
    table.cell(2e12, "paired").interval()                # Wilson 95% interval of its accuracy

The truth is the ranking of the arms at the target: each compared arm against the baseline by their
measured runs there, the matched decisive measurement's mean gap over its pairs (the same size and
seed; scalelab.sweeps.studies.study_pairs), with its standard error; an older study's single pair per arm
(no design size) is taken per seed. It is predicted from each budget b of the design in four ways
(Magnusson et al. 2025, DataDecide: single-scale ranking against scaling-law methods):

(a) single-scale ranking, each size: every design point the arms share at b (the same size and
    seed) is one decision: the arm whose run there has the lower loss is called the winner;
(b) single-scale ranking, best run: the arms ranked by their best run at b (the IsoFLOP minimum),
    one decision per seed;
(c) law-based, each arm's own law: each arm fitted the loop's way on its runs of budgets up to b only
    (scalelab.sweeps.studies.study_fit.fit_study with max_budget=b), the gap predicted at the measured
    target runs by the `separate` estimator; one decision per study;
(d) paired: the same fits, the gap by the `paired` estimator (the gap model on the matched design
    points up to b, scalelab.sweeps.studies.study_paired), one decision per study.

(c) and (d) need the loop's minimum of runs per arm (a single budget is not enough: n/a there).
Accuracy = correct decisions / decisions (a decision is the side the prediction leans to), with a
Wilson score interval (a handful of decisions says little: 4 of 6 is [30%, 90%]). For (c) and (d) a
cell also counts how many predictions were decided (their interval excluded 0) and how many of those
were wrong. `pool` sums several studies by the rank of the budget in each design; the last rank is
each study's largest budget, where the law-based methods use every design run.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl
from scipy import stats

from scalelab import store
from scalelab.errors import UsageError
from scalelab.fitting.entry.fit_options import fit_options
from scalelab.sweeps.closed_loop.propose import readable
from scalelab.sweeps.studies.study_fit import arm_runs, fit_study, read_study
from scalelab.sweeps.studies.study_pairs import match_arms

METHODS = ("each size", "best run", "law", "paired")
METHOD_TEXT = {
    "each size": "single-scale, each size",
    "best run": "single-scale, best run",
    "law": "law-based (each arm's law)",
    "paired": "paired gap model",
}
LEVEL = 0.95
TARGET_TOLERANCE = 0.05  # a run within 5% of the target's FLOPs is one of its runs


def wilson_interval(correct: int, total: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion correct/total ((nan, nan) with no trials)."""
    if total <= 0:
        return math.nan, math.nan
    z = float(stats.norm.ppf(0.5 + level / 2))
    p = correct / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(kw_only=True, slots=True)
class Cell:
    correct: int = 0
    total: int = 0
    decided: int = 0  # predictions whose interval excluded 0 (law-based methods)
    wrong: int = 0  # of those, the ones on the wrong side
    note: str = ""  # why there is no decision (n/a)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else math.nan

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        return wilson_interval(self.correct, self.total, level)

    def add(self, right: bool, decided: bool | None = None) -> None:
        self.correct += int(right)
        self.total += 1
        if decided:
            self.decided += 1
            self.wrong += int(not right)

    def merge(self, other: Cell) -> None:
        self.correct += other.correct
        self.total += other.total
        self.decided += other.decided
        self.wrong += other.wrong

    def text(self, decisions: bool = False) -> str:
        if not self.total:
            return "n/a"
        lo, hi = self.interval()
        out = f"{self.correct}/{self.total} ({self.accuracy:.0%}) [{lo:.0%}, {hi:.0%}]"
        return out + (f", decided {self.decided}, wrong {self.wrong}" if decisions else "")

    def to_dict(self) -> dict:
        return asdict(self) | {"accuracy": self.accuracy, "interval": list(self.interval())}


@dataclass(kw_only=True)
class DecisionTable:
    study: str
    budgets: list[float]
    target_flops: float
    cells: dict[tuple[float, str], Cell]  # (budget, method) -> its decisions
    truth: dict[str, dict[int, float]] = field(default_factory=dict)  # arm -> seed -> measured gap at target
    truth_se: dict[str, float | None] = field(default_factory=dict)  # arm -> se of the measured mean gap
    notes: list[str] = field(default_factory=list)

    def cell(self, budget: float, method: str) -> Cell:
        return self.cells.setdefault((budget, method), Cell())

    def truth_gap(self, arm: str) -> float:
        gaps = self.truth[arm]
        return sum(gaps.values()) / len(gaps)

    def to_dict(self) -> dict:
        return {
            "study": self.study,
            "target_flops": self.target_flops,
            "truth": self.truth,
            "truth_se": self.truth_se,
            "rows": [{"budget": b, **{m: self.cell(b, m).to_dict() for m in METHODS}} for b in self.budgets],
            "notes": self.notes,
        }


def _loss_col(runs: pl.DataFrame, column: str) -> str:
    return column if column in runs.columns else "loss"


def _at_target(runs: pl.DataFrame, target: float) -> pl.Expr:
    return (pl.col("flops_budget") - target).abs() <= TARGET_TOLERANCE * target


def _seed_col(runs: pl.DataFrame) -> pl.DataFrame:
    return runs if "seed" in runs.columns else runs.with_columns(pl.lit(0).alias("seed"))


def _truth(runs: pl.DataFrame, base: str, arm: str, column: str, target: float):
    """(seed -> measured gap, its se over pairs, arm -> the target runs' (N, D) aligned) or None."""
    pairs = match_arms(runs, base, arm, loss=column)
    pairs = pairs.where(abs(pairs.budget - target) <= TARGET_TOLERANCE * target)
    if pairs.count:
        diffs = pairs.loss[1] - pairs.loss[0]
        gaps = {int(s): float(diffs[pairs.seed == s].mean()) for s in sorted(set(pairs.seed.tolist()))}
        se = float(diffs.std(ddof=1) / math.sqrt(diffs.size)) if diffs.size > 1 else None
        at = {base: list(zip(pairs.n[0], pairs.d[0])), arm: list(zip(pairs.n[1], pairs.d[1]))}
        return gaps, se, at
    done = {a: arm_runs(runs, a).filter((pl.col("status") == "done") & _at_target(runs, target)) for a in (base, arm)}
    seeds = sorted(set(done[base]["seed"].to_list()) & set(done[arm]["seed"].to_list()))
    if not seeds:
        return None
    gaps = {}
    for seed in seeds:  # an older study: one run per arm and seed, no design size
        la = done[base].filter(pl.col("seed") == seed)[column].mean()
        lb = done[arm].filter(pl.col("seed") == seed)[column].mean()
        gaps[int(seed)] = float(lb - la)
    first = {a: done[a].filter(pl.col("seed") == seeds[0]) for a in (base, arm)}
    at = {a: [(float(first[a]["params"][0]), float(first[a]["tokens"][0]))] for a in (base, arm)}
    return gaps, None, at


def decision_accuracy(sweep_dir: str | Path, *, runs: pl.DataFrame | None = None) -> DecisionTable:
    """The table of module docstring for one study (UsageError when it is not a study)."""
    sweep_dir = readable(sweep_dir)
    raw, study = read_study(sweep_dir)
    runs = _seed_col(store.load_runs(sweep_dir) if runs is None else runs)
    fit = fit_options(raw.get("fit") or {})
    column = _loss_col(runs, fit.loss)
    replicates = fit.bootstrap  # the paired bootstrap's
    target = study.target_flops
    design = sorted({float(b) for b in runs["flops_budget"].drop_nulls().to_list() if float(b) < 0.95 * target})
    table = DecisionTable(study=sweep_dir.name, budgets=design, target_flops=target, cells={})
    base = study.baseline
    targets = {}
    for arm in study.others:
        found = _truth(runs, base, arm, column, target)
        if found is not None:
            table.truth[arm], table.truth_se[arm], targets[arm] = found
    if not table.truth:
        table.notes.append("no arm has measured runs at the target yet: `sweep next --decide`, then launch it")
        return table
    for arm in table.truth:
        truth = table.truth_gap(arm) < 0  # the arm beats the baseline at the target
        se = table.truth_se.get(arm)
        if se is not None and abs(table.truth_gap(arm)) < 2 * se:
            table.notes.append(f"{arm}: the measured gap is within 2 se of 0: its winner is not established")
        for b in design:
            _single_scale(table, runs, base, arm, b, column, truth)
            _law_based(table, sweep_dir, runs, arm, b, truth, targets[arm], replicates)
    return table


def _single_scale(table: DecisionTable, runs, base: str, arm: str, budget: float, column: str, truth: bool) -> None:
    """(a) per shared design point, (b) by the best run at the budget, per seed."""
    pairs = match_arms(runs, base, arm, loss=column)
    pairs = pairs.where(pairs.budget == budget)
    for la, lb in zip(*pairs.loss):
        table.cell(budget, "each size").add((lb < la) == truth)
    at = {
        a: arm_runs(runs, a).filter((pl.col("status") == "done") & (pl.col("flops_budget") == budget))
        for a in (base, arm)
    }
    for seed in sorted(set(at[base]["seed"].to_list()) & set(at[arm]["seed"].to_list())):
        la = at[base].filter(pl.col("seed") == seed)[column].to_list()
        lb = at[arm].filter(pl.col("seed") == seed)[column].to_list()
        if la and lb:
            table.cell(budget, "best run").add((min(lb) < min(la)) == truth)


def _law_based(table: DecisionTable, sweep_dir: Path, runs, arm: str, budget: float, truth: bool, at, reps) -> None:
    """(c) and (d): the arms' fits on budgets up to `budget` with the spec's `reps` bootstrap replicates
    (whether a prediction was decided needs its interval), the gaps at the measured target runs."""
    try:
        sf = fit_study(sweep_dir, runs=runs, max_budget=budget, replicates=reps, at=at, joint=False)
    except UsageError as e:
        for m in ("law", "paired"):
            table.cell(budget, m).note = str(e).split(": ")[-1]
        return
    cmp = sf.comparison(arm)
    table.cell(budget, "law").add((cmp.separate_gap.point < 0) == truth, cmp.separate_gap.decided)
    if cmp.paired is not None:
        table.cell(budget, "paired").add((cmp.paired.matched.point < 0) == truth, cmp.paired.matched.decided)


def pool(tables: list[DecisionTable]) -> DecisionTable:
    """Several studies' decisions together, by the rank of the budget in each design (smallest first)."""
    depth = max((len(t.budgets) for t in tables), default=0)
    out = DecisionTable(study="pooled", budgets=list(range(depth)), target_flops=math.nan, cells={})
    for t in tables:
        offset = depth - len(t.budgets)  # align the largest budgets: the last rank is every study's largest
        for i, b in enumerate(t.budgets):
            for m in METHODS:
                out.cell(i + offset, m).merge(t.cell(b, m))
    return out


def format_decisions(table: DecisionTable) -> str:
    """Decision accuracy per budget and method, with Wilson intervals."""
    lines = [f"decision accuracy ({table.study}): does the ranking at a smaller budget pick the winner at the target?"]
    for arm, gaps in table.truth.items():
        measured = ", ".join(f"seed {s}: {g:+.4f}" for s, g in gaps.items())
        se = table.truth_se.get(arm)
        lines.append(
            f"  truth: {arm} vs baseline at C={table.target_flops:.3g}: measured gap {measured}"
            + (f" (mean {table.truth_gap(arm):+.4f} +- {se:.4f} se)" if se is not None else "")
        )
    for b in table.budgets:
        name = f"{b:.3g}" if table.study != "pooled" else f"#{b + 1}"
        lines.append(f"  budget {name}:")
        for m in METHODS:
            cell = table.cell(b, m)
            text = cell.text(decisions=m in ("law", "paired"))
            lines.append(
                f"    {METHOD_TEXT[m]:28} {text}" + (f" ({cell.note})" if cell.note and not cell.total else "")
            )
    lines += [f"  note: {n}" for n in table.notes]
    return "\n".join(lines)
