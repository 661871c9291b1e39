"""Decision accuracy of a study, as DataDecide measures it: does a cheaper ranking pick the winner at the target?

    table = decision_accuracy("results/studies/study-arch")
    print(format_decisions(table))
    pooled = pool([table_a, table_b, table_c])           # several studies together

The truth is the ranking of the arms at the target: each compared arm against the baseline by
their measured runs there (the study's decisive pair; with several seeds, the mean over seeds).
It is predicted from each smaller budget b of the design in two ways (Magnusson et al. 2025,
DataDecide: single-scale ranking against scaling-law methods):

(a) single-scale ranking: at budget b, every design point the arms share (the same size rank
    within b, the same seed) is one decision: the arm whose run there has the lower loss is
    called the winner. `best` ranks the arms by their best run at b instead (the IsoFLOP
    minimum), one decision per seed.
(b) law-based prediction: each arm fitted the loop's way on its runs of budgets up to b only
    (scalelab.sweeps.study_fit.fit_study with max_budget=b), its loss predicted at its measured
    target run's (N, D); one decision per seed (the fit of that seed's runs). Needs the loop's
    minimum of runs per arm (a single budget is not enough: n/a there).

Accuracy = correct decisions / decisions, per budget and method. DataDecide found single-scale
ranking at ~10% of the target's compute right ~80% of the time, and no scaling-law method above it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import polars as pl

from scalelab import store
from scalelab.errors import UsageError
from scalelab.sweeps.study_fit import arm_runs, fit_study, read_study

METHODS = ("each size", "best run", "law")


@dataclass(kw_only=True, slots=True)
class Cell:
    correct: int = 0
    total: int = 0
    note: str = ""  # why there is no decision (n/a)

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else math.nan

    def add(self, right: bool) -> None:
        self.correct += int(right)
        self.total += 1

    def text(self) -> str:
        return f"{self.correct}/{self.total} ({self.accuracy:.0%})" if self.total else "n/a"


@dataclass(kw_only=True)
class DecisionTable:
    study: str
    budgets: list[float]
    target_flops: float
    cells: dict[tuple[float, str], Cell]  # (budget, method) -> its decisions
    truth: dict[str, dict[int, float]] = field(default_factory=dict)  # arm -> seed -> measured gap at target
    notes: list[str] = field(default_factory=list)

    def cell(self, budget: float, method: str) -> Cell:
        return self.cells.setdefault((budget, method), Cell())

    def to_dict(self) -> dict:
        return {
            "study": self.study,
            "target_flops": self.target_flops,
            "truth": self.truth,
            "rows": [
                {"budget": b, **{m: asdict(self.cell(b, m)) | {"accuracy": self.cell(b, m).accuracy} for m in METHODS}}
                for b in self.budgets
            ],
            "notes": self.notes,
        }


def _loss_col(runs: pl.DataFrame, column: str) -> str:
    return column if column in runs.columns else "loss"


def _target_runs(runs: pl.DataFrame, arm: str, target: float) -> pl.DataFrame:
    sub = arm_runs(runs, arm).filter(pl.col("status") == "done")
    return sub.filter((pl.col("flops_budget") - target).abs() <= 0.05 * target)


def _seed_col(runs: pl.DataFrame) -> pl.DataFrame:
    return runs if "seed" in runs.columns else runs.with_columns(pl.lit(0).alias("seed"))


def decision_accuracy(sweep_dir: str | Path, *, runs: pl.DataFrame | None = None) -> DecisionTable:
    """The table of module docstring for one study (UsageError when it is not a study)."""
    sweep_dir = Path(sweep_dir)
    raw, study = read_study(sweep_dir)
    runs = _seed_col(store.load_runs(sweep_dir) if runs is None else runs)
    column = _loss_col(runs, (raw.get("fit") or {}).get("loss", "final_val_loss"))
    target = study.target_flops
    design = sorted({float(b) for b in runs["flops_budget"].drop_nulls().to_list() if float(b) < 0.95 * target})
    table = DecisionTable(study=sweep_dir.name, budgets=design, target_flops=target, cells={})
    base = study.baseline
    truth_runs = {a: _target_runs(runs, a, target) for a in study.names}
    for arm in study.others:
        gaps = {}
        for seed in sorted(set(truth_runs[arm]["seed"].to_list()) & set(truth_runs[base]["seed"].to_list())):
            la = truth_runs[base].filter(pl.col("seed") == seed)[column].mean()
            lb = truth_runs[arm].filter(pl.col("seed") == seed)[column].mean()
            gaps[int(seed)] = float(lb - la)
        if gaps:
            table.truth[arm] = gaps
    if not table.truth:
        table.notes.append("no arm has measured runs at the target yet: `sweep next --decide`, then launch it")
        return table
    for arm, gaps in table.truth.items():
        truth = sum(gaps.values()) / len(gaps) < 0  # the arm beats the baseline at the target
        for b in design:
            _single_scale(table, runs, base, arm, b, column, truth)
            _law_based(table, sweep_dir, runs, base, arm, b, truth)
    return table


def _single_scale(table: DecisionTable, runs, base: str, arm: str, budget: float, column: str, truth: bool) -> None:
    """(a): per shared design point, and by the best run at the budget, per seed."""
    at = {}
    for a in (base, arm):
        sub = arm_runs(runs, a).filter((pl.col("status") == "done") & (pl.col("flops_budget") == budget))
        at[a] = sub.sort("params")
    for seed in sorted(set(at[base]["seed"].to_list()) & set(at[arm]["seed"].to_list())):
        la = at[base].filter(pl.col("seed") == seed)[column].to_list()
        lb = at[arm].filter(pl.col("seed") == seed)[column].to_list()
        for x, y in zip(la, lb):  # size rank r of one arm against size rank r of the other
            table.cell(budget, "each size").add((y < x) == truth)
        if la and lb:
            table.cell(budget, "best run").add((min(lb) < min(la)) == truth)


def _law_based(table: DecisionTable, sweep_dir: Path, runs, base: str, arm: str, budget: float, truth: bool) -> None:
    """(b): the arms' laws fitted on budgets up to `budget`, predicted at the measured target runs."""
    cell = table.cell(budget, "law")
    target = table.target_flops
    for seed in sorted(table.truth[arm]):
        seed_runs = runs.filter(pl.col("seed") == seed)
        at = {}
        for a in (base, arm):
            t = _target_runs(seed_runs, a, target)
            at[a] = (float(t["params"][0]), float(t["tokens"][0]))
        try:
            sf = fit_study(sweep_dir, runs=seed_runs, max_budget=budget, replicates=0, at=at)
        except UsageError as e:
            cell.note = str(e).split(": ")[-1]
            continue
        cmp = sf.comparison(arm)
        cell.add((cmp.gap.point < 0) == truth)


