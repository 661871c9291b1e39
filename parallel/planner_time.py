"""The planner's communication model: each axis's collectives as alpha-beta costs, and what overlaps compute.

    comm = step_communication(cfg, lay, micro_batch_sequences=4, seq_len=8192, num_micro=8,
                              compute_s=12.0, forward_share=1 / 3, hw=hw, consts=consts)
    comm.bytes["fsdp"], comm.total_s["fsdp"], comm.exposed_s["fsdp"], comm.collectives["fsdp"]

One collective over a group of n GPUs costs (NCCL's own tuning model, src/graph/tuning.cc: a
base latency plus a latency per algorithm step, and the bytes over the bus bandwidth):

    t = collective_latency_s + steps_intra · intra_node_step_latency_s + steps_inter · inter_node_step_latency_s
        + bytes one GPU sends / (link bandwidth × comm_efficiency)

with ring steps 2(n-1) for an all-reduce, n-1 for an all-gather, reduce-scatter or all-to-all, 1 for
a send/recv; of those, a group spanning k > 1 nodes crosses the network 2k times (all-reduce) or k-1
times (all-gather, reduce-scatter, all-to-all), as NCCL counts them. Collectives per step:

  - TP/SP: per block per micro-batch, 2 all-reduces forward and 2 backward without SP (an all-gather
    and a reduce-scatter in place of each with SP; 1.5x under full AC, whose recompute replays the
    forward ones); MoE blocks by `tp_units`.
  - FSDP (dp_shard × cp): per unit (each block, plus the root: embeddings, final norm, output) per
    pass (each micro-batch without PP, once per step with PP): an all-gather forward, another in
    backward unless parameters stay gathered (ZeRO-2), and an fp32 reduce-scatter.
  - DDP/HSDP (dp_replicate): one all-reduce per unit (FSDP2's replicate), once per step; or one
    all-reduce of everything after backward (`overlap_grad_reduce` False).
  - CP: per block per micro-batch, a K/V all-gather forward and a reduce-scatter of dK/dV backward;
    the ring variant 2(cp-1) + cp sends. EP: 4 all-to-alls per MoE block per micro-batch.
  - PP: per micro-batch and model chunk, one activation send forward and one gradient send backward
    (sequence-sharded over tp under SP).

What is exposed (the rest hides behind compute):

  - FSDP: the first unit's all-gather and the last unit's reduce-scatter are exposed; every other
    unit's all-gather is prefetched behind the previous unit's forward, its backward all-gather and
    reduce-scatter behind a neighbour's backward, each hiding at most `fsdp_overlap` × that unit's
    compute. Forward prefetch needs the host to run ahead of the device (GPU); on CPU/gloo
    (`host_runs_ahead` False) every forward all-gather is exposed, as the profiles show.
  - DDP/HSDP: each unit's all-reduce hides behind the next unit's backward of the last micro-batch
    (within what FSDP's own traffic leaves of `fsdp_overlap` × that compute); the last block's and
    the root's, issued when backward ends, are exposed.
  - TP, CP, EP and PP collectives sit on the critical path: exposed (no async-TP, no
    all-to-all/compute overlap, blocking pipeline sends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.planner_constants import CostConstants, Hardware
from scalelab.parallel.planner_memory import layer_param_split

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


def axis_group(lay: ParallelConfig, axis: str, hw: Hardware) -> tuple[int, int]:
    """(GPUs in one group of `axis`, nodes that group spans). Ranks are laid out tp innermost, then
    cp, dp_shard, dp_replicate, pp; ep groups sit inside dp_shard × cp with stride tp; "fsdp" is
    FSDP's group, dp_shard × cp with stride tp."""
    stride = {
        "tp": 1,
        "cp": lay.tp,
        "dp_shard": lay.tp * lay.cp,
        "ep": lay.tp,
        "fsdp": lay.tp,
        "dp_replicate": lay.tp * lay.cp * lay.dp_shard,
    }
    stride["pp"] = stride["dp_replicate"] * lay.dp_replicate
    size = lay.dp_shard * lay.cp if axis == "fsdp" else getattr(lay, axis)
    nodes = min(size, max(1, math.ceil(size * stride[axis] / hw.gpus_per_node)))
    return size, nodes


def collective_latency(kind: str, size: int, nodes: int, hw: Hardware) -> float:
    """Seconds of one collective that do not depend on its bytes (the alpha of alpha-beta)."""
    if size <= 1:
        return 0.0
    steps = 2 * (size - 1) if kind == "all_reduce" else 1 if kind == "p2p" else size - 1
    inter = 0
    if nodes > 1:
        inter = min(steps, 2 * nodes if kind == "all_reduce" else 1 if kind == "p2p" else nodes - 1)
    return (
        hw.collective_latency_s + (steps - inter) * hw.intra_node_step_latency_s + inter * hw.inter_node_step_latency_s
    )


