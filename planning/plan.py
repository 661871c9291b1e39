"""`plan_run`: a fit, a design and a cluster -> the run a lab would launch, every number with its interval.

    model = load_loss_model("results/iso"); design = sweep_design("results/iso"); cluster = cpu_cluster(...)
    plan = plan_run(model, design, cluster, flops=2e14, hp=HPChoice(sweep=read_hp_sweep("lr.csv")))
    plan.run.params, plan.loss.point, plan.loss.lo, plan.cost.wall_s, plan.layout.name
    plan = plan_for_days(model, design, cluster, days=30, ...)     # the budget the cluster affords

In order (each step's figures are kept in the plan):
 1. N*(C), D*(C) and L*(C) with their intervals from the fit (planning.loss_model).
 2. The concrete model: the shape rule's picks near N* (the design's: a sweep's shape options), each
    at D = C / 6N, and its law loss; the plan takes the lowest. Its cost over L*(C) is "rounding".
 3. LR and batch with intervals (planning.hparams), warmup and schedule from the design.
 4. The run resolved exactly as it will be launched (planning.design): whole steps, run id.
 5. The layout (planning.plan_layout): on a GPU cluster the planner's fastest that fits memory (and,
    when none divides the batch or fits, the batch doubled up to BATCH_GROWTH times: the batch "the
    cluster can hold", its loss cost entered as a shift); on this CPU the sweep's own single-process
    layout. Step time, MFU, wall time = steps x step, GPU-hours, and the planner's error band on the
    wall time.
 6. The loss at the concrete (N, D) with the fit's interval parts plus the plan's own: the cost
    of the LR and the batch at the edge of their intervals (planning.hparams) as log-sds (the edge
    cost / z, so each enters the root sum of squares as a 95% half-width), and "rounding" (the
    shape's cost over L*(C)) and "batch change" as shifts of the point, shown beside them.
 7. Sensitivities of the law's loss: N off by x1.5 and x2 (at the same C), D cut by 20% (same N),
    the LR and the batch at their intervals' edges.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from scalelab.errors import UsageError
from scalelab.fitting.uncertainty.predictive import PredictionInterval, interval_from_parts
from scalelab.models.accounting import flops_per_token, num_params
from scalelab.models.config import ModelConfig
from scalelab.planning.cluster import Cluster
from scalelab.planning.design import Design, transfer_gate
from scalelab.planning.hparams import (
    HPSweep,
    HyperParams,
    deepseek_hparams,
    fixed_hparams,
    recipe_hparams,
    table_hparams,
    transfer_hparams,
)
from scalelab.planning.loss_model import LossModel
from scalelab.planning.plan_layout import LayoutChoice, gpu_overrides, held_layout, layout_choice
from scalelab.planning.whatif import WhatIf, default_sizes, scale_what_ifs

SHAPE_FACTORS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6)  # targets around N* the shape rule is asked for
NEIGHBOURS = 2  # shapes kept on each side of N*
SOLVE_TOL = 0.005  # |log(wall / target)| at which the budget for a time is solved
SOLVE_ITERS = 8


@dataclass(kw_only=True, slots=True)
class HPChoice:
    """Where the plan's LR and batch come from (planning.hparams): a family's recipe table, an HP sweep."""

    table: Any = None  # polars frame of read_hp_table
    table_source: str = ""
    sweep: HPSweep | None = None


@dataclass(kw_only=True, slots=True)
class ShapeChoice:
    num_layers: int
    d_model: int
    params: int
    tokens: float  # C / 6N
    loss: float  # the law's point
    cost: float  # loss / L*(C) - 1
    shape: dict[str, Any]  # the model fields


@dataclass(kw_only=True, slots=True)
class Cost:
    steps: int
    wall_s: float
    wall_band_s: tuple[float, float]
    gpu_hours: float
    gpu_hours_band: tuple[float, float]
    band: dict[str, Any]  # the planner's error band (planning.cluster.PlannerBand)


@dataclass(kw_only=True, slots=True)
class Sensitivity:
    what: str
    loss: float | None
    change: float | None  # relative to the plan's point loss


@dataclass(kw_only=True)
class RunPlan:
    flops: float
    flops_note: str
    law: str
    fit_source: str
    fit_max_flops: float
    fit_warnings: list[str]
    level: float
    optimum: dict[str, Any]
    shapes: list[ShapeChoice]
    run: dict[str, Any]  # run_id, params, params_nonembed, tokens, flops_6n, model shape, tokens_per_step
    loss: PredictionInterval
    shifts: dict[str, float]  # log shifts of the point: rounding, batch change
    hparams: HyperParams
    schedule: dict[str, Any]
    layout: LayoutChoice
    cost: Cost
    cluster: dict[str, Any]
    sensitivity: list[Sensitivity]
    what_if: WhatIf | None
    frontier: dict[str, list[float]]  # flops, loss, lo, hi of L*(C) for the page
    points: dict[str, list[float]] | None  # the fit's runs (params, tokens, loss, budgets) when known
    config: dict[str, Any]  # the resolved run config tree
    spec: dict[str, Any]  # a one-point sweep spec of the run
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            elif isinstance(value, list) and value and hasattr(value[0], "__slots__"):
                value = [asdict(v) for v in value]
            elif hasattr(value, "__slots__") and not isinstance(value, dict):
                value = asdict(value)
            out[name] = value
        return out


def _pi_dict(pi: PredictionInterval) -> dict[str, Any]:
    return {"point": pi.point, "lo": pi.lo, "hi": pi.hi, "level": pi.level, "parts": dict(pi.parts)}


def shape_choices(model: LossModel, design: Design, n_opt: float, flops: float, l_opt: float) -> list[ShapeChoice]:
    """The shape rule's picks around N* (NEIGHBOURS on each side), each at D = C / 6N."""
    found: dict[tuple[int, int], ShapeChoice] = {}
    for f in SHAPE_FACTORS:
        try:
            shape = design.shape(n_opt * f)
        except UsageError:
            continue
        key = (shape["num_layers"], shape["d_model"])
        if key in found:
            continue
        n = num_params(ModelConfig(**shape))
        d = flops / (6.0 * n)
        loss = model.point(n, d)
        found[key] = ShapeChoice(
            num_layers=key[0], d_model=key[1], params=n, tokens=d, loss=loss, cost=loss / l_opt - 1, shape=shape
        )
    if not found:
        raise UsageError(f"the shape rule has no model near N*={n_opt:.3g} for vocab_size={design.vocab_size}")
    below = sorted((s for s in found.values() if s.params <= n_opt), key=lambda s: -s.params)[:NEIGHBOURS]
    above = sorted((s for s in found.values() if s.params > n_opt), key=lambda s: s.params)[:NEIGHBOURS]
    return sorted(below + above, key=lambda s: s.params)


