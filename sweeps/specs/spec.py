"""Sweep specs: a YAML file -> a validated list of runs, each addressed by the hash of its config.

A spec is a base run config (the same tree `scalelab run` reads) plus exactly one generator:

    name: isoflop-tiny
    base: {model: {max_seq_len: 64}, data: {seq_len: 64}, train: {global_batch_tokens: 1024}}
    isoflop:                          # FLOP budgets x log-spaced sizes; D from C = 6 N D
      budgets: [3e10, 1e11, 3e11]
      num_sizes: 4
      tokens_per_param: [4, 64]       # sizes span D/N in this range at every budget (or params: [lo, hi])
      flops: 6n                       # 6n | exact (attention included, scalelab.models.accounting)
      tolerance: 0.05                 # |C_run / budget - 1| allowed after rounding to whole steps
    seeds: 2                          # optional: K repeats (train.seed = base seed + k); sweeps/specs/seeds.py:
                                      #   {count: 2, vary: init | data | both, distinct: true}
    axes: {optim.lr: [1e-3, 3e-3]}    # optional: crossed with every generated run (any config key)
    data: {mixtures: [{web: 0.7, code: 0.3}], num_tokens: [...], epochs: [1, 2, 4], unique_tokens: 1e6}
    cooldowns: {fractions: [0.25, 0.5]}   # optional, WSD only: decay branches off each run
    early_stop: {tolerance: 0.01}         # optional: stop runs whose loss is known (sweeps/tracking/early_stop.py)
    wandb: {group: iso-v2, tags: [v2]}    # optional: W&B group, tags, live prediction (sweeps/tracking/wandb_runs.py)
    transfer: {check: true, widths: [32, 256], lrs: [...]}   # optional: LR-transfer gate (sweeps/recipes/transfer.py)
    recipe_gate: {audit: results/audit, max_cost: 0.005}   # optional: the recipe gate (sweeps/recipes/recipe_gate.py)
    execution: {max_concurrent: 2, max_failures: 2, cpus_per_run: 1, gpus_per_run: 0}
    fit: {law: chinchilla, loss: final_val_loss, target_flops: 1e12}

Generators: `grid` (mapping dotted key -> list; cartesian product), `isoflop` (above), `ladder`
(`sizes: [N...]`, `tokens_per_param: [20...]`: D = tpp x N), `random` (`num_samples`, `seed`,
`params: {key: {loguniform|uniform: [lo, hi]} | {choice: [...]}}`), `points` (an explicit list of
{dotted key: value} mappings; what `sweep next` writes) and `audit` (a recipe audit: sizes x token
horizons x LRs around the recipe's, weight decay, beta2 and depth at a few cells;
scalelab.sweeps.recipes.audit_grid, analysed by `scalelab sweep audit`). Sizes given as `model.target_params` or by a
generator go through the shape rule (scalelab.models.shapes).

Run identity: every run is fully resolved (`build_run_config`) and its id is `config_hash(cfg)`.
Design labels (generator, budget, tokens per parameter, seed index, branch point) are kept in
sweep.resolved.json, not in the config, so the same run reached from two sweeps has one id and is
trained once per store root (see scalelab.store).

Cooldowns (WSD-S, scalelab.sweeps.specs.cooldowns): each generated run becomes the long "stable" run of
its size, and decay branches of f x D tokens start from its checkpoints; a branch costs its tail.

Every problem raises ConfigError naming the key (`isoflop.budgets[0]`, `grid.optim.lr`) before Ray
starts; the CLI prints it as one line with exit code 2.
"""

from __future__ import annotations

