"""The recipe gate: before a design spends its compute, how much loss each run's learning rate and
weight decay cost against their best, from a recipe audit (scalelab.sweeps.recipes.recipe_audit).

    recipe_gate:
      audit: results/audit     # an audit store (its audit.json, written by `scalelab sweep audit`) or the file
      max_cost: 0.005          # the relative loss a run's LR and weight decay may cost together
      weight_decay: true       # charge the weight decay too, when the audit measured it (default)

For every run of the design (and of each round the loop proposes): the audit's LR(N, D) law gives
the best LR at the run's (N, D) with its interval, and the loss the run's LR costs against it,
exp(q2 (ln lr - ln lr*)^2) - 1 with q2 the audit's curvature there (scalelab.fitting.hp_laws.lr_law); the
best weight-decay timescale (1 / (lr wd) as a fraction of the run) likewise prices the run's decay.
A run whose two costs add up to more than `max_cost` is over; `sweep plan` prints the table,
and `sweep launch` (scalelab.sweeps.closed_loop.rounds.run_rounds) refuses the design, naming those runs, with
exit 2 unless `--force`. Costs come with the interval of the audit's replicates; the gate decides on
the point estimate (the interval says how sure that is). Beyond the audit's cells the laws are
extrapolated, which the interval widens for.

This sits beside the LR-transfer gate (scalelab.sweeps.recipes.transfer): that one asks whether one LR
transfers across widths under µP; this one asks whether the recipe's LR and decay are where the
audit found the best, at each run's size *and* length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.errors import ConfigError, UsageError
from scalelab.sweeps.recipes.recipe import timescale_of
from scalelab.sweeps.recipes.recipe_audit import AuditResult, load_audit
from scalelab.sweeps.specs.runspec import RunSpec
from scalelab.sweeps.specs.spec_checks import check_keys, number

GATE_KEYS = ("audit", "max_cost", "weight_decay")


@dataclass(kw_only=True, slots=True)
class GateSpec:
    audit: str
    max_cost: float = 0.005
    weight_decay: bool = True


@dataclass(kw_only=True, slots=True)
class GateRow:
    run_id: str
    params: int
    tokens: int
    lr: float
    best_lr: tuple[float, float, float]  # point, lo, hi
    lr_cost: tuple[float, float, float]
    timescale: float  # 1 / (lr wd steps)
    best_timescale: tuple[float, float, float] | None
    wd_cost: tuple[float, float, float] | None

    @property
    def cost(self) -> float:
        return self.lr_cost[0] + (self.wd_cost[0] if self.wd_cost else 0.0)


@dataclass(kw_only=True)
class RecipeGate:
    rows: list[GateRow]
    max_cost: float
    source: str  # where the audit came from
    notes: list[str] = field(default_factory=list)

    @property
    def over(self) -> list[GateRow]:
        return [r for r in self.rows if r.cost > self.max_cost]

    @property
    def ok(self) -> bool:
        return not self.over


def parse_gate(section: Any) -> GateSpec | None:
    """The spec's `recipe_gate:` section checked (None when absent); ConfigError names the key."""
    if section is None:
        return None
    check_keys(section, GATE_KEYS, "recipe_gate")
    if "audit" not in section:
        raise ConfigError("recipe_gate.audit", "missing", "give the audit's store, e.g. audit: results/audit")
    wd = section.get("weight_decay", True)
    if not isinstance(wd, bool):
        raise ConfigError("recipe_gate.weight_decay", f"{wd!r} is not true or false", "write weight_decay: true")
    cost = number(section.get("max_cost", 0.005), "recipe_gate.max_cost", example="0.005")
    if cost >= 1:
        raise ConfigError("recipe_gate.max_cost", f"{cost:g} is a relative loss, not a percentage", "e.g. 0.005")
    return GateSpec(audit=str(section["audit"]), max_cost=cost, weight_decay=wd)


def gate_spec_audit(spec: GateSpec) -> AuditResult:
    """The audit a gate section names; ConfigError naming recipe_gate.audit when it cannot be read."""
    try:
        return load_audit(Path(spec.audit).expanduser())
    except UsageError as e:
        raise ConfigError("recipe_gate.audit", str(e)) from None