def _fit_hparams(hp: HPChoice, params: float, nonembed_flops: float) -> HyperParams:
    """LR, batch and warmup for a design that sets them itself (a fit file's)."""
    if hp.table is not None:
        return table_hparams(hp.table, params=params, source=hp.table_source, sweep=hp.sweep)
    return deepseek_hparams(nonembedding_flops=nonembed_flops, sweep=hp.sweep)


def _design_hparams(design: Design, hp: HPChoice, config: dict[str, Any], params: float) -> HyperParams:
    """A sweep's own LR and batch for the resolved run (its recipe, or its base config)."""
    lr, batch = float(config["optim"]["lr"]), int(config["train"]["global_batch_tokens"])
    gate = transfer_gate(design)
    if gate is not None:
        return transfer_hparams(gate, lr=lr, batch_tokens=batch, sweep=hp.sweep)
    if design.recipe is not None:
        return recipe_hparams(lr=lr, batch_tokens=batch, params=params, recipe=design.recipe, sweep=hp.sweep)
    return fixed_hparams(
        lr=lr, batch_tokens=batch, source="the sweep's base config (as every run of it)", sweep=hp.sweep
    )


def _pow2_sequences(tokens: float, seq_len: int) -> int:
    return 1 << max(0, int(round(math.log2(max(tokens / seq_len, 1.0)))))