def bandwidth(nodes: int, hw: Hardware, consts: CostConstants) -> float:
    """Bytes/s one GPU sends in a collective: NVLink inside a node, its NIC across nodes."""
    bw = hw.intra_node_bytes_per_s if nodes <= 1 else hw.inter_node_bytes_per_s
    return bw * consts.comm_efficiency


def collective_time(kind: str, nbytes: float, size: int, nodes: int, hw: Hardware, consts: CostConstants) -> float:
    """Seconds of one collective that sends `nbytes` per GPU ((n-1)/n factors included)."""
    if size <= 1:
        return 0.0
    return collective_latency(kind, size, nodes, hw) + nbytes / bandwidth(nodes, hw, consts)


@dataclass(slots=True)
class StepCommunication:
    """Per GPU per step, by axis: bytes sent, collectives issued, their time, and the exposed part."""

    bytes: dict[str, float] = field(default_factory=dict)
    collectives: dict[str, float] = field(default_factory=dict)
    total_s: dict[str, float] = field(default_factory=dict)
    exposed_s: dict[str, float] = field(default_factory=dict)

    def add(self, axis: str, nbytes: float, count: float, seconds: float, exposed: float) -> None:
        self.bytes[axis], self.collectives[axis], self.total_s[axis] = nbytes, count, seconds
        self.exposed_s[axis] = exposed


def tp_units(cfg, lay: ParallelConfig) -> float:
    """TP traffic of one block per micro-batch, in units of (tp-1)/tp × tokens × d_model elements
    (an all-gather or reduce-scatter of the block's activations is 1 unit, an all-reduce 2).

    Dense block: attention and MLP each one all-reduce forward and one backward (or AG + RS under
    SP): 8 units, 12 under full AC (forward replayed). MoE block (scalelab.parallel.expert_parallel):
    attention as dense; the routed experts all-reduce their k output rows per token forward and the
    rows' input gradients backward (2k + 2k), shared experts one all-reduce each way (2 + 2), and
    under SP the block's input all-gather forward and the output-gradient all-gather backward (1 + 1).
    """
    replay = lay.activation_checkpoint == "full"
    if cfg.family != "moe":
        return 12.0 if replay else 8.0
    k, shared, sp = cfg.num_experts_per_tok, 2.0 if cfg.num_shared_experts else 0.0, float(lay.sequence_parallel)
    forward = 2.0 + 2 * k + shared + sp  # attention all-reduce + the MoE block's forward collectives
    backward = 2.0 + 2 * k + shared + sp
    return forward * (2 if replay else 1) + backward


@dataclass(frozen=True, slots=True)
class _StepShape:
    """What every axis's cost reads: one GPU's share of the model and of the step's compute."""

    act: float  # bytes per activation element
    d: int
    ov: float  # consts.fsdp_overlap
    layers_rank: int  # blocks on this pipeline rank (whole)
    layers: float  # blocks per pipeline rank (mean)
    tokens_micro: float  # tokens per GPU per micro-batch
    block_fwd: float  # one block's forward compute in one micro-batch, seconds
    block_bwd: float  # and its backward
    dense: float  # parameters per block: dense part, expert part (this GPU's TP share)
    expert: float
    embed: float  # the root's parameters (embeddings and output layer)
    num_micro: int
    micro_batch_sequences: int
    seq_len: int


