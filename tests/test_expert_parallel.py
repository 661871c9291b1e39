"""Expert parallel vs one device on CPU/gloo (scalelab.parallel.expert_parallel).

One spawned process group per world size runs every layout of that size: loss per step, router
statistics (tokens per expert, aux loss), the first step's expert and router gradients and all
final parameters must match the single-device run within 1e-5 (SGD, fp32), and the routed counts
exactly. ~15-40 s in total on a loaded 2-core machine.
"""

from __future__ import annotations

import pytest
import torch

from scalelab.errors import UsageError
from scalelab.parallel.ep_parity import EPSpec, ep_parity, parse_ep_layout


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
    _check(ep_parity(["ep2", "ep2-cf"], EPSpec()))


def test_ep_world4_and_fsdp_composition_match_single_device():
    torch.set_num_threads(1)
    _check(ep_parity(["ep4", "fsdp4xep2", "fsdp4xep2-e2"], EPSpec()))


def test_layout_names():
    assert parse_ep_layout("ep2") == (2, 2, "")
    assert parse_ep_layout("fsdp4xep2-grouped") == (4, 2, "grouped")
    for bad in ("ep1", "fsdp3xep2", "ep2-fast", "tp2"):
        with pytest.raises(UsageError):
            parse_ep_layout(bad)


def test_parity_command_checks_ep_layout_names_first(capsys):
    from scalelab.cli.main import main

    assert main(["parity", "--layouts", "single,ep1"]) == 2  # before any process starts
    assert "ep must be >= 2" in capsys.readouterr().err