def _fit_overrides(hp: HyperParams, seq_len: int, tokens: float) -> tuple[dict[str, Any], int]:
    """(overrides, tokens per step) that a fit design's run takes from its hyperparameters."""
    batch = _pow2_sequences(hp.batch_tokens.value, seq_len) * seq_len
    steps = max(int(round(tokens / batch)), 1)
    warmup = hp.warmup_tokens if hp.warmup_tokens is not None else round(0.01 * steps) * batch
    warmup = max(batch, min(int(warmup), (steps - 1) * batch if steps > 1 else batch))
    over = {
        "optim.lr": float(f"{hp.lr.value:.4g}"),
        "train.global_batch_tokens": batch,
        "schedule.name": "cosine",
        "schedule.warmup_tokens": int(warmup),
    }
    return over, batch


def _loss(
    model: LossModel, n: float, d: float, flops: float, hp: HyperParams, shifts: dict[str, float]
) -> PredictionInterval:
    """The fit's interval at (N, D) for budget `flops` with the plan's parts: the LR's and batch's edge
    costs as log-sds (cost / z: a 95% half-width each), the point moved by `shifts` (log)."""
    fit = model.predict(n, d, flops)
    z = float(stats.norm.ppf(0.5 + fit.level / 2))
    parts = {k: v for k, v in fit.parts.items() if k != "decades"}
    for name, h in (("lr", hp.lr), ("batch", hp.batch_tokens)):
        cost = h.edge_cost()
        if cost is not None:
            parts[name] = cost / z
    out = interval_from_parts(fit.point * math.exp(sum(shifts.values())), parts, fit.level)
    if "decades" in fit.parts:
        out.parts["decades"] = fit.parts["decades"]
    return out


def _sensitivity(model: LossModel, n: float, d: float, point: float, hp: HyperParams) -> list[Sensitivity]:
    rows = []
    for label, f in (("N x1.5 (same C: D / 1.5)", 1.5), ("N / 1.5", 1 / 1.5), ("N x2", 2.0), ("N / 2", 0.5)):
        loss = model.point(n * f, d / f)
        rows.append(Sensitivity(what=label, loss=loss, change=loss / point - 1))
    loss = model.point(n, 0.8 * d)
    rows.append(Sensitivity(what="D cut by 20% (same N)", loss=loss, change=loss / point - 1))
    for name, h in (("LR", hp.lr), ("batch", hp.batch_tokens)):
        cost, r = h.edge_cost(), h.edge_ratio()
        what = f"{name} at the edge of its interval (x{r:.2f})" if r else f"{name} at the edge of its interval"
        rows.append(
            Sensitivity(
                what=what,
                loss=None if cost is None else point * math.exp(cost),
                change=None if cost is None else math.expm1(cost),
            )  # fmt: skip
        )
    return rows


def _frontier(model: LossModel, flops: float) -> dict[str, list[float]]:
    lo_c = min(getattr(model, "min_flops", model.max_flops), model.max_flops) / 2
    cs = np.geomspace(lo_c, flops * 3, 36)
    out: dict[str, list[float]] = {"flops": [], "loss": [], "lo": [], "hi": []}
    for c in cs:
        pi = model.optimum(float(c)).loss
        for k, v in (("flops", c), ("loss", pi.point), ("lo", pi.lo), ("hi", pi.hi)):
            out[k].append(float(v))
    return out


