"""RunSpec: one resolved run of a sweep (its config tree, id, size and cost), built from a config tree.

run = run_spec_from_tree(tree, {"generator": "grid"})   # validated with build_run_config, hashed
cfg = same_run(run.config, run.run_id)                 # the RunConfig back (scalelab.train.identity)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scalelab.models.accounting import flops_per_token, num_params, num_params_nonembedding
from scalelab.train.config import build_run_config, to_dict
from scalelab.train.identity import config_hash


@dataclass(kw_only=True, slots=True)
class RunSpec:
    """One resolved run of a sweep."""

    run_id: str  # config_hash of the resolved config
    config: dict[str, Any]  # the resolved config tree (to_dict), what config.json holds
    labels: dict[str, Any]  # design labels: generator, flops_budget, tokens_per_param, seed, branch ...
    depends_on: str | None = None  # a cooldown branch waits for its stable run
    params: int
    params_nonembed: int
    num_tokens: int
    flops_6n: float
    flops_exact: float
    cost_flops: float  # FLOPs this run spends itself (a branch pays only for the steps after its start)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


def run_spec_from_tree(tree: dict[str, Any], labels: dict[str, Any]) -> RunSpec:
    """The RunSpec of a run config tree: validated (build_run_config), hashed, sized."""
    cfg = build_run_config(tree)
    fpt = flops_per_token(cfg.model, cfg.seq_len)
    num_tokens = cfg.num_steps * cfg.tokens_per_step
    return RunSpec(
        run_id=config_hash(cfg),
        config=to_dict(cfg),
        labels=labels,
        params=num_params(cfg.model),
        params_nonembed=num_params_nonembedding(cfg.model),
        num_tokens=num_tokens,
        flops_6n=fpt.six_n * num_tokens,
        flops_exact=fpt.exact * num_tokens,
        cost_flops=fpt.six_n * num_tokens,
    )
