"""Expert parallel (and its composition with FSDP and TP) vs one device on CPU/gloo.

One spawned process group per world size runs every layout of that size through `parallelize`:
loss per step, router statistics (tokens per expert, aux loss), the first step's expert, router and
shared-expert gradients and all final parameters must match the single-device run within 1e-5
(SGD, fp32), and the routed counts exactly. Layouts: ep2, ep2 with capacity factor, MoE under TP
alone (ep1xtp2-sp), ep4, fsdp4xep2 (experts FSDP-sharded over 2), 2 experts sharded on dim 1,
ep2xtp2 with and without sequence parallel (experts split over ep and over tp by hidden width),
dp2xep2 (HSDP: expert shards all-reduced across the 2 replicas).
~30-60 s in total on a loaded 2-core machine.
"""

from __future__ import annotations

import pytest
import torch

from scalelab.errors import UsageError
from scalelab.parallel.ep_parity import EPLayout, EPSpec, ep_parity, parse_ep_layout


def _check(rows):
    for row in rows:
        assert row["router_counts_equal"], row
        assert row["max_loss_diff"] <= 1e-5, row
        assert row["max_aux_diff"] <= 1e-5, row
        assert row["max_expert_grad_diff"] <= 1e-5, row
        # relative too: the gradients are ~1e-4, so a wrong 1/ep scale could hide under 1e-5 alone
        assert row["max_expert_grad_diff"] <= 1e-3 * row["expert_grad_scale"], row
        assert row["max_param_diff"] <= 1e-5, row
        assert row["memory_ok"], row  # planner state bytes == what rank 0 holds
        assert row["ok"], row


def test_ep_world2_matches_single_device():
    torch.set_num_threads(1)
    _check(ep_parity(["ep2", "ep2-cf", "ep1xtp2-sp"], EPSpec()))


def test_ep_world4_and_fsdp_composition_match_single_device():
    torch.set_num_threads(1)
    _check(ep_parity(["ep4", "fsdp4xep2", "fsdp4xep2-e2", "ep2xtp2", "ep2xtp2-sp", "dp2xep2"], EPSpec()))


def test_layout_names():
    assert parse_ep_layout("ep2") == EPLayout(dp_shard=2, ep=2)
    assert parse_ep_layout("fsdp4xep2-grouped") == EPLayout(dp_shard=4, ep=2, option="grouped")
    lay = parse_ep_layout("fsdp2xep2xtp2-sp-cf")
    assert lay == EPLayout(dp_shard=2, ep=2, tp=2, sp=True, option="cf") and lay.world_size == 4
    for bad in ("ep1", "fsdp3xep2", "ep2-fast", "tp2", "ep2-sp", "ep1xtp1"):
        with pytest.raises(UsageError):
            parse_ep_layout(bad)


def test_parity_command_checks_ep_layout_names_first(capsys):
    from scalelab.cli.main import main

    assert main(["parity", "--layouts", "single,ep1"]) == 2  # before any process starts
    assert "ep must be >= 2" in capsys.readouterr().err