def _resolve(design: Design, hp_choice: HPChoice, shape: dict[str, Any], flops: float, extra: dict[str, Any]):
    """(RunSpec, HyperParams, tokens per step, the overrides) of the run at `shape` for budget `flops`."""
    cfg = ModelConfig(**shape)
    n = num_params(cfg)
    tokens = flops / (6.0 * n)
    labels = {"plan": True, "flops_budget": float(flops)}
    if design.raw is not None:  # a sweep: its recipe (or base) sets LR, batch and warmup
        run = design.resolve(shape, round(tokens), extra, labels)
        batch = int(run.config["train"]["global_batch_tokens"])
        return (
            run,
            _design_hparams(design, hp_choice, run.config, n),
            batch,
            design.overrides(shape, round(tokens), extra),
        )
    nonembed = flops_per_token(cfg, design.seq_len).six_n_nonembed * tokens
    hp = _fit_hparams(hp_choice, n, nonembed)
    over, batch = _fit_overrides(hp, design.seq_len, tokens)
    tokens = round(tokens / batch) * batch
    run = design.resolve(shape, tokens, {**over, **extra}, labels)
    return run, hp, batch, design.overrides(shape, tokens, {**over, **extra})


def _check_beyond_fit(model: LossModel, flops: float) -> None:
    if not (math.isfinite(flops) and flops > model.max_flops):
        raise UsageError(
            f"--flops {flops:.3g} is not above the largest budget the fit saw ({model.max_flops:.3g}): plan-run plans "
            "beyond a sweep; give a larger budget"
        )


def _note_batch_growth(
    hparams: HyperParams, batch: int, grown: int, notes: list[str], shifts: dict[str, float]
) -> None:
    """Say that the batch grew x`grown`, and add its loss cost to `shifts` where the batch law knows it."""
    k = hparams.batch_tokens.curvature
    notes.append(
        f"no layout holds {batch:,} tokens per step on this cluster: the batch is x{grown} ({batch * grown:,})"
    )
    if k is not None:
        shifts["batch change"] = k * math.log2(grown) ** 2
    else:
        notes.append("the loss cost of the larger batch is unknown (no batch sweep): not in the interval")


def _cost(steps: int, layout: LayoutChoice, cluster: Cluster) -> Cost:
    """Wall time and GPU-hours of `steps` steps of the layout, with the cluster's error band."""
    wall = steps * layout.step_time_s
    band = cluster.band
    return Cost(
        steps=steps,
        wall_s=wall,
        wall_band_s=(wall * band.lo, wall * band.hi),
        gpu_hours=wall * cluster.num_gpus / 3600,
        gpu_hours_band=(wall * band.lo * cluster.num_gpus / 3600, wall * band.hi * cluster.num_gpus / 3600),
        band=asdict(band),
    )


def _optimum_dict(opt) -> dict[str, Any]:
    return {
        "n": opt.n,
        "n_interval": list(opt.n_interval) if opt.n_interval else None,
        "d": opt.d,
        "d_interval": list(opt.d_interval) if opt.d_interval else None,
        "loss": _pi_dict(opt.loss),
        "beside": getattr(opt, "beside", ""),
    }


def _run_dict(run, cfg: ModelConfig, tokens_per_step: int, best: ShapeChoice) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "params": run.params,
        "params_nonembed": run.params_nonembed,
        "tokens": run.num_tokens,
        "flops_6n": run.flops_6n,
        "tokens_per_step": tokens_per_step,
        "num_layers": cfg.num_layers,
        "d_model": cfg.d_model,
        "num_heads": cfg.num_heads,
        "d_ff": cfg.d_ff,
        "chosen_shape": [best.num_layers, best.d_model],
    }


