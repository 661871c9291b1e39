"""The options of the one fit entry (scalelab.fitting.entry.fit_runs.fit_runs): one typed object, built and
checked in one place.

    FitOptions(law="auto", approach=3, bootstrap=0, backtest=False)  # a table's fit, as the analyses ask
    fit_options(spec["fit"])                          # a sweep store's: its spec's `fit:` section
    fit_options(spec["fit"], bootstrap=8, seed=1)     # ... with `sweep next`'s or `scalelab fit`'s options
    fit_options(None, flags=FLAGS, law="kaplan")      # `scalelab fit TABLE`'s arguments

`FitOptions.__post_init__` checks every value (the one place a value is refused). `fit_options` is
the one builder of a spec's `fit:` section and a command's options: the section's keys and types,
a sweep store's defaults (SECTION_DEFAULTS: bootstrap intervals, the whole start grid drawn with
seed 0, the gates, the law's compute-optimal allocation), the rules a store's law follows (the
closed loop proposes from N*(C), so the spec's law and stacked forms are laws of N and D that
allocate), the options of law auto, and the command's options over the spec's. Its errors name the
key as the input spelled it: `fit.law` for the spec, `--law` for the command line. `expand_sweep`
(a spec), `scalelab fit`, `sweep next`, `scalelab report` and the studies all build theirs with it,
so on one store they fit with the same options and agree on every number.

`law` is the one field that chooses what is fitted: a law name (scalelab.fitting.forms.laws); "auto", the
stacked law (the `candidates`' forms weighted by forward backtests, scalelab.fitting.selection.ensemble: the
first candidate predicts alone unless the forward evidence moves weight off it); or "select" (the
best of `candidates` by the held-out-largest-budget backtest, scalelab.fitting.selection.select, curve laws
included). It is read in one place, scalelab.fitting.entry.fit_runs.fit_law_choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scalelab.config_tree import typed_values
from scalelab.errors import ConfigError

LEVEL = 0.95
DEFAULT_LAW = "chinchilla"
SECTION = "fit"  # the sweep spec's section
# The laws the closed loop fits (a spec's fit.law, the stacked candidates) and plan-run plans from:
# each can allocate (scalelab.fitting.allocation.allocate.can_allocate); farseer can too, but its gamma is not
# identified on a 1-1.5 decade design (docs/extrapolation.md), so it is not one of them. Here, not in
# allocate.py: the options are checked before numpy and scipy load (plan-run, the CLI's parser).
LOOP_LAWS = ("chinchilla", "kaplan")
SECTION_KEYS = (
    "law",
    "candidates",
    "evidence",
    "stack_point",
    "loss",
    "flops",
    "params",
    "target_flops",
    "bootstrap",
    "noise_floor",
)
# a sweep store's fit where its spec is silent: what the closed loop's recorded fits were made with
SECTION_DEFAULTS: dict[str, Any] = dict(
    loss="final_val_loss",
    bootstrap=64,
    require_optimum=True,
    starts=None,  # the law's whole init grid (a drawn subset can miss the optimum)
    draw_starts=True,
    seed=0,
    gates=True,
)
AUTO_ONLY = ("candidates", "evidence", "stack_point")  # options of law auto
CHOICES = {
    "objective": ("huber", "squared"),
    "flops": ("6n", "exact"),
    "params": ("total", "nonembed"),
    "stopped": ("include", "exclude"),
    "evidence": ("growth", "level"),
    "stack_point": ("bagged", "rule"),
    "isoflop_shape": ("parabola", "power"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class FitOptions:
    # what is fitted
    law: str = DEFAULT_LAW  # a law name; "auto": the stacked law; "select": the best of `candidates` by backtest
    candidates: tuple[str, ...] | None = None  # auto: the stacked forms, incumbent first (None: chinchilla, kaplan);
    # select: the laws compared (None: every law the data allow)
    evidence: str = (
        "growth"  # auto: what moves weight off the incumbent (scalelab.fitting.uncertainty.stacking.StackRule):
    )
    # growth (its forward error grows with distance) | level (its forward error per decade is nonzero)
    stack_point: str = "bagged"  # auto: the weights that predict: bagged (the mean of the rule's bootstrap
    # draws that can test the evidence) | rule (the rule's own all-or-nothing decision)
    require_optimum: bool = False  # one law of N and D with a compute-optimal allocation (the loop proposes
    # from N*(C)): when "auto" picks a curve law or the average, the best-scored such law is fitted instead
    approach: int = 3  # 1 (envelope), 2 (IsoFLOP parabolas) or 3 (parametric law), Chinchilla's approaches
    isoflop_shape: str = "parabola"  # approach 2's slice fit: parabola in ln N | power (the curve's own
    # asymmetric shape, exponents shared: scalelab.fitting.estimate.isoflop_shape)
    # which runs and values (a sweep store's runs table: scalelab.sweeps.closed_loop.store_fit)
    loss: str = "loss"  # the loss column
    flops: str = "6n"  # 6n | exact: a run's FLOPs where it has no IsoFLOP budget label
    params: str = "total"  # total | nonembed: the N a law is fitted on (a store's params or params_nonembed)
    stopped: str = "exclude"  # runs stopped early: left out, or "include"d at their predicted loss and weight
    # how it is fitted: Huber on log loss (delta), L-BFGS from `starts` rows of the law's init grid
    objective: str = "huber"  # huber | squared
    delta: float = 1e-3  # Huber threshold on log-loss residuals
    starts: int | None = None  # None: the whole init grid; K: K evenly spaced rows of it (every axis value)
    draw_starts: bool = False  # the K rows drawn at random with the seed instead: a sweep store's rule
    # (scalelab.sweeps.closed_loop.store_fit), kept because the loop's recorded fits and proposals were made with it
    # intervals, backtests, gates
    bootstrap: int = 0  # replicates (runs resampled, each refitted); 0: delta-method intervals
    seed: int = 0  # the one generator behind the starts, the bootstrap and the backtests' starts
    level: float = LEVEL  # interval level
    backtest: bool = True  # hold out the largest budget; leave each budget out (3+ budgets)
    holdout_frac: float | None = None  # hold out this fraction of runs by FLOPs instead of the largest budget
    noise_floor: float = 0.0  # run-to-run log-sd from a seed study: the least noise a prediction carries
    gates: bool = False  # check the identification gates (laws of N and D; scalelab.fitting.entry.gates)
    target_flops: float | None = None  # where the starts gate compares (default: 3x the largest budget)

    def __post_init__(self) -> None:
        """Every value checked (ConfigError naming the field; fit_options renames it as its input spelled it)."""
        if self.candidates is not None:  # a YAML list or a command's tuple; empty is the default forms
            object.__setattr__(self, "candidates", tuple(str(c) for c in self.candidates) or None)
        if self.approach not in (1, 2, 3):
            raise ConfigError("approach", f"{self.approach} is not an approach", "use 1, 2 or 3")
        if self.bootstrap < 0:
            raise ConfigError("bootstrap", f"{self.bootstrap} is negative", "use 0 (delta-method intervals) or more")
        if self.starts is not None and self.starts < 1:
            raise ConfigError("starts", f"{self.starts} is below 1", "use 1 or more (or none: the whole init grid)")
        if self.holdout_frac is not None and not 0.0 < self.holdout_frac < 1.0:
            raise ConfigError("holdout_frac", f"{self.holdout_frac} is not a fraction of runs", "use e.g. 0.2")
        if not 0.0 < self.level < 1.0:
            raise ConfigError("level", f"{self.level} is not in (0, 1)", "use e.g. 0.95")
        if not 0.0 <= self.noise_floor < 0.5:
            raise ConfigError("noise_floor", f"{self.noise_floor!r} must be in [0, 0.5)", "a log-sd, e.g. 0.01")
        if self.target_flops is not None and not (math.isfinite(self.target_flops) and self.target_flops > 0):
            raise ConfigError("target_flops", f"{self.target_flops:.3g} is not a FLOP count", "write e.g. 1e21")
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(name, f"{value!r} is not known", f"use {' or '.join(allowed)}")


def fit_options(
    section: Mapping[str, Any] | None = None, *, flags: Mapping[str, str] | None = None, **given: Any
) -> FitOptions:
    """The options of a fit, built and checked once (module docstring).

    Args:
        section: a sweep spec's `fit:` mapping ({} for a store without one): a sweep store's fit,
            SECTION_DEFAULTS under it; None: a table's fit, FitOptions' defaults.
        flags: how the command spells each option given (`{"law": "--law"}`), for its errors; a
            key it does not name is spelled as the field.
        given: the command's options; those that are not None win over the section. A law given
            is fitted as asked: the section's stacked forms and the compute-optimal fallback drop.
    Raises:
        ConfigError: the key as its input spelled it (`fit.law`, `--stack-point`) and the fix.
    """
    given = {k: v for k, v in given.items() if v is not None}
    names = {k: (flags or {}).get(k, k) for k in given}
    values: dict[str, Any] = {}
    if section is not None:
        if not isinstance(section, Mapping):
            raise ConfigError(SECTION, f"expected a mapping, got {section!r}", "write it as a YAML mapping")
        values = {**SECTION_DEFAULTS, **_section_values(section)}
        names = {k: f"{SECTION}.{k}" for k in section} | names
    law = given.get("law", values.get("law", DEFAULT_LAW))
    for key in AUTO_ONLY:
        if key in given and law != "auto":
            law_name = names.get("law", (flags or {}).get("law", "law"))
            raise ConfigError(names[key], f"an option of {law_name} auto", f"add {law_name} auto")
    if "law" in given:
        values.update(candidates=None, require_optimum=False)
    try:
        return FitOptions(**{**values, **given})
    except ConfigError as e:
        raise ConfigError(names.get(e.key, e.key), e.problem, e.fix) from None


def _section_values(section: Mapping[str, Any]) -> dict[str, Any]:
    """A spec's `fit:` section, typed, with the rules of a store's law: the closed loop proposes from
    N*(C), so its law is one of N and D that allocates, or law auto of such forms."""
    values = typed_values(FitOptions, dict(section), SECTION, known=SECTION_KEYS)
    law = values.get("law", DEFAULT_LAW)
    if law not in (*LOOP_LAWS, "auto"):
        raise ConfigError(
            "fit.law", f"{law!r} is not a law of (N, D) the loop can fit", f"use {', '.join(LOOP_LAWS)} or auto"
        )
    for key in AUTO_ONLY:
        if key in values and values[key] and law != "auto":
            raise ConfigError(f"fit.{key}", f"set with fit.law {law!r}", "it is an option of law auto")
    for i, name in enumerate(values.get("candidates") or ()):
        form, _, weighting = str(name).partition("@")
        if form not in LOOP_LAWS or weighting not in ("", "equal", "flops") or (i == 0 and weighting == "flops"):
            raise ConfigError(
                f"fit.candidates[{i}]",
                f"{name!r} is not a stackable form",
                f"use {' or '.join(LOOP_LAWS)}, optionally with @flops (not on the first, the incumbent)",
            )
    if values.get("target_flops") == 0:  # the spec's "none": `sweep next` then needs --target-flops
        values["target_flops"] = None
    return values
