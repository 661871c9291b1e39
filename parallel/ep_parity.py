"""Expert-parallel parity: a small MoE model under EP layouts against one device, on CPU/gloo.

    rows = ep_parity(["ep2", "ep4", "fsdp4xep2"], EPSpec())      # one spawned group per world size

A small MoE model trains `steps` SGD steps. Each data-parallel rank takes its contiguous slice of
the global batch (as the sampler does); the reference runs the same slices one after the other on
one device as gradient-accumulation micro-batches (loss and aux-loss scaled by 1/dp), which is the
same mathematics: every rank's router statistics and aux loss are those of its own tokens.
Compared: per-step mean loss, per-layer tokens-per-expert (summed over ranks), aux loss, the first
step's gradients of every expert weight and of the routers, and all parameters at the end.

Each layout is applied by `scalelab.parallel.parallelize` (the training loop's path), so TP of the
MoE block (router replicated, shared experts column/row-parallel, routed experts split over tp by
their hidden width) is checked with EP and FSDP together.

Layout names: epN (dp_shard=N, ep=N), fsdpMxepN (dp_shard=M, ep=N, experts FSDP-sharded over M/N),
optionally prefixed dpRx (R HSDP replicas: experts and dense parameters all-reduced across them), then
optionally `xtpK` (tensor parallel K inside each data-parallel rank: world = M·K; ep1xtpK is
TP of the MoE without EP) and suffixes `-sp` (sequence parallel), `-grouped` (batched-GEMM experts),
`-cf` (capacity factor 1.0) or `-e2` (2 experts, top-1: expert weights FSDP-sharded on dim 1 under
fsdp4xep2). Examples: ep2xtp2, fsdp2xep2xtp2-sp, ep1xtp2-sp, dp2xep2.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from scalelab.errors import UsageError
from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.models.moe import summarize_stats
from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.expert_parallel import ShardedExperts, gather_full_experts
from scalelab.parallel.memory import measured_memory
from scalelab.parallel.parallelize import parallelize
from scalelab.parallel.parity_data import batches, cross_entropy, max_diff
from scalelab.parallel.planner_memory import Layout, state_bytes


def moe_debug_model(**overrides) -> ModelConfig:
    fields = dict(
        family="moe",
        vocab_size=128,
        num_layers=2,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        d_ff=64,
        max_seq_len=64,
        kernels="torch",
        num_experts=8,
        num_experts_per_tok=2,
        moe_d_ff=32,
        num_shared_experts=1,
        router_aux_loss_weight=0.01,
        router_z_loss_weight=0.001,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


@dataclass(kw_only=True, slots=True)
class EPSpec:
    model: ModelConfig = field(default_factory=moe_debug_model)
    steps: int = 2
    seq_len: int = 16
    global_batch_sequences: int = 8
    lr: float = 0.1  # SGD: sees gradient scale errors that Adam's normalisation would hide
    seed: int = 0
    tolerance: float = 1e-5


_EP = re.compile(r"^(?:dp(\d+)x)?(?:fsdp(\d+)x)?ep(\d+)(?:xtp(\d+))?(-sp)?(-grouped|-cf|-e2)?$")


@dataclass(frozen=True, slots=True)
class EPLayout:
    dp_shard: int
    ep: int
    tp: int = 1
    dp_replicate: int = 1
    sp: bool = False
    option: str = ""  # "", "grouped", "cf" or "e2"

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp_size(self) -> int:
        return self.dp_replicate * self.dp_shard


def is_ep_layout(name: str) -> bool:
    return bool(_EP.match(name))


def parse_ep_layout(name: str) -> EPLayout:
    """The EPLayout of a layout name (see the module docstring); UsageError when malformed."""
    m = _EP.match(name)
    if not m:
        raise UsageError(
            f"EP layout {name!r}: use [dpRx]epN or [dpRx]fsdpMxepN, optionally xtpK, then -sp and/or -grouped|-cf|-e2"
        )
    dp_replicate, ep, tp = int(m.group(1) or 1), int(m.group(3)), int(m.group(4) or 1)
    dp_shard = int(m.group(2) or ep)
    if ep < 1 or dp_shard % ep or (ep == 1 and tp < 2) or tp < 1:
        raise UsageError(f"EP layout {name!r}: ep must be >= 2 (or 1 with tp >= 2) and divide the fsdp size")
    if m.group(5) and tp < 2:
        raise UsageError(f"EP layout {name!r}: -sp needs xtpK with K >= 2")
    option = (m.group(6) or "")[1:]
    return EPLayout(dp_shard=dp_shard, ep=ep, tp=tp, dp_replicate=dp_replicate, sp=bool(m.group(5)), option=option)


def _model_for(spec: EPSpec, option: str) -> ModelConfig:
    if option == "grouped":
        return replace(spec.model, moe_expert_method="grouped")
    if option == "cf":
        return replace(spec.model, capacity_factor=1.0)
    if option == "e2":  # 2 experts, top-1: fewer local experts than FSDP ranks under fsdp4xep2
        return replace(spec.model, num_experts=2, num_experts_per_tok=1)
    return spec.model


def ep_reference(spec: EPSpec, dp: int, option: str = "") -> dict:
    """Single-device run: each step's batch as `dp` accumulation micro-batches (see module doc)."""
    cfg = _model_for(spec, option)
    model = build_model(cfg, seed=spec.seed)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    model.set_moe_loss_scale(1.0 / dp)
    out = {"losses": [], "tokens_per_expert": [], "aux_loss": [], "grads": {}}
    for step, batch in enumerate(
        batches(cfg.vocab_size, spec.steps, spec.global_batch_sequences, spec.seq_len, spec.seed)
    ):
        loss_sum, counts, aux = 0.0, None, None
        for chunk in batch.chunk(dp):
            loss = cross_entropy(model(chunk[:, :-1]), chunk[:, 1:]) / dp
            loss.backward()
            loss_sum += float(loss.detach())
            stats = model.moe_stats()
            c = torch.stack([s["tokens_per_expert"] for s in stats])
            a = torch.stack([s["aux_loss"] for s in stats]) / dp
            counts = c if counts is None else counts + c
            aux = a if aux is None else aux + a
        out["losses"].append(loss_sum)
        out["tokens_per_expert"].append(counts)
        out["aux_loss"].append(aux)
        if step == 0:
            out["grads"] = {
                n: p.grad.detach().clone()
                for n, p in model.named_parameters()
                if ".experts." in n or ".router." in n or ".shared_experts." in n
            }
        opt.step()
        opt.zero_grad(set_to_none=True)
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def _parallel_cfg(lay: EPLayout) -> ParallelConfig:
    """The ParallelConfig of one EP layout (fp32, no loss parallel)."""
    return ParallelConfig(
        dp_replicate=lay.dp_replicate,
        dp_shard=lay.dp_shard,
        tp=lay.tp,
        ep=lay.ep,
        sequence_parallel=lay.sp,
        loss_parallel=False,
        mixed_precision="fp32",
        backend="gloo",
    )


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _ep_run(name: str, spec: EPSpec, out_dir: Path) -> None:
    """One EP layout inside the spawned group (world == dp_shard × tp); rank 0 writes the results."""
    lay = parse_ep_layout(name)
    cfg = _model_for(spec, lay.option)
    pcfg = _parallel_cfg(lay)
    dims = ParallelDims.from_config(pcfg, world_size=dist.get_world_size(), model=cfg, seq_len=spec.seq_len)
    model = parallelize(build_model(cfg, seed=spec.seed), dims, pcfg, seq_len=spec.seq_len).model
    dp_rank, dp_size = dims.dp_coords()
    dp_group = dims.mesh_for("dp" if dims.dp_replicate > 1 else "dp_shard").get_group() if dp_size > 1 else None
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    local = spec.global_batch_sequences // dp_size
    out = {"losses": [], "tokens_per_expert": [], "aux_loss": [], "grads": {}}
    moe_names = [(n, m) for n, m in model.named_modules() if isinstance(m, ShardedExperts)]
    steps = batches(cfg.vocab_size, spec.steps, spec.global_batch_sequences, spec.seq_len, spec.seed)
    for step, batch in enumerate(steps):
        mine = batch[dp_rank * local : (dp_rank + 1) * local]
        loss = cross_entropy(model(mine[:, :-1]), mine[:, 1:])
        loss.backward()
        stats = model.moe_stats()  # the same on every tp rank: each sees its dp rank's tokens
        counts = torch.stack([s["tokens_per_expert"] for s in stats]).contiguous()
        aux = torch.stack([s["aux_loss"] for s in stats]).contiguous()
        value = loss.detach().reshape(1).clone()
        if dp_group is not None:
            for t in (counts, aux, value):
                dist.all_reduce(t, group=dp_group)
        out["losses"].append(float(value) / dp_size)
        out["tokens_per_expert"].append(counts)
        out["aux_loss"].append(aux / dp_size)
        if step == 0:
            for mname, mod in moe_names:
                for key, t in gather_full_experts(mod).items():
                    if key.endswith(".grad"):
                        out["grads"][f"{mname}.{key[:-5]}"] = t
            for n, p in model.named_parameters():
                if ".router." in n or ".shared_experts." in n:
                    out["grads"][n] = _full(p.grad)
        opt.step()
        if step == spec.steps - 1:
            out["memory"] = measured_memory(model, opt).as_dict()  # rank 0's, saved below
        opt.zero_grad(set_to_none=True)
    out["params"] = {n: _full(p) for n, p in model.named_parameters()}
    if dist.get_rank() == 0:
        torch.save(out, out_dir / f"{name}.pt")
    dist.barrier()


