"""Router load balance of a small MoE trained on one device, with and without the auxiliary loss.

    off, on = aux_balance_run(0.0), aux_balance_run(0.1)
    off["imbalance_last10"] > on["imbalance_last10"]       # the aux loss keeps the experts balanced

`experiments/moe_aux_loss.py` prints the table over aux weights and capacity factors; the MoE tests use it.
It lives in experiments/ (it was scalelab.train.moe_balance) because no product code trains this way:
it is the experiment's measurement, which tests/test_moe.py also checks, and experiments is a package
both import without path tricks.
"""

from __future__ import annotations

import torch

from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.models.moe import summarize_stats
from scalelab.models.presets import get_preset


def aux_balance_run(
    aux_weight: float, steps: int = 40, seed: int = 0, lr: float = 3e-3, capacity_factor: float = 0.0
) -> dict[str, float]:
    """Train a small MoE (`moe-debug` at d_model 32: 8 experts of width 32, top-2, no shared expert)
    on random tokens with AdamW and
    the given load-balancing weight; returns the router imbalance (max/mean tokens per expert,
    mean over layers) at the first step and averaged over the last 10 steps, plus the aux loss.
    Without the aux loss the routers drift towards a few experts; with it they stay balanced."""
    cfg = get_preset(
        "moe-debug",
        vocab_size=128,
        d_model=32,
        d_ff=64,
        moe_d_ff=32,
        max_seq_len=64,
        kernels="torch",
        router_aux_loss_weight=aux_weight,
        router_z_loss_weight=0.0,
        num_shared_experts=0,
        capacity_factor=capacity_factor,
    )
    model = build_model(cfg, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed + 1)
    rows = []
    for _ in range(steps):
        batch = torch.randint(0, cfg.vocab_size, (16, 17), generator=gen)
        loss, _ = lm_loss(model, batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        rows.append(summarize_stats(model.moe_stats()))
    tail = rows[-10:]
    return {
        "aux_weight": aux_weight,
        "imbalance_first": rows[0]["moe_imbalance"],
        "imbalance_last10": sum(r["moe_imbalance"] for r in tail) / len(tail),
        "aux_loss_last10": sum(r["moe_aux_loss"] for r in tail) / len(tail),
        "dropped_frac_last10": sum(r["moe_dropped_frac"] for r in tail) / len(tail),
    }
