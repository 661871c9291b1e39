"""The `study:` section of a sweep spec: named arms (config overrides) crossed with one design.

    study:
      arms:                          # name -> dotted config overrides; {} is the base as it is
        swiglu: {}
        gelu: {model.mlp: gelu}
      baseline: swiglu               # A of the compute multiplier (default: the first arm)
      target_flops: 2e13             # where the winner and the gap are predicted (default:
                                     # fit.target_flops, else 10x the largest budget)
      estimator: paired              # the verdict's gap: paired (default) | separate (each arm's own law)
      decisive: {sizes: 3, seeds: 2} # the matched decisive measurement at the target (the defaults)

Every run the generator makes (with its axes, data axes and seeds) is made once per arm: the
arm's overrides are applied to the base before the generator sizes the runs (so a key the shape
rule reads, `model.mlp`, `model.tied_embeddings`, shapes that arm's runs), and again as the run's
own overrides (so an arm's `optim.lr` replaces the recipe's per-size LR, as a point's does). Each
run carries the label `arm: NAME`; the arm is not part of the run's config, so an arm equal to
another sweep's base config links that sweep's finished runs instead of training them again.

`estimator` names what the verdict rests on (scalelab.sweeps.studies.study_fit): `paired`, the gap modelled
directly on the arms' matched design points, or `separate`, each arm's own law. `decisive` is the
matched decisive measurement at the target (scalelab.sweeps.studies.study_decisive): both arms at `sizes`
sizes around N* (a factor 2 apart), each with `seeds` training seeds.

Refused before anything runs (ConfigError naming the key, exit 2 at the CLI): fewer than two
arms; an override that is not a dotted key of model, data, optim, schedule or train (a `recipe.` key:
the recipe is the design's; eval, logging, tags ...: they do not change what a run computes); an arm
that differs in a key the design sets (the sizes and token counts of the generator, the recipe's
batch and warmup, a key an axis or `seeds` sweeps); an arm that changes nothing (its runs are
another arm's); a baseline that is not an arm; a target at or below the largest budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from scalelab.errors import ConfigError
from scalelab.sweeps.specs.spec_checks import check_keys, number

STUDY_KEYS = ("arms", "baseline", "target_flops", "estimator", "decisive")
ESTIMATORS = ("paired", "separate")
DECISIVE_KEYS = ("sizes", "seeds")
MAX_DECISIVE_SIZES = 5
MAX_DECISIVE_SEEDS = 8
ARM_LABEL = "arm"  # the run label (and runs-table column) that names a run's arm
# The sections whose keys change what a run computes; eval, checkpoint, logging, parallel, profile
# and tags change how it is measured, saved, logged or laid out (the same numbers).
ARM_SECTIONS = ("model", "data", "optim", "schedule", "train")
ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
DEFAULT_TARGET_FACTOR = 10.0  # target = this x the largest budget when neither the study nor fit.target_flops says

# Keys a generator sets for every run (sizes by the shape rule, the token count), and the generators
# that set them (the audit: its cells' sizes and horizons, scalelab.sweeps.recipes.audit_grid).
SIZED_GENERATORS = ("isoflop", "ladder", "points", "audit")
SIZE_KEYS = (
    "model.num_layers",
    "model.d_model",
    "model.num_heads",
    "model.num_kv_heads",
    "model.d_ff",
    "model.vocab_size",
    "model.target_params",
    "model.preset",
    "train.num_tokens",
)
# Keys the small-scale recipe sets for every run (scalelab.sweeps.recipes.recipe.RunRecipe.overrides); optim.lr
# is not among them: an arm that sets it replaces the per-size LR rule, which is a hyperparameter arm.
RECIPE_KEYS = ("train.global_batch_tokens", "train.micro_batch_sequences", "schedule.warmup_tokens")


@dataclass(kw_only=True, slots=True)
class StudySpec:
    arms: dict[str, dict[str, Any]]  # name -> dotted overrides, in the spec's order
    baseline: str  # A of the multiplier m = C_A(L*_B) / C
    target_flops: float  # where the predicted winner and gap are checked; > every design budget
    design_keys: tuple[str, ...] = field(default_factory=tuple)  # keys the design sets (refused in an arm)
    estimator: str = "paired"  # the verdict's gap: paired | separate
    decisive_sizes: int = 3  # the matched decisive measurement: sizes around N* ...
    decisive_seeds: int = 2  # ... each with this many training seeds

    @property
    def names(self) -> list[str]:
        return list(self.arms)

    @property
    def others(self) -> list[str]:
        """The arms compared against the baseline, in the spec's order."""
        return [a for a in self.arms if a != self.baseline]


def design_keys(raw: dict[str, Any], generator: str) -> tuple[str, ...]:
    """The config keys the spec's design sets for every run: no arm may set them."""
    keys = list(SIZE_KEYS) if generator in SIZED_GENERATORS else []
    if raw.get("recipe") is not None:
        keys += RECIPE_KEYS
    section = raw.get(generator)
    if generator == "audit" and isinstance(section, dict):  # each cell's LR, and what its sections vary
        keys += ["optim.lr", *(f"optim.{k}" for k in ("weight_decay", "beta2") if k in section)]
    if generator == "grid" and isinstance(section, dict):
        keys += list(section)
    if generator == "random" and isinstance(section, dict) and isinstance(section.get("params"), dict):
        keys += list(section["params"])
    if isinstance(raw.get("axes"), dict):
        keys += list(raw["axes"])
    data = raw.get("data")
    if isinstance(data, dict):
        if "num_tokens" in data:
            keys.append("train.num_tokens")
        if "mixtures" in data:
            keys.append("data.sources")
        if "epochs" in data:
            keys += ["train.num_tokens", "data.sources"]
    if raw.get("seeds") is not None:
        keys += ["train.seed", "train.data_seed"]
    return tuple(dict.fromkeys(keys))