def plan_run(
    model: LossModel,
    design: Design,
    cluster: Cluster,
    *,
    flops: float,
    hp: HPChoice | None = None,
    what_if_sizes: list[int] | None = None,
    flops_note: str = "given",
) -> RunPlan:
    """The plan at `flops` (module docstring). what_if_sizes: None = the defaults (GPU clusters), [] = none.

    The steps of the module docstring in order, each feeding the next (the batch a layout needs
    changes the run, which changes its cost and its loss).
    """
    hp = hp or HPChoice()
    _check_beyond_fit(model, flops)
    opt = model.optimum(flops)
    shapes = shape_choices(model, design, opt.n, flops, opt.loss.point)
    best = min(shapes, key=lambda s: s.loss)
    shape = best.shape
    run, hparams, batch, over = _resolve(design, hp, shape, flops, {})
    cfg = ModelConfig(**run.config["model"])
    seq_len = int(run.config["data"]["seq_len"])
    notes = list(hparams.notes) + list(design.notes)
    shifts: dict[str, float] = {}
    p, grown = held_layout(cfg, cluster, design, seq_len=seq_len, batch=batch, run=run)
    if grown > 1 or not cluster.is_cpu:
        extra = {"train.global_batch_tokens": batch * grown} if grown > 1 else {}
        if not cluster.is_cpu:
            extra |= gpu_overrides(p)
        run, _, _, over = _resolve(design, hp, shape, flops, extra)
    if grown > 1:
        _note_batch_growth(hparams, batch, grown, notes, shifts)
    layout = layout_choice(p, cluster)
    tokens_per_step = int(run.config["train"]["global_batch_tokens"])
    cost = _cost(run.num_tokens // tokens_per_step, layout, cluster)
    loss = _loss(model, run.params, run.num_tokens, flops, hparams, shifts)
    shifts = {"rounding": math.log(model.point(run.params, run.num_tokens) / opt.loss.point), **shifts}
    what_if = None
    if not cluster.is_cpu and what_if_sizes != []:
        what_if = scale_what_ifs(cfg, seq_len=seq_len, batch_tokens=tokens_per_step, steps=cost.steps, cluster=cluster,
                                 sizes=what_if_sizes or default_sizes(cluster.num_gpus))  # fmt: skip
    return RunPlan(
        flops=flops,
        flops_note=flops_note,
        law=model.law,
        fit_source=model.source,
        fit_max_flops=model.max_flops,
        fit_warnings=list(model.warnings),
        level=model.level,
        optimum=_optimum_dict(opt),
        shapes=shapes,
        run=_run_dict(run, cfg, tokens_per_step, best),
        loss=loss,
        shifts=shifts,
        hparams=hparams,
        schedule=dict(run.config["schedule"]),
        layout=layout,
        cost=cost,
        cluster={"label": cluster.label, "gpu": cluster.gpu, "num_gpus": cluster.num_gpus},
        sensitivity=_sensitivity(model, run.params, run.num_tokens, loss.point, hparams),
        what_if=what_if,
        frontier=_frontier(model, flops),
        points=getattr(model, "points", None),
        config=run.config,
        spec=design.spec(over, {"plan": True, "flops_budget": float(flops)}),
        notes=notes,
    )


def plan_for_days(
    model: LossModel, design: Design, cluster: Cluster, *, days: float, hp: HPChoice | None = None,
    what_if_sizes: list[int] | None = None,
) -> RunPlan:  # fmt: skip
    """The plan whose wall time on `cluster` is `days`: C solved by fixed-point steps C <- C x (T / wall(C)).

    The wall time grows with C a little faster than linearly (a larger model, a longer run), so each
    step lands close; SOLVE_ITERS steps reach SOLVE_TOL on every case tried.
    """
    if not (math.isfinite(days) and days > 0):
        raise UsageError(f"--days {days} must be a positive number")
    target = days * 86400.0
    # the first guess: the cluster at 40% of its peak (this CPU: at its fitted rate)
    rate = cluster.hw.peak_flops * cluster.num_gpus * (1.0 if cluster.is_cpu else 0.4)
    flops = max(rate * target, model.max_flops * 1.01)
    for _ in range(SOLVE_ITERS):
        plan = plan_run(model, design, cluster, flops=flops, hp=hp, what_if_sizes=[])
        ratio = target / plan.cost.wall_s
        if abs(math.log(ratio)) < SOLVE_TOL:
            break
        flops *= ratio
    note = f"solved: {cluster.num_gpus} x {cluster.gpu} for {days:g} days"
    return plan_run(model, design, cluster, flops=flops, hp=hp, what_if_sizes=what_if_sizes, flops_note=note)