import copy
import io
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scalelab.config_tree import from_dict, load_yaml, safe_yaml, set_in_dict, to_dict
from scalelab.errors import ConfigError, printable
from scalelab.fitting.entry.fit_options import FitOptions, fit_options
from scalelab.models.accounting import num_params
from scalelab.models.config import ModelConfig
from scalelab.store import files, objects
from scalelab.sweeps.recipes.audit_grid import audit_points
from scalelab.sweeps.recipes.recipe import recipe_for_run
from scalelab.sweeps.recipes.recipe_gate import parse_gate
from scalelab.sweeps.specs.cooldowns import expand_cooldowns
from scalelab.sweeps.specs.design_context import SHAPE_KEYS, DesignContext, Point
from scalelab.sweeps.specs.isoflop_grid import check_isoflop_tolerance, isoflop_points
from scalelab.sweeps.specs.runspec import RunSpec, run_spec_from_tree
from scalelab.sweeps.specs.seeds import seed_points
from scalelab.sweeps.specs.spec_checks import as_list, check_keys, number
from scalelab.sweeps.studies.study_spec import StudySpec, check_arm_runs, parse_study
from scalelab.sweeps.tracking.early_stop import parse_early_stop
from scalelab.sweeps.tracking.wandb_runs import parse_wandb_section
from scalelab.train.config import build_run_config, merge_defaults
from scalelab.train.data.config import SourceConfig

RECIPE_OPTIM = ("optim.lr", "optim.weight_decay", "optim.beta2")  # a point that sets one keeps it
GENERATORS = ("grid", "isoflop", "ladder", "random", "points", "audit")
TOP_KEYS = (
    "name",
    "description",
    "base",
    *GENERATORS,
    "axes",
    "data",
    "seeds",
    "cooldowns",
    "execution",
    "fit",
    "recipe",
    "early_stop",
    "transfer",  # the LR-transfer gate (scalelab.sweeps.recipes.transfer), read by `sweep plan/launch`
    "recipe_gate",  # the recipe gate (scalelab.sweeps.recipes.recipe_gate), read by `sweep plan/launch`
    "wandb",  # W&B group, tags and live prediction (scalelab.sweeps.tracking.wandb_runs), read back by the trials
    "study",  # arms crossed with the design (scalelab.sweeps.studies.study_spec)
)


@dataclass(kw_only=True, slots=True)
class ExecutionConfig:
    max_concurrent: int = 0  # concurrent runs; 0 = as many as the cluster's resources allow
    max_failures: int = 2  # retries per run; each retry resumes from the run's latest checkpoint
    cpus_per_run: int = 1  # CPUs per single-process run (also its torch threads)
    gpus_per_run: float = 0.0  # GPUs per single-process run (0 on CPU machines)
    # a multi-process run that loses workers (a node) continues at a smaller dp from its checkpoint,
    # same global batch through more accumulation (scalelab.train.elastic); False = waits for all
    elastic: bool = False
    hang_factor: float = 0.0  # a step slower than this x its run's median step is a hang: retried; 0 = off
    hang_min_s: float = 60.0  # ... and never one shorter than this (seconds)


@dataclass(kw_only=True, slots=True)
class Sweep:
    name: str
    raw: dict[str, Any]  # the spec as read
    generator: str
    runs: list[RunSpec]
    execution: ExecutionConfig
    fit: FitOptions  # the `fit:` section (scalelab.fitting.entry.fit_options.fit_options)
    warnings: list[str] = field(default_factory=list)
    study: StudySpec | None = None  # a study's arms, baseline and target (scalelab.sweeps.studies.study_spec)


# ---------------------------------------------------------------------------------------------
# Reading and checking
# ---------------------------------------------------------------------------------------------


def _dataclass_from(cls, data: Any, prefix: str):
    check_keys(data or {}, list(cls.__dataclass_fields__), prefix)
    return from_dict(cls, data or {}, prefix=prefix)


def read_spec(path: str | Path) -> dict[str, Any]:
    """The spec mapping from a YAML file (or an object of an s3:// store: a round's spec);
    ConfigError names the file on any problem."""
    if objects.is_url(path):
        text = files.read_text(path)
        if text is None:
            raise ConfigError(str(path), "config file not found", "check the path")
        try:
            data = safe_yaml(io.StringIO(text), str(path)) or {}
        except yaml.YAMLError:
            raise ConfigError(str(path), "invalid YAML", "fix the syntax") from None
        if not isinstance(data, dict):
            raise ConfigError(str(path), "the top level must be a mapping of sections", "see the README")
        return data
    return load_yaml(str(path))