def pool(tables: list[DecisionTable]) -> DecisionTable:
    """Several studies' decisions together, by the rank of the budget in each design (smallest first)."""
    depth = max((len(t.budgets) for t in tables), default=0)
    out = DecisionTable(study="pooled", budgets=list(range(depth)), target_flops=math.nan, cells={})
    for t in tables:
        for i, b in enumerate(t.budgets):
            for m in METHODS:
                c = t.cell(b, m)
                pooled = out.cell(i, m)
                pooled.correct += c.correct
                pooled.total += c.total
    return out


def format_decisions(table: DecisionTable) -> str:
    """Decision accuracy per budget: single-scale ranking (each size, best run) and the law's."""
    lines = [f"decision accuracy ({table.study}): does the ranking at a smaller budget pick the winner at the target?"]
    for arm, gaps in table.truth.items():
        measured = ", ".join(f"seed {s}: {g:+.4f}" for s, g in gaps.items())
        lines.append(f"  truth: {arm} vs baseline at C={table.target_flops:.3g}: measured gap {measured}")
    lines.append(
        f"  {'budget':>10}  {'single-scale, each size':>24}  {'single-scale, best run':>23}  {'law-based':>14}"
    )
    for b in table.budgets:
        name = f"{b:.3g}" if table.study != "pooled" else f"#{b + 1}"
        cells = [table.cell(b, m).text() for m in METHODS]
        lines.append(f"  {name:>10}  {cells[0]:>24}  {cells[1]:>23}  {cells[2]:>14}")
    lines += [f"  note: {n}" for n in table.notes]
    return "\n".join(lines)
