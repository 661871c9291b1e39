"""The planner's communication model (scalelab.parallel.planner_time): alpha-beta collectives and overlap.

Each contract is stated with numbers a reader can check by hand: NCCL's ring step counts, the
collectives a layout issues per step, and which part of each axis's traffic the overlap model hides.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scalelab.models.presets import get_preset
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.planner import CostConstants, Hardware, estimate
from scalelab.parallel.planner_memory import layer_param_split
from scalelab.parallel.planner_time import axis_group, collective_latency, collective_time, step_communication

HW = Hardware()  # NCCL's latencies: 8.4 us per collective, 3.4 us per NVLink step, 14 us per network step
CONSTS = CostConstants(mfu=0.5, comm_efficiency=0.8, fsdp_overlap=0.9)


def test_ring_latency_counts_nccl_steps():
    # all-reduce over 8 GPUs of one node: 2(n-1) = 14 NVLink steps
    assert collective_latency("all_reduce", 8, 1, HW) == pytest.approx(8.4e-6 + 14 * 3.4e-6)
    # all-gather over 64 GPUs on 8 nodes: 63 steps, 7 of them cross the network
    assert collective_latency("all_gather", 64, 8, HW) == pytest.approx(8.4e-6 + 56 * 3.4e-6 + 7 * 14e-6)
    # all-reduce over 16 ranks one per node: 30 steps, 2 x 16 = 32 network crossings capped at 30
    assert collective_latency("all_reduce", 16, 16, HW) == pytest.approx(8.4e-6 + 30 * 14e-6)
    assert collective_latency("p2p", 2, 2, HW) == pytest.approx(8.4e-6 + 14e-6)
    assert collective_latency("all_reduce", 1, 1, HW) == 0.0
    # bytes add the beta term: 1 GB over 450 GB/s x 0.8
    assert collective_time("all_gather", 1e9, 8, 1, HW, CONSTS) == pytest.approx(
        collective_latency("all_gather", 8, 1, HW) + 1e9 / (450e9 * 0.8)
    )


def test_groups_span_nodes_by_axis_order():
    lay = ParallelConfig(tp=8, dp_shard=4, pp=2)
    assert axis_group(lay, "tp", HW) == (8, 1)
    assert axis_group(lay, "dp_shard", HW) == (4, 4)  # stride 8: one GPU per node
    assert axis_group(ParallelConfig(tp=2, dp_shard=8), "dp_shard", HW) == (8, 2)
    # FSDP's group is dp_shard x cp: with tp 8, cp 16 and dp_shard 8 every member is on its own node
    assert axis_group(ParallelConfig(tp=8, cp=16, dp_shard=8), "fsdp", HW) == (128, 128)


def _comm(cfg, lay, *, mbs=1, seq=2048, micro=4, compute=10.0, hw=HW, consts=CONSTS, grad_bytes=1e9, overlap=True):
    return step_communication(
        cfg,
        lay,
        micro_batch_sequences=mbs,
        seq_len=seq,
        num_micro=micro,
        compute_s=compute,
        forward_share=1 / 3,
        replicate_grad_bytes=grad_bytes,
        virtual_stages=1,
        overlap_grad_reduce=overlap,
        hw=hw,
        consts=consts,
    )


def test_tp_collectives_per_block_and_micro_batch_are_exposed():
    cfg = get_preset("1b")
    plain = _comm(cfg, ParallelConfig(tp=2, sequence_parallel=False))
    sp = _comm(cfg, ParallelConfig(tp=2, sequence_parallel=True))
    blocks = cfg.num_layers * 4  # layers x micro-batches
    assert plain.collectives["tp"] == 4 * blocks  # 2 all-reduces forward + 2 backward per block
    assert sp.collectives["tp"] == 8 * blocks  # each all-reduce an all-gather + a reduce-scatter
    assert plain.bytes["tp"] == pytest.approx(sp.bytes["tp"])
    assert plain.exposed_s["tp"] == plain.total_s["tp"]  # no async TP
    # tiny activations: the time is the latency, 4 x blocks all-reduces of 2 NVLink steps
    tiny = _comm(cfg, ParallelConfig(tp=2, sequence_parallel=False), seq=1)
    assert tiny.total_s["tp"] == pytest.approx(4 * blocks * (8.4e-6 + 2 * 3.4e-6), rel=0.05)


def test_fsdp_hides_prefetched_gathers_behind_compute_except_the_first_and_last():
    cfg = get_preset("8b")
    lay = ParallelConfig(dp_shard=8)
    long = _comm(cfg, lay, micro=1, compute=100.0)  # compute dwarfs every unit's traffic
    f = long
    assert 0 < f.exposed_s["fsdp"] < 0.2 * f.total_s["fsdp"]
    # what stays exposed is the first gathers (root + block) and the last reduce-scatters (block + root)
    short = _comm(cfg, lay, micro=1, compute=1e-6)  # nothing to hide behind
    assert short.exposed_s["fsdp"] == pytest.approx(short.total_s["fsdp"], rel=0.02)
    # on CPU nothing queues ahead: every forward all-gather of a block is exposed, compute or not
    cpu = _comm(cfg, lay, micro=1, compute=100.0, hw=replace(HW, host_runs_ahead=False))
    dense, _ = layer_param_split(cfg, lay)
    gather_block = collective_time("all_gather", dense * 7 / 8 * 2, 8, 1, HW, CONSTS)
    assert cpu.exposed_s["fsdp"] - f.exposed_s["fsdp"] == pytest.approx((cfg.num_layers - 1) * gather_block)
    # ZeRO-3 issues 2 gathers + 1 reduce-scatter per block and 1 + 1 for the root, per micro-batch
    four = _comm(cfg, lay, micro=4)
    assert four.collectives["fsdp"] == 4 * (3 * cfg.num_layers + 2)


def test_ddp_all_reduce_overlaps_backward_except_the_last_units():
    cfg = get_preset("1b")
    lay = ParallelConfig(dp_replicate=16)  # 2 nodes: network all-reduce
    hidden = _comm(cfg, lay, micro=1, compute=100.0)
    total, exposed = hidden.total_s["dp_replicate"], hidden.exposed_s["dp_replicate"]
    assert hidden.collectives["dp_replicate"] == cfg.num_layers + 1  # one per block and the root
    assert 0 < exposed < 0.3 * total
    # only the last micro-batch's backward hides it: many micro-batches leave a short window
    window = _comm(cfg, lay, micro=10**6, compute=100.0)
    assert window.exposed_s["dp_replicate"] > 0.9 * window.total_s["dp_replicate"]
    # Megatron-LM's old DDP: one synchronous all-reduce after backward, all exposed
    sync = _comm(cfg, lay, micro=1, compute=100.0, overlap=False)
    assert sync.collectives["dp_replicate"] == 1 and sync.exposed_s["dp_replicate"] == sync.total_s["dp_replicate"]
    r = 16
    assert sync.bytes["dp_replicate"] == pytest.approx(2 * (r - 1) / r * 1e9)


def test_pp_sends_per_micro_batch_and_estimate_sums_the_exposed_parts():
    cfg = get_preset("1b")
    lay = ParallelConfig(pp=2, tp=2, pp_microbatches=8)
    comm = _comm(cfg, lay, micro=8)
    assert comm.collectives["pp"] == 2 * 8  # one send forward, one backward per micro-batch
    # SP: each TP rank sends its sequence shard of the boundary activation
    assert comm.bytes["pp"] == pytest.approx(16 * 2048 * cfg.d_model * 2 / 2)
    plan = estimate(cfg, lay, micro_batch_sequences=1, seq_len=2048, global_batch_sequences=8, hw=HW, consts=CONSTS)
    comm_parts = sum(v for k, v in plan.time_parts.items() if k.startswith("comm_"))
    assert plan.step_time_s == pytest.approx(plan.time_parts["compute"] + plan.time_parts["bubble"] + comm_parts)
    assert math.isclose(plan.comm_bytes["pp"], comm.bytes["pp"])
