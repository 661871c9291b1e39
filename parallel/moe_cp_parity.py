"""Parity of expert parallel (MoE) and context parallel against one device, on CPU/gloo.

    rows = ep_parity(["ep2", "ep4", "fsdp4xep2"], EPSpec())      # one spawned group per world size
    rows = cp_parity(["cp2", "cp2-ring", "cp4", "cp4-ring"], CPSpec())

EP: a small MoE model trains `steps` SGD steps. Each data-parallel rank takes its contiguous slice
of the global batch (as the sampler does); the reference runs the same slices one after the other
on one device as gradient-accumulation micro-batches (loss and aux-loss scaled by 1/dp), which is
the same mathematics: every rank's router statistics and aux loss are those of its own tokens.
Compared: per-step mean loss, per-layer tokens-per-expert (summed over ranks), aux loss, the first
step's gradients of every expert weight and of the routers, and all parameters at the end.

CP: a dense model's loss and every parameter gradient with the sequence sharded over cp ranks
(all-gather-KV or ring attention, head-tail load balancing), against one device, with FSDP over
the cp ranks' gradients done by hand (all-reduce / cp of the mean losses' gradients).

Layout names: epN (dp_shard=N, ep=N), fsdpMxepN (dp_shard=M, ep=N, experts FSDP-sharded over M/N),
optional `-grouped` (batched-GEMM experts), `-cf` (capacity factor 1.0) or `-e2` (2 experts, top-1:
expert weights FSDP-sharded on dim 1 under fsdp4xep2); cpN (all-gather KV),
cpN-ring (ring attention).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from scalelab.errors import UsageError
from scalelab.models.config import ModelConfig


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


_EP = re.compile(r"^(?:fsdp(\d+)x)?ep(\d+)(-grouped|-cf|-e2)?$")


def parse_ep_layout(name: str) -> tuple[int, int, str]:
    """(dp_shard, ep, option) of an EP layout name; UsageError when malformed."""
    m = _EP.match(name)
    if not m:
        raise UsageError(f"EP layout {name!r}: use epN, fsdpMxepN, with optional -grouped, -cf or -e2")
    ep = int(m.group(2))
    dp_shard = int(m.group(1) or ep)
    if ep < 2 or dp_shard % ep:
        raise UsageError(f"EP layout {name!r}: ep must be >= 2 and divide the fsdp size")
    return dp_shard, ep, (m.group(3) or "")[1:]


def _model_for(spec: EPSpec, option: str) -> ModelConfig:
    if option == "grouped":
        return replace(spec.model, moe_expert_method="grouped")
    if option == "cf":
        return replace(spec.model, capacity_factor=1.0)
    if option == "e2":  # 2 experts, top-1: fewer local experts than FSDP ranks under fsdp4xep2
        return replace(spec.model, num_experts=2, num_experts_per_tok=1)
    return spec.model


def _batches(vocab: int, steps: int, batch: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(0, vocab, (batch, seq_len + 1), generator=gen) for _ in range(steps)]


def _ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def ep_reference(spec: EPSpec, dp: int, option: str = "") -> dict:
    """Single-device run: each step's batch as `dp` accumulation micro-batches (see module doc)."""
    from scalelab.models.llama import build_model

    cfg = _model_for(spec, option)
    model = build_model(cfg, seed=spec.seed)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    model.set_moe_loss_scale(1.0 / dp)
    out = {"losses": [], "tokens_per_expert": [], "aux_loss": [], "grads": {}}
    for step, batch in enumerate(
        _batches(cfg.vocab_size, spec.steps, spec.global_batch_sequences, spec.seq_len, spec.seed)
    ):
        loss_sum, counts, aux = 0.0, None, None
        for chunk in batch.chunk(dp):
            loss = _ce(model(chunk[:, :-1]), chunk[:, 1:]) / dp
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
                n: p.grad.detach().clone() for n, p in model.named_parameters() if ".experts." in n or ".router." in n
            }
        opt.step()
        opt.zero_grad(set_to_none=True)
    out["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


def _ep_run(name: str, spec: EPSpec, out_dir: Path) -> None:
    """One EP layout inside the spawned group (world == dp_shard); rank 0 writes the results."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.models.llama import build_model
    from scalelab.parallel.data_parallel import apply_fsdp
    from scalelab.parallel.expert_parallel import (
        ExpertParallelExperts,
        apply_ep,
        apply_ep_fsdp,
        build_ep_mesh,
        gather_full_experts,
    )

    dp_shard, ep, option = parse_ep_layout(name)
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = _model_for(spec, option)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    emesh = build_ep_mesh(SimpleNamespace(dp_shard=dp_shard, cp=1, ep=ep), mesh)
    model = build_model(cfg, seed=spec.seed)
    apply_ep(model, emesh["ep"])
    apply_ep_fsdp(model, emesh["dp_mod_ep"])
    apply_fsdp(model, mesh["dp_shard"], reshard_after_forward=True, mixed_precision="fp32", device_type="cpu")
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    local = spec.global_batch_sequences // world
    out = {"losses": [], "tokens_per_expert": [], "aux_loss": [], "grads": {}}
    moe_names = [(n, m) for n, m in model.named_modules() if isinstance(m, ExpertParallelExperts)]
    batches = _batches(cfg.vocab_size, spec.steps, spec.global_batch_sequences, spec.seq_len, spec.seed)
    for step, batch in enumerate(batches):
        mine = batch[rank * local : (rank + 1) * local]
        loss = _ce(model(mine[:, :-1]), mine[:, 1:])
        loss.backward()
        stats = model.moe_stats()
        counts = torch.stack([s["tokens_per_expert"] for s in stats]).contiguous()
        aux = torch.stack([s["aux_loss"] for s in stats]).contiguous()
        value = loss.detach().reshape(1).clone()
        for t in (counts, aux, value):
            dist.all_reduce(t)
        out["losses"].append(float(value) / world)
        out["tokens_per_expert"].append(counts)
        out["aux_loss"].append(aux / world)
        if step == 0:
            for mname, mod in moe_names:
                for key, t in gather_full_experts(mod).items():
                    if key.endswith(".grad"):
                        out["grads"][f"{mname}.{key[:-5]}"] = t
            for n, p in model.named_parameters():
                if ".router." in n:
                    out["grads"][n] = p.grad.full_tensor().detach().clone()
        opt.step()
        if step == spec.steps - 1:
            from scalelab.parallel.memory import measured_memory

            out["memory"] = measured_memory(model, opt).as_dict()  # rank 0's, saved below
        opt.zero_grad(set_to_none=True)
    params = {}
    for n, p in model.named_parameters():
        if ".experts." not in n:
            params[n] = p.full_tensor().detach().clone()
    for mname, mod in moe_names:
        for key, t in gather_full_experts(mod).items():
            params[f"{mname}.{key}"] = t
    out["params"] = params
    if rank == 0:
        torch.save(out, out_dir / f"{name}.pt")
    dist.barrier()


def _ep_group(names: list[str], spec: EPSpec, out_dir: str) -> None:
    for name in names:
        _ep_run(name, spec, Path(out_dir))


def _max_diff(a: dict, b: dict) -> tuple[float, str]:
    worst, where = 0.0, ""
    for key, ref in a.items():
        if key not in b:
            return float("inf"), f"missing {key}"
        d = float((ref.float() - b[key].float()).abs().max())
        if d > worst:
            worst, where = d, key
    return worst, where


def compare_ep(name: str, ref: dict, got: dict, world: int, tolerance: float) -> dict:
    loss = max(abs(a - b) for a, b in zip(ref["losses"], got["losses"]))
    counts_equal = all(torch.equal(a, b) for a, b in zip(ref["tokens_per_expert"], got["tokens_per_expert"]))
    aux = max(float((a - b).abs().max()) for a, b in zip(ref["aux_loss"], got["aux_loss"]))
    grad, grad_where = _max_diff(ref["grads"], got["grads"])
    grad_scale = max(float(g.abs().max()) for g in ref["grads"].values())  # for a relative check
    param, param_where = _max_diff(ref["params"], got["params"])
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
    from scalelab.parallel.launch import spawn

    spec = spec or EPSpec()
    by_world: dict[int, list[str]] = {}
    for name in layouts:
        dp_shard, _, _ = parse_ep_layout(name)
        if spec.global_batch_sequences % dp_shard:
            raise UsageError(f"{name}: {dp_shard} ranks do not split {spec.global_batch_sequences} sequences")
        by_world.setdefault(dp_shard, []).append(name)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalelab-ep-") as tmp:
        for world, names in sorted(by_world.items()):
            spawn(_ep_group, world, (names, spec, tmp), backend="gloo")
        for name in layouts:
            dp_shard, _, option = parse_ep_layout(name)
            ref = ep_reference(spec, dp_shard, option)
            got = torch.load(Path(tmp) / f"{name}.pt", weights_only=True)
            row = compare_ep(name, ref, got, dp_shard, spec.tolerance)
            # the planner's exact state accounting for rank 0 (largest shards) vs what it held
            from scalelab.parallel.planner_memory import Layout, state_bytes

            _, ep, _ = parse_ep_layout(name)
            lay = Layout(dp_shard=dp_shard, ep=ep)
            row["memory_expected"] = state_bytes(
                _model_for(spec, option), lay, seq_len=spec.seq_len, optimizer="sgd"
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
    from scalelab.models.llama import build_model
    from scalelab.models.loss import lm_loss
    from scalelab.models.moe import summarize_stats

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


# --- context parallel ------------------------------------------------------------------------------
def cp_debug_model() -> ModelConfig:
    return ModelConfig(
        vocab_size=128, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, max_seq_len=64, kernels="torch"
    )


@dataclass(kw_only=True, slots=True)
class CPSpec:
    model: ModelConfig = field(default_factory=cp_debug_model)
    seq_len: int = 32  # multiple of 2*cp
    batch_sequences: int = 4
    seed: int = 0
    tolerance: float = 1e-5


_CP = re.compile(r"^(?:fsdp(\d+)x)?(?:tp(\d+)x)?cp(\d+)(-ring)?$")


def parse_cp_layout(name: str) -> tuple[int, int, str, int]:
    """(dp_shard, cp, variant, tp) of a CP layout name; UsageError when malformed."""
    m = _CP.match(name)
    if not m or int(m.group(3)) < 2:
        raise UsageError(f"CP layout {name!r}: use cpN, cpN-ring, fsdpMxcpN, tpKxcpN (N >= 2)")
    dp, tp = int(m.group(1) or 1), int(m.group(2) or 1)
    if dp > 1 and tp > 1:
        raise UsageError(f"CP layout {name!r}: combine cp with fsdp or with tp, not both")
    return dp, int(m.group(3)), "ring" if m.group(4) else "allgather", tp


def cp_reference(spec: CPSpec) -> dict:
    """Logits, loss and every parameter gradient of one forward+backward on one device."""
    from scalelab.models.llama import build_model

    model = build_model(spec.model, seed=spec.seed)
    batch = _batches(spec.model.vocab_size, 1, spec.batch_sequences, spec.seq_len, spec.seed)[0]
    logits = model(batch[:, :-1])
    loss = _ce(logits, batch[:, 1:])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return {"logits": logits.detach(), "loss": float(loss.detach()), "grads": grads}


def _cp_run(name: str, spec: CPSpec, out_dir: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scalelab.models.llama import build_model
    from scalelab.parallel.context_parallel import apply_cp, local_positions, shard_sequence_batch
    from scalelab.parallel.data_parallel import apply_fsdp

    dp, cp, variant, tp = parse_cp_layout(name)
    rank = dist.get_rank()
    if tp > 1:  # TP inside each cp rank (no sequence parallel), FSDP over cp
        mesh = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
        fsdp_mesh, dp_rank = mesh["cp"], 0
    elif dp > 1:
        mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp_shard", "cp"))
        fsdp_mesh = mesh[("dp_shard", "cp")]._flatten("dp_shard_cp")
        dp_rank = mesh["dp_shard"].get_local_rank()
    else:
        mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
        fsdp_mesh, dp_rank = mesh["cp"], 0
    cp_rank = mesh["cp"].get_local_rank()
    model = build_model(spec.model, seed=spec.seed)
    if tp > 1:
        from scalelab.parallel.tp import apply_tp

        apply_tp(model, mesh["tp"], sequence_parallel=False, loss_parallel=False)
    apply_cp(model, mesh["cp"], variant)
    apply_fsdp(model, fsdp_mesh, reshard_after_forward=True, mixed_precision="fp32", device_type="cpu")
    batch = _batches(spec.model.vocab_size, 1, spec.batch_sequences, spec.seq_len, spec.seed)[0]
    local = spec.batch_sequences // dp
    mine = batch[dp_rank * local : (dp_rank + 1) * local]
    tokens, targets, positions = shard_sequence_batch(mine[:, :-1], mine[:, 1:], cp_rank, cp)
    logits = model(tokens, positions)
    loss = _ce(logits, targets)
    loss.backward()  # FSDP averages the gradients over dp_shard × cp: the mean over all tokens
    value = loss.detach().reshape(1).clone()
    dist.all_reduce(value)
    grads = {n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()}
    result = {
        "logits": logits.detach(),
        "rows": (dp_rank * local, local),
        "positions": local_positions(spec.seq_len, cp_rank, cp),
        "loss": float(value) / dist.get_world_size(),
        "grads": grads,
    }
    torch.save(result, out_dir / f"{name}.rank{rank}.pt")
    dist.barrier()


def _cp_group(names: list[str], spec: CPSpec, out_dir: str) -> None:
    for name in names:
        _cp_run(name, spec, Path(out_dir))


def cp_parity(layouts: list[str], spec: CPSpec | None = None) -> list[dict]:
    """Run every CP layout (one process group per world size) and compare with one device."""
    from scalelab.parallel.launch import spawn

    spec = spec or CPSpec()
    by_world: dict[int, list[str]] = {}
    for name in layouts:
        dp, cp, _, tp = parse_cp_layout(name)
        if spec.seq_len % (2 * cp) or spec.batch_sequences % dp:
            raise UsageError(f"{name}: seq_len must be a multiple of 2*cp and the batch of dp")
        by_world.setdefault(dp * cp * tp, []).append(name)
    ref = cp_reference(spec)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalelab-cp-") as tmp:
        for world, names in sorted(by_world.items()):
            spawn(_cp_group, world, (names, spec, tmp), backend="gloo")
        for name in layouts:
            dp, cp, variant, tp = parse_cp_layout(name)
            results = [torch.load(Path(tmp) / f"{name}.rank{r}.pt", weights_only=True) for r in range(dp * cp * tp)]
            fwd = 0.0
            for res in results:
                start, count = res["rows"]
                expect = ref["logits"][start : start + count].index_select(1, res["positions"])
                fwd = max(fwd, float((expect - res["logits"]).abs().max()))
            grad, where = 0.0, ""
            for res in results:
                d, w = _max_diff(ref["grads"], res["grads"])
                if d >= grad:
                    grad, where = d, w
            loss = abs(results[0]["loss"] - ref["loss"])
            rows.append(
                dict(
                    layout=name,
                    world_size=dp * cp * tp,
                    variant=variant,
                    max_logit_diff=fwd,
                    loss_diff=loss,
                    max_grad_diff=grad,
                    worst_grad=where,
                    ok=max(fwd, loss, grad) <= spec.tolerance,
                )
            )
    return rows


# --- `scalelab parity` integration -----------------------------------------------------------------
def is_moe_cp_layout(name: str) -> bool:
    """True for the layouts this module checks (epN, fsdpMxepN[-grouped|-cf], cpN[-ring], fsdpMxcpN)."""
    return bool(_EP.match(name) or _CP.match(name))


def check_moe_cp_layouts(names: list[str]) -> None:
    """UsageError for a malformed EP/CP layout name (before any process starts)."""
    for n in names:
        parse_ep_layout(n) if _EP.match(n) else parse_cp_layout(n)


def run_moe_cp_parity(names: list[str], *, seed: int = 0, tolerance: float = 1e-5, steps: int = 2) -> list[dict]:
    """EP layouts against the MoE debug model, CP layouts against the dense one (one group per world)."""
    ep = [n for n in names if _EP.match(n)]
    cp = [n for n in names if _CP.match(n)]
    for n in ep:
        parse_ep_layout(n)
    for n in cp:
        parse_cp_layout(n)
    rows = []
    if ep:
        rows += ep_parity(ep, EPSpec(seed=seed, tolerance=tolerance, steps=steps))
    if cp:
        rows += cp_parity(cp, CPSpec(seed=seed, tolerance=tolerance))
    return rows


def format_moe_cp_rows(rows: list[dict]) -> str:
    """A fixed-width table of EP/CP parity rows."""
    lines = [
        f"{'layout':<20} {'world':>5} {'max|Δloss|':>11} {'max|Δgrad|':>11} {'max|Δparam|':>12} {'router':>7} "
        f"{'memory':>7}  result",
        "-" * 86,
    ]
    for r in rows:
        ep = "router_counts_equal" in r
        grad = r["max_expert_grad_diff"] if ep else r["max_grad_diff"]
        param = f"{r['max_param_diff']:>12.2e}" if ep else f"{'logits ' + format(r['max_logit_diff'], '.1e'):>12}"
        router = ("ok" if r["router_counts_equal"] and r["max_aux_diff"] <= 1e-5 else "WRONG") if ep else "-"
        memory = ("ok" if r["memory_ok"] else "WRONG") if ep else "-"
        lines.append(
            f"{r['layout']:<20} {r['world_size']:>5} {r.get('max_loss_diff', r.get('loss_diff')):>11.2e} "
            f"{grad:>11.2e} {param} {router:>7} {memory:>7}  {'ok' if r['ok'] else 'FAIL'}"
        )
    lines.append("EP: MoE debug model, SGD steps vs one device (per-rank micro-batches); CP: one fwd+bwd, dense model")
    return "\n".join(lines)