def load_sweep(path: str | Path) -> Sweep:
    """Read and expand a spec file into a validated Sweep (nothing starts)."""
    raw = read_spec(path)
    return expand_sweep(raw, default_name=files.stem(path))


def _execution(section: Any) -> ExecutionConfig:
    """The spec's `execution:` section, checked."""
    execution = _dataclass_from(ExecutionConfig, section, "execution")
    if execution.cpus_per_run < 1 or execution.max_failures < 0 or execution.max_concurrent < 0:
        raise ConfigError("execution", "cpus_per_run >= 1, max_failures >= 0, max_concurrent >= 0", "fix the value")
    if execution.hang_factor and execution.hang_factor <= 1:
        raise ConfigError(
            "execution.hang_factor",
            f"{execution.hang_factor} is not a multiple of the median step above 1",
            "use 0 (no watchdog) or e.g. 10",
        )
    if execution.hang_min_s <= 0:
        raise ConfigError("execution.hang_min_s", f"{execution.hang_min_s} s is not positive", "use e.g. 60")
    return execution


def expand_sweep(raw: dict[str, Any], default_name: str = "sweep") -> Sweep:
    """Validate a spec mapping and expand it into resolved runs.

    Raises:
        ConfigError: naming the offending key (unknown keys and generators, a budget too small for
            the smallest size, a FLOP count outside the tolerance, a run config that fails).
    """
    check_keys(raw, TOP_KEYS, "")
    gen = spec_generator(raw)
    base = raw.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError("base", f"expected a run-config mapping, got {base!r}", "see examples/sweeps/")
    execution = _execution(raw.get("execution"))
    fit = fit_options(raw.get("fit") or {})
    parse_early_stop(raw.get("early_stop"))  # checked here; the trials read it back from the spec
    parse_wandb_section(raw.get("wandb"))  # the same
    parse_gate(raw.get("recipe_gate"))  # the section; its audit is read by `sweep plan` and `launch`
    study = None
    if raw.get("study") is not None:
        study = parse_study(raw["study"], raw, gen, spec_budgets(raw, gen), fit.target_flops)
    arms = study.arms if study is not None else {None: {}}
    warnings: list[str] = []
    runs: list[RunSpec] = []
    seen: set[str] = set()
    arm_ids: dict[str, list[str]] = {}
    for arm, arm_overrides in arms.items():
        arm_base = with_overrides(base, arm_overrides)  # the generator sizes the arm's own runs
        ctx = DesignContext.from_base(arm_base, cpus_per_run=execution.cpus_per_run, recipe=raw.get("recipe"))
        points = _GENERATOR_FNS[gen](raw[gen], ctx, gen)
        warnings += [w for w in ctx.warnings if w not in warnings]
        points = _cross(points, _axes(raw.get("axes"), "axes"))
        points = _cross(points, _data_axes(raw.get("data"), ctx, gen))
        points = seed_points(raw.get("seeds"), ctx, points)
        if arm is not None:
            points = _cross(points, [(arm_overrides, {"arm": arm})])
        where = f"study.arms.{arm}: {gen}" if arm is not None else gen
        arm_runs = []
        for i, (overrides, labels) in enumerate(points):
            run = _resolve(ctx, overrides, dict(labels, generator=gen), where=f"{where} run {i}")
            if arm is not None:
                arm_ids.setdefault(arm, []).append(run.run_id)
            if run.run_id in seen:
                warnings.append(f"{where} run {i} duplicates an earlier run ({run.run_id}); kept once")
                continue
            seen.add(run.run_id)
            arm_runs.append(run)
        if raw.get("cooldowns") is not None:
            arm_runs = expand_cooldowns(raw["cooldowns"], arm_runs)
        runs += arm_runs
    if study is not None:
        check_arm_runs(study, arm_ids)
    if gen == "isoflop":
        check_isoflop_tolerance(raw[gen], runs)
    name = str(raw.get("name") or default_name)
    if printable(name) != name:
        raise ConfigError("name", f"{printable(name)!r} holds control characters", "use letters, digits and -_.")
    return Sweep(
        name=name, raw=raw, generator=gen, runs=runs, execution=execution, fit=fit, warnings=warnings, study=study
    )