def _collides(key: str, design: tuple[str, ...]) -> str | None:
    """The design key `key` sets or sits under (data.sources.0.weight under data.sources), if any."""
    for d in design:
        if key == d or key.startswith(d + ".") or d.startswith(key + "."):
            return d
    return None


def parse_study(
    section: Any, raw: dict[str, Any], generator: str, budgets: list[float], fit_target: float | None = None
) -> StudySpec:
    """The study section, checked against the spec it sits in (module docstring).

    Args:
        section: raw["study"].
        raw: the whole spec (its generator, axes, recipe and fit decide the design's keys and the
            default target).
        generator: the spec's generator.
        budgets: the design's FLOP budgets (empty when the generator has none).
        fit_target: the spec's fit.target_flops (its checked `fit:` section), the default target.
    Raises:
        ConfigError: naming `study.<key>` and the fix.
    """
    check_keys(section, STUDY_KEYS, "study")
    arms_raw = section.get("arms")
    if not isinstance(arms_raw, dict) or len(arms_raw) < 2:
        raise ConfigError(
            "study.arms", f"a study compares 2 or more named arms, got {arms_raw!r}", "e.g. {base: {}, b: {k: v}}"
        )
    design = design_keys(raw, generator)
    arms: dict[str, dict[str, Any]] = {}
    for name, overrides in arms_raw.items():
        key = f"study.arms.{name}"
        if not isinstance(name, str) or not ARM_NAME.match(name):
            raise ConfigError(key, f"{name!r} is not an arm name", "letters, digits and _ . + - (e.g. gelu)")
        overrides = overrides or {}
        if not isinstance(overrides, dict):
            raise ConfigError(key, f"expected a mapping of config keys to values, got {overrides!r}", "e.g. {k: v}")
        for k in overrides:
            where = f"{key}.{k}"
            section_name = str(k).split(".")[0]
            if section_name == "recipe":
                raise ConfigError(
                    where, "an arm is a config change; the recipe is the design's", "set the config keys it would set"
                )
            if section_name not in ARM_SECTIONS or "." not in str(k):
                raise ConfigError(
                    where,
                    "not a dotted key of a section that changes what a run computes",
                    f"e.g. model.mlp (sections: {', '.join(ARM_SECTIONS)})",
                )
            clash = _collides(str(k), design)
            if clash is not None:
                raise ConfigError(
                    where,
                    f"the design sets {clash} for every run (arms must differ in what the design keeps fixed)",
                    "change something else, or make it a design axis instead of an arm",
                )
        arms[name] = dict(overrides)
    baseline = section.get("baseline", next(iter(arms)))
    if baseline not in arms:
        raise ConfigError("study.baseline", f"{baseline!r} is not an arm", f"use one of {list(arms)}")
    target = _target(section.get("target_flops"), fit_target, budgets)
    estimator = section.get("estimator", "paired")
    if estimator not in ESTIMATORS:
        raise ConfigError("study.estimator", f"{estimator!r} is not an estimator", f"use one of {list(ESTIMATORS)}")
    sizes, seeds = _decisive(section.get("decisive"))
    return StudySpec(
        arms=arms,
        baseline=baseline,
        target_flops=float(target),
        design_keys=design,
        estimator=estimator,
        decisive_sizes=sizes,
        decisive_seeds=seeds,
    )


def _target(given: Any, fit_target: float | None, budgets: list[float]) -> float:
    """study.target_flops, else fit.target_flops, else 10x the largest budget; beyond the largest."""
    largest = max(budgets) if budgets else None
    if given is not None:
        target = number(given, "study.target_flops")
    elif fit_target:
        target = fit_target
    elif largest is not None:
        target = DEFAULT_TARGET_FACTOR * largest
    else:
        raise ConfigError("study.target_flops", "the design has no FLOP budgets to default from", "give it, e.g. 2e13")
    if largest is not None and target <= largest:
        raise ConfigError(
            "study.target_flops",
            f"{target:.3g} is not beyond the largest budget {largest:.3g}: nothing is extrapolated",
            f"use a larger target, e.g. {DEFAULT_TARGET_FACTOR * largest:.3g}",
        )
    return float(target)


def _decisive(section: Any) -> tuple[int, int]:
    """(sizes, seeds) of the matched decisive measurement: `study.decisive`, checked."""
    if section is None:
        return 3, 2
    check_keys(section, DECISIVE_KEYS, "study.decisive")
    out = []
    for name, default, most in (("sizes", 3, MAX_DECISIVE_SIZES), ("seeds", 2, MAX_DECISIVE_SEEDS)):
        value = section.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
            raise ConfigError(
                f"study.decisive.{name}", f"{value!r} is not a whole number from 1 to {most}", f"e.g. {default}"
            )
        out.append(value)
    return out[0], out[1]


def check_arm_runs(study: StudySpec, run_ids: dict[str, list[str]]) -> None:
    """Refuse an arm that changes nothing: one whose runs (all, or some) are another arm's.

    Args:
        run_ids: arm -> the run ids it expanded to, in order.
    """
    owner: dict[str, str] = {}
    for arm, ids in run_ids.items():
        for rid in ids:
            other = owner.get(rid)
            if other is not None and other != arm:
                same = set(run_ids[other]) == set(ids)
                what = "resolves to the same runs as" if same else f"shares run {rid} with"
                raise ConfigError(
                    f"study.arms.{arm}",
                    f"{what} arm {other!r}: it changes nothing the runs compute",
                    "change a key that reaches the run (model, data, optim, schedule, train)",
                )
            owner[rid] = arm