def step_communication(
    cfg,
    lay: ParallelConfig,
    *,
    micro_batch_sequences: int,
    seq_len: int,
    num_micro: int,
    compute_s: float,
    forward_share: float,
    replicate_grad_bytes: float,
    virtual_stages: int,
    overlap_grad_reduce: bool = True,
    hw: Hardware,
    consts: CostConstants,
) -> StepCommunication:
    """Every axis's communication in one step (see the module docstring).

    compute_s: this GPU's compute time per step (no bubble); forward_share: the part of it that is
    forward (the rest is backward, recompute included); replicate_grad_bytes: what one replicate
    all-reduce sums per step (compression applied); virtual_stages: model chunks per pipeline rank;
    overlap_grad_reduce False: the replicate all-reduce is one synchronous call after backward (how
    Megatron-LM's own DDP worked before its `overlap_grad_reduce` option)."""
    out = StepCommunication()
    layers = cfg.num_layers / lay.pp
    dense, expert = layer_param_split(cfg, lay)
    sh = _StepShape(
        act=hw.compute_dtype_bytes,
        d=cfg.d_model,
        ov=consts.fsdp_overlap,
        layers_rank=math.ceil(cfg.num_layers / lay.pp),
        layers=layers,
        tokens_micro=micro_batch_sequences * seq_len / lay.cp,
        block_fwd=compute_s * forward_share / (num_micro * layers),
        block_bwd=compute_s * (1 - forward_share) / (num_micro * layers),
        dense=dense,
        expert=expert,
        embed=cfg.vocab_size * cfg.d_model * (1 if cfg.tied_embeddings else 2) / lay.tp,
        num_micro=num_micro,
        micro_batch_sequences=micro_batch_sequences,
        seq_len=seq_len,
    )
    dp_window = sh.ov * sh.block_bwd  # backward compute per block left to hide the replicate all-reduce
    if lay.dp_shard * lay.cp > 1:
        dp_window = _fsdp(out, lay, sh, hw, consts)
    if lay.dp_replicate > 1:
        _dp_replicate(out, lay, sh, replicate_grad_bytes, dp_window, overlap_grad_reduce, hw, consts)
    blocks_micro = sh.layers * num_micro  # block passes per step on this GPU
    if lay.tp > 1:
        _tp(out, cfg, lay, sh, blocks_micro, hw, consts)
    if lay.cp > 1:
        _cp(out, cfg, lay, sh, blocks_micro, hw, consts)
    if lay.ep > 1 and cfg.family == "moe":
        size, nodes = axis_group(lay, "ep", hw)
        one = (lay.ep - 1) / lay.ep * cfg.num_experts_per_tok * sh.tokens_micro * sh.d * sh.act
        seconds = blocks_micro * 4 * collective_time("all_to_all", one, size, nodes, hw, consts)
        out.add("ep", 4 * one * blocks_micro, 4 * blocks_micro, seconds, seconds)
    if lay.pp > 1:
        size, nodes = axis_group(lay, "pp", hw)
        sends = 2 * num_micro * virtual_stages  # activation forward + gradient backward, per chunk
        # under SP a stage's output is sequence-sharded over tp: each TP rank sends its 1/tp
        # (Megatron's scatter/gather optimization does the same without SP, Narayanan et al. §4.1)
        one = sh.tokens_micro * sh.d * sh.act / (lay.tp if lay.sequence_parallel else 1)
        nbytes = one * sends
        seconds = sends * collective_latency("p2p", size, nodes, hw) + nbytes / bandwidth(nodes, hw, consts)
        out.add("pp", nbytes, sends, seconds, seconds)
    return out


def _fsdp(out: StepCommunication, lay: ParallelConfig, sh: _StepShape, hw: Hardware, consts: CostConstants) -> float:
    """FSDP's gathers and reduce-scatters (dp_shard x cp); returns the backward compute per block
    left to hide the replicate all-reduce behind."""
    fsdp_n = lay.dp_shard * lay.cp
    num_micro, layers_rank, ov, act = sh.num_micro, sh.layers_rank, sh.ov, sh.act
    size, nodes = axis_group(lay, "fsdp", hw)
    m = fsdp_n // lay.ep
    block = sh.dense * (fsdp_n - 1) / fsdp_n + sh.expert * (m - 1) / m  # elements one GPU receives
    root = sh.embed * (fsdp_n - 1) / fsdp_n
    passes = num_micro if lay.pp == 1 else 1
    zero3 = lay.fsdp_reshard_after_forward
    ag = lambda n: collective_time("all_gather", n * act, size, nodes, hw, consts)  # noqa: E731
    rs = lambda n: collective_time("reduce_scatter", n * 4, size, nodes, hw, consts)  # noqa: E731 fp32
    per_pass_units = layers_rank + 1
    # FSDP2 keeps the root gathered from forward to backward: it gathers once per pass
    gathers = (2 if zero3 else 1) * layers_rank * ag(block) + ag(root)
    total = passes * (gathers + layers_rank * rs(block) + rs(root))
    # with PP one pass spans every micro-batch: a block's compute in it is num_micro blocks' worth
    block_fwd, block_bwd = sh.block_fwd, sh.block_bwd
    fwd_c, bwd_c = (block_fwd, block_bwd) if lay.pp == 1 else (block_fwd * num_micro, block_bwd * num_micro)
    forward_hidden = hw.host_runs_ahead
    fwd = ag(root) + ag(block)  # the first units' gathers: nothing to hide behind
    fwd += (layers_rank - 1) * (max(0.0, ag(block) - ov * fwd_c) if forward_hidden else ag(block))
    bwd_block = (ag(block) if zero3 else 0.0) + rs(block)
    bwd = bwd_block + rs(root)  # the first gather, the last reduce-scatters
    bwd += (layers_rank - 1) * max(0.0, bwd_block - ov * bwd_c)
    gathered = (2 if zero3 else 1) * layers_rank * block + root
    nbytes = passes * (gathered * act + (layers_rank * block + root) * 4)
    count = passes * (per_pass_units * 2 + (layers_rank if zero3 else 0))
    out.add("fsdp", nbytes, count, total, passes * (fwd + bwd))
    return max(0.0, ov * block_bwd - bwd_block)