def _ep_group(names: list[str], spec: EPSpec, out_dir: str) -> None:
    for name in names:
        _ep_run(name, spec, Path(out_dir))


def compare_ep(name: str, ref: dict, got: dict, world: int, tolerance: float) -> dict:
    loss = max(abs(a - b) for a, b in zip(ref["losses"], got["losses"]))
    counts_equal = all(torch.equal(a, b) for a, b in zip(ref["tokens_per_expert"], got["tokens_per_expert"]))
    aux = max(float((a - b).abs().max()) for a, b in zip(ref["aux_loss"], got["aux_loss"]))
    grad, grad_where = max_diff(ref["grads"], got["grads"])
    grad_scale = max(float(g.abs().max()) for g in ref["grads"].values())  # for a relative check
    param, param_where = max_diff(ref["params"], got["params"])
    ok = max(loss, aux, grad, param) <= tolerance and counts_equal
    return dict(
        layout=name,
        world_size=world,
        max_loss_diff=loss,
        router_counts_equal=counts_equal,
        max_aux_diff=aux,
        max_expert_grad_diff=grad,
        expert_grad_scale=grad_scale,
        worst_grad=grad_where,
        max_param_diff=param,
        worst_param=param_where,
        ok=ok,
    )


def ep_parity(layouts: list[str], spec: EPSpec | None = None) -> list[dict]:
    """Run every EP layout (one process group per world size) and compare with one device."""
    spec = spec or EPSpec()
    by_world: dict[int, list[str]] = {}
    for name in layouts:
        lay = parse_ep_layout(name)
        if spec.global_batch_sequences % lay.dp_size:
            raise UsageError(f"{name}: {lay.dp_size} ranks do not split {spec.global_batch_sequences} sequences")
        by_world.setdefault(lay.world_size, []).append(name)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalelab-ep-") as tmp:
        for world, names in sorted(by_world.items()):
            spawn(_ep_group, world, (names, spec, tmp), backend="gloo")
        for name in layouts:
            lay = parse_ep_layout(name)
            ref = ep_reference(spec, lay.dp_size, lay.option)
            got = torch.load(Path(tmp) / f"{name}.pt", weights_only=True)
            row = compare_ep(name, ref, got, lay.world_size, spec.tolerance)
            # the planner's exact state accounting for rank 0 (largest shards) vs what it held
            plan = Layout(dp_replicate=lay.dp_replicate, dp_shard=lay.dp_shard, ep=lay.ep, tp=lay.tp)
            row["memory_expected"] = state_bytes(
                _model_for(spec, lay.option), plan, seq_len=spec.seq_len, optimizer="sgd"
            ).as_dict()
            row["memory_measured"] = got["memory"]
            row["memory_ok"] = row["memory_expected"] == row["memory_measured"]
            row["ok"] = row["ok"] and row["memory_ok"]
            rows.append(row)
    return rows


def aux_balance_run(
    aux_weight: float, steps: int = 40, seed: int = 0, lr: float = 3e-3, capacity_factor: float = 0.0
) -> dict[str, float]:
    """Train the EP debug MoE (8 experts, top-2, no shared expert) on random tokens with AdamW and
    the given load-balancing weight; returns the router imbalance (max/mean tokens per expert,
    mean over layers) at the first step and averaged over the last 10 steps, plus the aux loss.
    Without the aux loss the routers drift towards a few experts; with it they stay balanced."""
    cfg = moe_debug_model(
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
