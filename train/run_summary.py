"""The static facts of a run config (sizes, FLOPs) that a run's status.json keeps beside its losses.

from scalelab.train.run_summary import run_summary_fields
status_fields = run_summary_fields(cfg)   # params, params_nonembed, flops_per_token_*, num_steps, ...
"""

from __future__ import annotations

from typing import Any

from scalelab.models.accounting import flops_per_token, num_params, num_params_nonembedding


def run_summary_fields(cfg) -> dict[str, Any]:
    """Static facts about a run config (sizes, FLOPs) that the store keeps beside its losses."""
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    return dict(
        params=num_params(cfg.model),
        params_nonembed=num_params_nonembedding(cfg.model),
        flops_per_token_6n=fpt.six_n,
        # exact: every matmul (output layer included) plus causal attention (half the T x T scores)
        flops_per_token_exact=fpt.exact_causal,
        num_steps=cfg.num_steps,
        tokens_per_step=cfg.tokens_per_step,
        num_tokens=cfg.num_steps * cfg.tokens_per_step,
    )