def spec_generator(raw: dict[str, Any]) -> str:
    """The one generator a spec names (GENERATORS: the registry, with _GENERATOR_FNS)."""
    gens = [g for g in GENERATORS if g in raw]
    if not gens:
        raise ConfigError("generator", "the spec names no generator", f"add one of: {', '.join(GENERATORS)}")
    if len(gens) > 1:
        raise ConfigError(gens[1], f"a spec has one generator, found {gens}", "split it into two specs")
    return gens[0]


def spec_budgets(raw: dict[str, Any], gen: str) -> list[float]:
    """The design's FLOP budgets (an IsoFLOP generator's; a points spec's labels), for the study's checks."""
    section = raw.get(gen)
    if gen == "isoflop" and isinstance(section, dict):
        given = as_list(section.get("budgets"), f"{gen}.budgets")
        return [number(v, f"{gen}.budgets[{i}]") for i, v in enumerate(given)]
    if gen == "points" and isinstance(section, list):
        return [float(p["labels"]["flops_budget"]) for p in section if (p.get("labels") or {}).get("flops_budget")]
    return []


def with_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The base run config with dotted overrides set (a study arm's)."""
    if not overrides:
        return base
    tree = copy.deepcopy(base)
    for key, value in overrides.items():
        if key.startswith("data.sources."):  # index into the default sources when the base has none
            tree.setdefault("data", {}).setdefault("sources", [to_dict(SourceConfig())])
        _set(tree, key, value)
    return tree


# ---------------------------------------------------------------------------------------------
# Resolution of one run
# ---------------------------------------------------------------------------------------------


def _set(tree: dict, dotted: str, value: Any) -> None:
    set_in_dict(tree, dotted.split("."), copy.deepcopy(value))


def _resolve(ctx: DesignContext, overrides: dict[str, Any], labels: dict[str, Any], where: str) -> RunSpec:
    # Defaults filled in first, so a point may index into sections the base left out
    # (data.sources.0.unique_tokens).
    tree = merge_defaults(copy.deepcopy(ctx.base))
    model = tree.setdefault("model", {})
    model_keys = {k.split(".")[1] for k in overrides if k.startswith("model.")}
    if "target_params" in model_keys or model_keys >= set(SHAPE_KEYS):
        model.pop("preset", None)  # the point picks the whole size; single shape keys edit the preset
    if model_keys >= set(SHAPE_KEYS):
        model.pop("target_params", None)
    for key, value in overrides.items():
        if key == "data.mixture":
            _apply_mixture(tree, value, key)
            continue
        _set(tree, key, value)
    try:
        if ctx.recipe is not None:
            _apply_recipe(ctx, tree, labels, keep=frozenset(k for k in RECIPE_OPTIM if k in overrides), where=where)
        return run_spec_from_tree(tree, labels)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e.key}", str(e).split(": ", 1)[-1]) from None


def _apply_recipe(ctx: DesignContext, tree: dict, labels: dict[str, Any], *, keep: frozenset[str], where: str) -> None:
    """Set batch, whole-step length, warmup, LR, weight decay and beta2 of a run by the spec's recipe
    (sweeps/recipes/recipe.py), but the optimizer keys in `keep`, which the point sets itself."""
    cfg = build_run_config(tree)
    n = num_params(cfg.model)
    target = float(cfg.train.num_tokens)
    budget = float(labels.get("flops_budget") or 6.0 * n * target)
    own_lr = cfg.optim.lr if "optim.lr" in keep else None
    plan = recipe_for_run(
        ctx.recipe, params=n, target_tokens=target, flops_budget=budget, seq_len=cfg.seq_len, where=where, lr=own_lr
    )
    for key, value in plan.overrides(keep=keep).items():
        _set(tree, key, value)


