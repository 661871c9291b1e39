"""How a table's runs are grouped by compute: the unit of backtests, forward folds and the frontier.

    groups = compute_groups(table)
    groups.labels        # per run, ordered by compute (group_order)
    groups.kind          # "group column" | "FLOP budgets" | "FLOP bins" | "models"
    groups.note          # one line saying which was used, for `scalelab fit`'s output

A table's own columns decide (the first that applies):

1. a `group` column: its labels, as given;
2. loss curves (checkpoints of a few models: each size seen at MIN_CHECKPOINTS or more token counts
   on average): one group per model, each scored on its last 30% of tokens (its earlier checkpoints
   sit inside the smaller models' compute);
3. FLOP budgets: runs within 5% of each other's FLOPs share one (scalelab.fitting.estimate.approaches.group_budgets);
4. more budgets than MAX_GROUPS (FLOPs read off a figure, or a design of scattered budgets): the
   budgets merged into MAX_GROUPS FLOP bins, split at the widest gaps in log C, so that backtests and
   forward folds run over the bins instead of being skipped (58 budgets would be 58 refits).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scalelab.fitting.estimate.approaches import group_budgets
from scalelab.fitting.estimate.io import RunTable

MAX_GROUPS = 12  # the most groups a table's backtests refit once each
SCORED_TAIL = 0.3  # a model's last 30% of tokens: what a forward fold scores of a loss curve


@dataclass(frozen=True, slots=True)
class ComputeGroups:
    labels: np.ndarray  # per run
    kind: str
    note: str
    scored: np.ndarray | None = None  # per run: scored when its group is predicted (None: every run)

    @property
    def num_groups(self) -> int:
        return int(np.unique(self.labels).size)


MIN_CHECKPOINTS = 8  # token counts per size, on average, that make a table loss curves


def is_curve_table(params: np.ndarray, tokens: np.ndarray) -> bool:
    """Checkpoints of a few models: each size seen at MIN_CHECKPOINTS or more token counts on average
    (an IsoFLOP design that reuses its sizes sees each at one token count per budget, a handful)."""
    sizes = np.unique(params)
    if sizes.size > params.size / 3:
        return False
    return float(np.mean([np.unique(tokens[params == n]).size for n in sizes])) >= MIN_CHECKPOINTS


def merge_at_gaps(flops: np.ndarray, budgets: np.ndarray, num_bins: int) -> np.ndarray:
    """Budget labels merged into `num_bins` bins, split at the widest gaps between consecutive
    budgets in log C (labels 0..num_bins-1 in order of compute)."""
    keys = np.unique(budgets)
    centres = np.array([np.exp(np.mean(np.log(flops[budgets == k]))) for k in keys])
    order = np.argsort(centres)
    gaps = np.diff(np.log10(centres[order]))
    cuts = np.sort(np.argsort(gaps)[::-1][: num_bins - 1])  # a cut after position i of the order
    bin_of_position = np.searchsorted(cuts, np.arange(keys.size), side="left")
    bin_of_key = dict(zip(keys[order].tolist(), bin_of_position.tolist()))
    return np.array([bin_of_key[b] for b in budgets.tolist()])


def compute_groups(table: RunTable, max_groups: int = MAX_GROUPS) -> ComputeGroups:
    """The groups of `table` (module docstring)."""
    if table.group is not None:
        n = np.unique(table.group).size
        return ComputeGroups(labels=np.asarray(table.group), kind="group column", note=f"{n} groups (the group column)")
    if is_curve_table(table.params, table.tokens):
        last = np.array(
            [
                t >= (1.0 - SCORED_TAIL) * table.tokens[table.params == n].max()
                for n, t in zip(table.params, table.tokens)
            ]
        )
        n = np.unique(table.params).size
        note = f"loss curves of {n} models: one group per model, each scored on its last {SCORED_TAIL:.0%} of tokens"
        return ComputeGroups(labels=table.params.copy(), kind="models", note=note, scored=last)
    budgets = group_budgets(table.flops)
    k = np.unique(budgets).size
    if k <= max_groups:
        return ComputeGroups(labels=budgets, kind="FLOP budgets", note=f"{k} FLOP budgets (runs within 5% share one)")
    note = f"{k} FLOP budgets grouped into {max_groups} FLOP bins at the {max_groups - 1} widest gaps in log C"
    return ComputeGroups(labels=merge_at_gaps(table.flops, budgets, max_groups), kind="FLOP bins", note=note)
