"""How a planned (N, D) becomes a concrete model and a run config `scalelab run` (or a sweep) trains.

    design = sweep_design("results/iso")          # the sweep's base config, recipe and shape rule
    design = fit_design(vocab_size=50304, seq_len=2048, base=None)   # a fit file: the defaults
    design.shape(1.2e6)                            # model fields by the shape rule
    run = design.resolve(shape, tokens, overrides={...})   # RunSpec: config tree, run id, N, D, C
    design.spec(run_overrides)                     # a one-point sweep spec of the same run

A sweep's planned run is built exactly as its own runs were: its base config, the shape rule with
its recipe's shape options, and its recipe's batch, whole-step length, warmup and LR (so the run id
is the one `sweep launch` of the written spec trains, into the same store). A fit file has no base:
the run config's defaults (or `--base CONFIG.yaml`) with the given vocabulary and sequence length,
and the plan sets the LR, batch, warmup, length and parallel layout itself.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalelab import store
from scalelab.config_tree import load_yaml, set_in_dict, to_dict
from scalelab.errors import UsageError
from scalelab.models.shapes import shape_for_params
from scalelab.sweeps.recipes.recipe import Recipe
from scalelab.sweeps.specs.design_context import SHAPE_KEYS, DesignContext
from scalelab.sweeps.specs.runspec import RunSpec, run_spec_from_tree
from scalelab.sweeps.specs.spec import expand_sweep, read_spec
from scalelab.train.config import merge_defaults


@dataclass(kw_only=True)
class Design:
    name: str
    base: dict[str, Any]  # the base run config tree
    vocab_size: int
    seq_len: int
    recipe: Recipe | None
    raw: dict[str, Any] | None = None  # the sweep's spec (None for a fit file)
    path: Path | None = None  # the sweep directory
    notes: tuple[str, ...] = ()  # what the plan should tell about the design
    _ctx: DesignContext | None = None

    def shape(self, target_params: float, exclude: frozenset = frozenset()) -> dict[str, Any]:
        """Model fields of the shape rule's pick for `target_params` (a sweep: with its recipe's options)."""
        if self._ctx is not None:
            return self._ctx.shape(target_params, "plan", exclude=exclude)
        cfg = shape_for_params(
            target_params, vocab_size=self.vocab_size, max_seq_len=self.seq_len, exclude=exclude, **self._model_extra()
        )
        return {k: v for k, v in to_dict(cfg).items() if k in (*SHAPE_KEYS, "vocab_size", "max_seq_len")}

    def _model_extra(self) -> dict[str, Any]:
        model = self.base.get("model") or {}
        return {k: model[k] for k in ("tied_embeddings", "qk_norm", "rope_theta", "norm_eps", "init_std") if k in model}

    def overrides(self, shape: dict[str, Any], tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
        return {**{f"model.{k}": v for k, v in shape.items()}, "train.num_tokens": int(tokens), **extra}

    def resolve(self, shape: dict[str, Any], tokens: int, extra: dict[str, Any], labels: dict[str, Any]) -> RunSpec:
        """The run as it will be launched (a sweep's recipe applied; its id hashed)."""
        over = self.overrides(shape, tokens, extra)
        if self.raw is not None:
            return expand_sweep(self.spec(over, labels), default_name=self.name).runs[0]
        tree = merge_defaults(copy.deepcopy(self.base))
        tree.setdefault("model", {}).pop("preset", None)
        for key, value in over.items():
            set_in_dict(tree, key.split("."), copy.deepcopy(value))
        return run_spec_from_tree(tree, labels)

    def spec(self, overrides: dict[str, Any], labels: dict[str, Any]) -> dict[str, Any]:
        """A one-point sweep spec of the planned run (`scalelab sweep launch` trains it into a store)."""
        out: dict[str, Any] = {"name": f"{self.name}-plan", "base": copy.deepcopy(self.base)}
        out["points"] = [{**overrides, "labels": dict(labels)}]
        for key in ("execution", "fit", "recipe"):
            if self.raw is not None and key in self.raw:
                out[key] = copy.deepcopy(self.raw[key])
        return out


def sweep_design(sweep_dir: str | Path) -> Design:
    """The design of a sweep directory (its sweep.yaml: base config and recipe)."""
    sweep_dir = Path(sweep_dir)
    path = store.SweepLayout(sweep_dir).spec
    if not path.is_file():
        raise UsageError(f"{sweep_dir} has no sweep.yaml; give a sweep directory (or a FIT.json with --vocab-size)")
    raw = read_spec(path)
    base = raw.get("base") or {}
    cpus = int((raw.get("execution") or {}).get("cpus_per_run", 1))
    ctx = DesignContext.from_base(base, cpus_per_run=cpus, recipe=raw.get("recipe"))
    return Design(
        name=str(raw.get("name") or sweep_dir.name),
        base=copy.deepcopy(ctx.base),
        vocab_size=ctx.vocab_size,
        seq_len=ctx.seq_len,
        recipe=ctx.recipe,
        raw=raw,
        path=sweep_dir,
        _ctx=ctx,
    )


def fit_design(*, vocab_size: int, seq_len: int, base: str | None = None, name: str = "plan") -> Design:
    """The design of a fit file: the run config defaults (or `base`'s tree), vocabulary and sequence length."""
    if vocab_size < 2 or seq_len < 1:
        raise UsageError(f"--vocab-size {vocab_size} and --seq-len {seq_len} must be positive")
    tree = load_yaml(base) if base else {}
    set_in_dict(tree, ["data", "seq_len"], seq_len)
    set_in_dict(tree, ["model", "vocab_size"], vocab_size)
    notes = () if base else ("run.yaml's data section is the run config's default (this Python's stdlib): give --base "
                             "CONFIG.yaml with the corpus and tokenizer to train on",)  # fmt: skip
    return Design(name=name, base=tree, vocab_size=vocab_size, seq_len=seq_len, recipe=None, notes=notes)


def transfer_gate(design: Design):
    """The LR-transfer check of a µP / CompleteP sweep (scalelab.sweeps.recipes.transfer.GateResult), or None when
    the sweep has no `transfer:` section or its check's runs are not in the store."""
    if design.raw is None or design.path is None or not (design.raw.get("transfer") or {}).get("check"):
        return None
    # start-up time: the transfer check loads fitting.hp_laws.hyperparams (statsmodels, ~1 s); only µP sweeps need it
    from scalelab.sweeps.recipes.transfer import evaluate_gate, plan_transfer, transfer_dir

    check = plan_transfer(design.raw, expand_sweep(design.raw, default_name=design.name))
    where = transfer_dir(design.path)
    if check is None or not where.is_dir():
        return None
    runs = store.load_runs(where)
    if runs.is_empty():
        return None
    return evaluate_gate(check, runs)
