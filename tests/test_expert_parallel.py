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


def _zero_rows_worker(out_dir: str) -> None:
    """Rank 1's experts receive no rows: backward must still run the same all_to_alls on both ranks.

    float64: the exchange is claimed exact, so only summation order may differ from the loop
    reference (~1e-14 here); in fp32 that rounding (~3e-6 on values ~8) sat within 2.4x of the old
    1e-6 tolerance on one CPU and depends on the CPU's matmul kernels."""
    import torch.distributed as dist

    from scalelab.models.moe import GroupedExperts, grouped_swiglu
    from scalelab.parallel.dims import ParallelDims
    from scalelab.parallel.expert_parallel import ShardedExperts

    torch.manual_seed(0)
    full = GroupedExperts(num_experts=4, d_model=8, d_ff=16).double()
    for w in full.parameters():
        torch.nn.init.normal_(w, std=0.3)
    dims = ParallelDims(dp_shard=2, ep=2)
    dims.build_mesh("cpu")
    emesh = dims.ep_mesh
    experts = ShardedExperts(full, emesh["ep"])
    rank = dist.get_rank()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank + 1), dtype=torch.float64, requires_grad=True)
    counts = [3, 3, 0, 0]  # experts 2, 3 (rank 1's) get nothing from either rank
    experts(x, counts).pow(2).sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    ref_w = [w.detach().clone().requires_grad_(True) for w in (full.w1, full.w2, full.w3)]
    grouped_swiglu(ref_x, counts, *ref_w, "loop").pow(2).sum().backward()
    grads = {n: getattr(experts, n).grad.full_tensor() for n in ("w1", "w2", "w3")}  # 1/ep of the sum
    torch.save({"x": (x.grad, ref_x.grad), "w": (grads, [w.grad for w in ref_w])}, f"{out_dir}/rank{rank}.pt")


def test_ep_rank_without_rows_runs_backward_collectives(tmp_path):
    """Regression: with no rows the experts used to return a fresh zeros tensor, so that rank skipped
    the dispatch all_to_all in backward and the other rank waited forever (seen at pipeline start-up,
    whose shape inference runs on uninitialised inputs, and possible under extreme imbalance)."""
    from scalelab.parallel.backend import spawn

    torch.set_num_threads(1)
    spawn(_zero_rows_worker, 2, (str(tmp_path),), backend="gloo")
    res = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for r in res:
        got, ref = r["x"]
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    grads = res[0]["w"][0]
    for k, name in enumerate(("w1", "w2", "w3")):
        expected = (res[0]["w"][1][k] + res[1]["w"][1][k]) / 2  # each rank's tokens, scaled by 1/ep
        torch.testing.assert_close(grads[name], expected, rtol=1e-12, atol=1e-12, msg=name)
        assert float(grads[name][2:].abs().max()) == 0.0  # rank 1's experts saw no rows: zero, not None