def _apply_mixture(tree: dict, mixture: dict[str, float], key: str) -> None:
    sources = tree.setdefault("data", {}).setdefault("sources", [{"name": "stdlib", "path": "default"}])
    names = [s.get("name", "stdlib") for s in sources]
    for name, weight in mixture.items():
        if name not in names:
            raise ConfigError(f"{key}.{name}", f"no data source named {name!r}", f"sources: {names}")
        sources[names.index(name)]["weight"] = number(weight, f"{key}.{name}")


# ---------------------------------------------------------------------------------------------
# Generators: each returns [(overrides {dotted key: value}, labels)]
# ---------------------------------------------------------------------------------------------


def _grid(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    if not isinstance(section, dict) or not section:
        raise ConfigError(
            key, "expected a mapping of config keys to value lists", "e.g. grid: {optim.lr: [1e-3, 3e-3]}"
        )
    axes = {k: as_list(v, f"{key}.{k}") for k, v in section.items()}
    return [
        (dict(zip(axes, combo)), {k.split(".")[-1]: v for k, v in zip(axes, combo) if not isinstance(v, dict | list)})
        for combo in itertools.product(*axes.values())
    ]


def _points(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    out = []
    for i, point in enumerate(as_list(section, key)):
        if not isinstance(point, dict):
            raise ConfigError(f"{key}[{i}]", "expected a mapping of config keys to values", "e.g. {optim.lr: 1e-3}")
        point = dict(point)
        labels = point.pop("labels", None) or {}
        out.append((point, dict(labels)))
    return out


def _random(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    check_keys(section, ("num_samples", "seed", "params"), key)
    n = int(number(section.get("num_samples"), f"{key}.num_samples"))
    rng = np.random.default_rng(int(section.get("seed", 0)))
    params = section.get("params")
    if not isinstance(params, dict) or not params:
        raise ConfigError(
            f"{key}.params",
            "expected a mapping of config keys to distributions",
            "e.g. {optim.lr: {loguniform: [1e-4, 1e-2]}}",
        )
    draws: dict[str, list] = {}
    for name, dist in params.items():
        k = f"{key}.params.{name}"
        if not isinstance(dist, dict) or len(dist) != 1:
            raise ConfigError(
                k,
                f"{dist!r} is not one distribution",
                "use {loguniform: [lo, hi]}, {uniform: [lo, hi]} or {choice: [...]}",
            )
        ((kind, arg),) = dist.items()
        if kind in ("loguniform", "uniform"):
            lo, hi = (
                number(v, f"{k}.{kind}", positive=kind == "loguniform")
                for v in as_list(arg, f"{k}.{kind}", min_len=2)[:2]
            )
            if hi <= lo:
                raise ConfigError(f"{k}.{kind}", f"[{lo}, {hi}] is empty", "give [low, high] with low < high")
            u = rng.uniform(size=n)
            vals = np.exp(np.log(lo) + u * (np.log(hi) - np.log(lo))) if kind == "loguniform" else lo + u * (hi - lo)
            draws[name] = [float(v) for v in vals]
        elif kind == "choice":
            options = as_list(arg, f"{k}.choice")
            draws[name] = [options[int(j)] for j in rng.integers(0, len(options), size=n)]
        else:
            raise ConfigError(f"{k}.{kind}", "unknown distribution", "use loguniform, uniform or choice")
    return [({name: draws[name][i] for name in draws}, {"sample": i}) for i in range(n)]


def _ladder(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    check_keys(section, ("sizes", "tokens_per_param"), key)
    sizes = [number(v, f"{key}.sizes[{i}]") for i, v in enumerate(as_list(section.get("sizes"), f"{key}.sizes"))]
    tpps = [
        number(v, f"{key}.tokens_per_param[{i}]")
        for i, v in enumerate(as_list(section.get("tokens_per_param"), f"{key}.tokens_per_param"))
    ]

    out = []
    for i, target in enumerate(sizes):
        shape = ctx.shape(target, f"{key}.sizes[{i}]")
        n = num_params(ModelConfig(**shape))
        for j, tpp in enumerate(tpps):
            tokens = ctx.round_tokens(tpp * n)
            if tokens < 1:
                raise ConfigError(
                    f"{key}.tokens_per_param[{j}]",
                    f"{tpp} x {n:,} params is less than one step ({ctx.tokens_per_step} tokens)",
                    "raise it or lower train.global_batch_tokens",
                )
            over = {f"model.{k}": v for k, v in shape.items()} | {"train.num_tokens": tokens}
            out.append((over, {"target_params": target, "tokens_per_param": tpp}))
    return out


_GENERATOR_FNS = {
    "grid": _grid,
    "isoflop": isoflop_points,
    "ladder": _ladder,
    "random": _random,
    "points": _points,
    "audit": audit_points,
}


# ---------------------------------------------------------------------------------------------
# Axes crossed with every generator: free config keys, data axes, seeds
# ---------------------------------------------------------------------------------------------


def _cross(points: list[Point], axis: list[Point]) -> list[Point]:
    if not axis:
        return points
    return [({**o1, **o2}, {**l1, **l2}) for o1, l1 in points for o2, l2 in axis]


def _axes(section: Any, key: str) -> list[Point]:
    if section is None:
        return []
    return [(o, {k.split(".")[-1]: v for k, v in o.items()}) for o, _ in _grid(section, None, key)]


def _data_axes(section: Any, ctx: DesignContext, gen: str) -> list[Point]:
    if section is None:
        return []
    check_keys(section, ("num_tokens", "mixtures", "epochs", "unique_tokens"), "data")
    axes: list[list[Point]] = []
    if "num_tokens" in section:
        if gen in ("isoflop", "ladder"):
            raise ConfigError(
                "data.num_tokens",
                f"the {gen} generator sets the token count itself",
                "remove data.num_tokens",
            )
        vals = [
            int(number(v, f"data.num_tokens[{i}]"))
            for i, v in enumerate(as_list(section["num_tokens"], "data.num_tokens"))
        ]
        axes.append([({"train.num_tokens": v}, {"num_tokens": v}) for v in vals])
    if "mixtures" in section:
        mixes = as_list(section["mixtures"], "data.mixtures")
        for i, m in enumerate(mixes):
            if not isinstance(m, dict) or not m:
                raise ConfigError(f"data.mixtures[{i}]", "expected {source name: weight}", "e.g. {web: 0.7, code: 0.3}")
        axes.append([({"data.mixture": m}, {"mixture": ",".join(f"{k}={v}" for k, v in m.items())}) for m in mixes])
    if "epochs" in section:
        if "unique_tokens" not in SourceConfig.__dataclass_fields__:
            raise ConfigError(
                "data.epochs",
                "repeated-epoch runs need a unique-token cap on data sources, "
                "which this build's data layer (data.sources[i]) does not have",
                "point a source at a corpus of the unique size and vary train.num_tokens",
            )
        unique = int(number(section.get("unique_tokens"), "data.unique_tokens"))
        epochs = [number(v, f"data.epochs[{i}]") for i, v in enumerate(as_list(section["epochs"], "data.epochs"))]
        axes.append(
            [
                (
                    {
                        "train.num_tokens": int(e * unique),
                        "data.sources.0.unique_tokens": unique,
                        "data.sources.0.max_epochs": e,
                    },
                    {"epochs": e, "unique_tokens": unique},
                )
                for e in epochs
            ]
        )
    points: list[Point] = [({}, {})]
    for axis in axes:
        points = _cross(points, axis)
    return points


def dump_spec(spec: dict[str, Any]) -> str:
    """YAML text of a spec mapping (stable key order as given)."""
    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=110)