def _dp_replicate(
    out: StepCommunication,
    lay: ParallelConfig,
    sh: _StepShape,
    replicate_grad_bytes: float,
    dp_window: float,
    overlap_grad_reduce: bool,
    hw: Hardware,
    consts: CostConstants,
) -> None:
    """DDP/HSDP's all-reduces: one per unit hidden behind backward, or one after it."""
    r = lay.dp_replicate
    layers_rank = sh.layers_rank
    size, nodes = axis_group(lay, "dp_replicate", hw)
    nbytes = 2 * (r - 1) / r * replicate_grad_bytes
    root_share = sh.embed / (sh.embed + layers_rank * (sh.dense + sh.expert))
    per_block = nbytes * (1 - root_share) / layers_rank
    ar_block = collective_time("all_reduce", per_block, size, nodes, hw, consts)
    ar_root = collective_time("all_reduce", nbytes * root_share, size, nodes, hw, consts)
    if overlap_grad_reduce:
        total = layers_rank * ar_block + ar_root
        exposed = ar_block + ar_root + (layers_rank - 1) * max(0.0, ar_block - dp_window)
        out.add("dp_replicate", nbytes, layers_rank + 1, total, exposed)
    else:  # one synchronous all-reduce of every gradient after backward
        total = collective_time("all_reduce", nbytes, size, nodes, hw, consts)
        out.add("dp_replicate", nbytes, 1, total, total)


def _tp(
    out: StepCommunication,
    cfg,
    lay: ParallelConfig,
    sh: _StepShape,
    blocks_micro: float,
    hw: Hardware,
    consts: CostConstants,
) -> None:
    """TP/SP's collectives: per block per micro-batch, on the critical path."""
    size, nodes = axis_group(lay, "tp", hw)
    units = tp_units(cfg, lay)
    per_unit = (lay.tp - 1) / lay.tp * sh.tokens_micro * sh.d * sh.act
    # an all-reduce is 2 units, an all-gather or reduce-scatter 1: the same ring steps per unit
    kind, count = ("all_gather", units) if lay.sequence_parallel else ("all_reduce", units / 2)
    unit_time = units / count * per_unit
    seconds = blocks_micro * count * collective_time(kind, unit_time, size, nodes, hw, consts)
    out.add("tp", units * per_unit * blocks_micro, count * blocks_micro, seconds, seconds)


def _cp(
    out: StepCommunication,
    cfg,
    lay: ParallelConfig,
    sh: _StepShape,
    blocks_micro: float,
    hw: Hardware,
    consts: CostConstants,
) -> None:
    """Context parallel's K/V exchange: all-gather and reduce-scatter, or the ring's sends."""
    size, nodes = axis_group(lay, "cp", hw)
    kv = 2 * cfg.num_kv_heads / lay.tp * cfg.head_dim * sh.act  # bytes of K and V per token
    full = sh.micro_batch_sequences * sh.seq_len * kv
    if lay.cp_variant == "ring":  # K/V hops forward and again backward, fp32 dK/dV for cp hops
        hops = 2 * (lay.cp - 1) + lay.cp
        per = (2 * (lay.cp - 1) + 2 * lay.cp) / lay.cp * full
        hop = collective_latency("p2p", size, nodes, hw)
        seconds = blocks_micro * (hops * hop + per / bandwidth(nodes, hw, consts))
        out.add("cp", per * blocks_micro, hops * blocks_micro, seconds, seconds)
    else:  # all-gather K/V forward, reduce-scatter dK/dV backward
        one = (lay.cp - 1) / lay.cp * full
        seconds = blocks_micro * 2 * collective_time("all_gather", one, size, nodes, hw, consts)
        out.add("cp", 2 * one * blocks_micro, 2 * blocks_micro, seconds, seconds)