def check_runs(runs: list[RunSpec], audit: AuditResult, *, max_cost: float, weight_decay: bool = True,
               source: str = "") -> RecipeGate:  # fmt: skip
    """The gate's table for `runs` (module docstring)."""
    if audit.lr_law is None:
        raise UsageError(f"{source or 'the audit'}: its LR(N, D) law was not fitted (too few bracketed cells)")
    notes = []
    wd_law = audit.wd_law if weight_decay else None
    if weight_decay and wd_law is None:
        notes.append("the audit has no weight-decay law: only the LR is charged")
    rows = []
    for run in runs:
        optim = run.config["optim"]
        lr, n, d = float(optim["lr"]), float(run.params), float(run.num_tokens)
        steps = run.num_tokens // run.config["train"]["global_batch_tokens"]
        tau = timescale_of(float(optim["weight_decay"]), lr, steps)
        rows.append(
            GateRow(
                run_id=run.run_id,
                params=run.params,
                tokens=run.num_tokens,
                lr=lr,
                best_lr=audit.lr_law.predict(n, d),
                lr_cost=audit.lr_law.cost(n, d, lr),
                timescale=tau,
                best_timescale=wd_law.predict() if wd_law else None,
                wd_cost=wd_law.cost(1.0, 1.0, tau) if wd_law and math.isfinite(tau) else None,
            )
        )
    return RecipeGate(rows=rows, max_cost=max_cost, source=source, notes=notes)


def check_sweep(sweep, *, raw: dict[str, Any] | None = None) -> RecipeGate | None:
    """The gate of a sweep whose spec (or `raw`, e.g. the loop's spec for a round's runs) has
    `recipe_gate:`; None without one."""
    spec = parse_gate((raw if raw is not None else sweep.raw).get("recipe_gate"))
    if spec is None:
        return None
    return check_runs(sweep.runs, gate_spec_audit(spec), max_cost=spec.max_cost, weight_decay=spec.weight_decay,
                      source=spec.audit)  # fmt: skip


COST_SHOWN_UP_TO = 1.0  # a cost bound past +100% is printed as such: the parabola in ln(LR) means nothing there


def _cost(v: float) -> str:
    return format(v, "+.2%") if v <= COST_SHOWN_UP_TO else f">{COST_SHOWN_UP_TO:+.0%}"


def _triple(t: tuple[float, float, float] | None, fmt) -> str:
    if t is None:
        return "-"
    show = fmt if callable(fmt) else (lambda v: format(v, fmt))
    return f"{show(t[0])} [{show(t[1])}, {show(t[2])}]"


def format_recipe_gate(gate: RecipeGate) -> str:
    """The gate's table: per run its LR against the best, the costs, and the verdict."""
    lines = [
        f"recipe gate (audit {gate.source}; cost = relative loss against the best, 90% interval; "
        f"max {gate.max_cost:.2%} per run)",
        f"{'run_id':12} {'N':>9} {'D':>11} {'lr':>8} {'best lr':>26} {'lr cost':>26} {'timescale':>9} "
        f"{'best':>22} {'wd cost':>26}",
    ]
    for r in gate.rows:
        flag = "  OVER" if r.cost > gate.max_cost else ""
        lines.append(
            f"{r.run_id:12} {r.params:>9,} {r.tokens:>11,} {r.lr:>8.3g} {_triple(r.best_lr, '.3g'):>26} "
            f"{_triple(r.lr_cost, _cost):>26} {r.timescale:>9.3g} {_triple(r.best_timescale, '.3g'):>22} "
            f"{_triple(r.wd_cost, _cost):>26}{flag}"
        )
    over = gate.over
    lines.append(
        f"{len(gate.rows) - len(over)} of {len(gate.rows)} run(s) within {gate.max_cost:.2%}; "
        + ("passes" if not over else "REFUSES: " + ", ".join(f"{r.run_id} ({r.cost:+.2%})" for r in over))
    )
    lines += [f"note: {n}" for n in gate.notes]
    return "\n".join(lines)
