"""Context-parallel parity: a dense model's loss and gradients with the sequence sharded over cp.

    rows = cp_parity(["cp2", "cp2-ring", "cp4", "cp4-ring"], CPSpec())

One forward+backward with the sequence sharded over cp ranks (all-gather-KV or ring attention,
head-tail load balancing) against one device, on the training loop's mesh
(ParallelDims.build_mesh) with FSDP over dp_shard × cp, or HSDP (dp_replicate, dp_shard × cp):
the mean losses' gradients averaged over all data-parallel and cp ranks.
`cp_attention_rows` checks the attention op alone (O(1) inputs) and the bytes it saves for backward.

Layout names: cpN (all-gather KV), cpN-ring (ring attention), fsdpMxcpN, hsdpRxcpN, tpKxcpN, tpKspxcpN
(tensor parallel with sequence parallel inside each cp rank).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from scalelab.errors import UsageError
from scalelab.kernels.reference import attention as reference_attention
from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.parallel.backend import spawn
from scalelab.parallel.context_parallel import (
    allgather_attention,
    apply_cp,
    attention_saved_bytes,
    local_positions,
    ring_attention,
    shard_sequence,
    shard_sequence_batch,
)
from scalelab.parallel.data_parallel import apply_fsdp, fsdp_options
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.parity_data import batches, cross_entropy, max_diff
from scalelab.parallel.planner_memory import measure_saved_bytes
from scalelab.parallel.tp import apply_tp


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


_CP = re.compile(r"^(?:hsdp(\d+)x)?(?:fsdp(\d+)x)?(?:tp(\d+)(sp)?x)?cp(\d+)(-ring)?$")


def is_cp_layout(name: str) -> bool:
    return bool(_CP.match(name))


@dataclass(kw_only=True, slots=True)
class CPLayout:
    dims: ParallelDims
    variant: str  # allgather | ring
    sequence_parallel: bool = False  # with tp > 1


def parse_cp_layout(name: str) -> CPLayout:
    """The layout of a CP layout name; UsageError when malformed.

    hsdpR (dp_replicate), fsdpM (dp_shard) and tpK or tpKsp (tensor parallel without / with sequence
    parallel) may prefix cpN; tp does not combine with the data-parallel prefixes here (kept to the
    tested cases).
    """
    m = _CP.match(name)
    if not m or int(m.group(5)) < 2:
        raise UsageError(f"CP layout {name!r}: use cpN, cpN-ring, fsdpMxcpN, hsdpRxcpN, tpKxcpN, tpKspxcpN (N >= 2)")
    rep, dp, tp = (int(g or 1) for g in m.group(1, 2, 3))
    if tp > 1 and rep * dp > 1:
        raise UsageError(f"CP layout {name!r}: combine cp with fsdp/hsdp or with tp, not both")
    return CPLayout(
        dims=ParallelDims(dp_replicate=rep, dp_shard=dp, tp=tp, cp=int(m.group(5))),
        variant="ring" if m.group(6) else "allgather",
        sequence_parallel=bool(m.group(4)),
    )


def cp_reference(spec: CPSpec) -> dict:
    """Logits, loss and every parameter gradient of one forward+backward on one device."""
    model = build_model(spec.model, seed=spec.seed)
    batch = batches(spec.model.vocab_size, 1, spec.batch_sequences, spec.seq_len, spec.seed)[0]
    logits = model(batch[:, :-1])
    loss = cross_entropy(logits, batch[:, 1:])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return {"logits": logits.detach(), "loss": float(loss.detach()), "grads": grads}


def _cp_run(name: str, spec: CPSpec, out_dir: Path) -> None:
    layout = parse_cp_layout(name)
    dims, variant = layout.dims, layout.variant
    rank, cp = dist.get_rank(), dims.cp
    dims.build_mesh("cpu")  # the training loop's mesh (with its flattened dp_shard_cp view)
    dp_rank, dp_size = dims.dp_coords()
    cp_rank = dims.mesh_for("cp").get_local_rank()
    model = build_model(spec.model, seed=spec.seed)
    if dims.tp > 1:  # TP (and SP: the residual stream a Shard(1) DTensor of this cp rank's rows) inside each cp rank
        apply_tp(model, dims.mesh_for("tp"), sequence_parallel=layout.sequence_parallel, loss_parallel=False)
    apply_cp(model, dims.mesh_for("cp"), variant)
    fsdp = fsdp_options(reshard_after_forward=True, mixed_precision="fp32", device_type="cpu")
    apply_fsdp(model, dims.fsdp_mesh, **fsdp)
    batch = batches(spec.model.vocab_size, 1, spec.batch_sequences, spec.seq_len, spec.seed)[0]
    local = spec.batch_sequences // dp_size
    mine = batch[dp_rank * local : (dp_rank + 1) * local]
    tokens, targets, positions = shard_sequence_batch(mine[:, :-1], mine[:, 1:], cp_rank, cp)
    logits = model(tokens, positions)
    loss = cross_entropy(logits, targets)
    loss.backward()  # FSDP/HSDP averages the gradients over dp_replicate × dp_shard × cp: the mean over all tokens
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
    spec = spec or CPSpec()
    by_world: dict[int, list[str]] = {}
    for name in layouts:
        dims = parse_cp_layout(name).dims
        if spec.seq_len % (2 * dims.cp) or spec.batch_sequences % dims.dp_size:
            raise UsageError(f"{name}: seq_len must be a multiple of 2*cp and the batch of dp_replicate*dp_shard")
        by_world.setdefault(dims.world_size, []).append(name)
    ref = cp_reference(spec)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scalelab-cp-") as tmp:
        for world, names in sorted(by_world.items()):
            spawn(_cp_group, world, (names, spec, tmp), backend="gloo")
        for name in layouts:
            layout = parse_cp_layout(name)
            dims, variant = layout.dims, layout.variant
            results = [torch.load(Path(tmp) / f"{name}.rank{r}.pt", weights_only=True) for r in range(dims.world_size)]
            fwd = 0.0
            for res in results:
                start, count = res["rows"]
                expect = ref["logits"][start : start + count].index_select(1, res["positions"])
                fwd = max(fwd, float((expect - res["logits"]).abs().max()))
            grad, where = 0.0, ""
            for res in results:
                d, w = max_diff(ref["grads"], res["grads"])
                if d >= grad:
                    grad, where = d, w
            loss = abs(results[0]["loss"] - ref["loss"])
            rows.append(
                dict(
                    layout=name,
                    world_size=dims.world_size,
                    variant=variant,
                    max_logit_diff=fwd,
                    loss_diff=loss,
                    max_grad_diff=grad,
                    worst_grad=where,
                    ok=max(fwd, loss, grad) <= spec.tolerance,
                )
            )
    return rows


# --- the attention op alone: exactness with O(1) inputs, and the bytes it saves for backward -------------
@dataclass(kw_only=True, slots=True)
class CPAttentionSpec:
    batch: int = 2
    heads: int = 4
    kv_heads: int = 2  # GQA: 2 query heads per K/V head
    head_dim: int = 16
    seq_len: int = 64  # multiple of 2*cp
    seed: int = 0


def _attention_inputs(spec: CPAttentionSpec) -> list[torch.Tensor]:
    """q, k, v, grad_out over the whole sequence, standard normal (scores of order 1: the softmax is
    far from uniform, so a wrong dK/dV shows, unlike at a debug model's init)."""
    gen = torch.Generator().manual_seed(spec.seed)
    shapes = [(spec.heads,), (spec.kv_heads,), (spec.kv_heads,), (spec.heads,)]
    return [torch.randn((spec.batch, h, spec.seq_len, spec.head_dim), generator=gen) for (h,) in shapes]


def _attention_worker(spec: CPAttentionSpec, out_dir: str) -> None:
    torch.set_num_threads(1)
    cp, rank = dist.get_world_size(), dist.get_rank()
    group = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))["cp"].get_group()
    q, k, v, grad_out = _attention_inputs(spec)
    result = {}
    for variant, fn in (("allgather", allgather_attention), ("ring", ring_attention)):
        for causal in (True, False):
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            ref_out = reference_attention(*full, causal=causal)
            ref_out.backward(grad_out)
            mine = [shard_sequence(t, rank, cp, dim=2).requires_grad_() for t in (q, k, v)]
            saved, out = measure_saved_bytes(
                nn.Module(), lambda fn=fn, mine=mine, causal=causal: fn(*mine, causal, group=group, cp_rank=rank, cp=cp)
            )
            out.backward(shard_sequence(grad_out, rank, cp, dim=2))
            diff = float((out - shard_sequence(ref_out, rank, cp, dim=2)).abs().max())
            for ref_t, t in zip(full, mine, strict=True):
                diff = max(diff, float((t.grad - shard_sequence(ref_t.grad, rank, cp, dim=2)).abs().max()))
            result[(variant, causal)] = (diff, saved)
    torch.save(result, Path(out_dir) / f"attn.rank{rank}.pt")
    dist.barrier()


def cp_attention_rows(cp: int, spec: CPAttentionSpec | None = None) -> list[dict]:
    """Each variant's attention op (causal and not) on `cp` ranks vs one device: the max |diff| of the
    output and of dQ, dK, dV over all ranks, and rank 0's saved-for-backward bytes beside the formula
    `attention_saved_bytes` (causal)."""
    spec = spec or CPAttentionSpec()
    if spec.seq_len % (2 * cp):
        raise UsageError(f"seq_len={spec.seq_len} must be a multiple of 2*cp={2 * cp}")
    with tempfile.TemporaryDirectory(prefix="scalelab-cp-attn-") as tmp:
        spawn(_attention_worker, cp, (spec, tmp), backend="gloo")
        results = [torch.load(Path(tmp) / f"attn.rank{r}.pt", weights_only=True) for r in range(cp)]
    rows = []
    for (variant, causal), (_, saved) in results[0].items():
        expected = attention_saved_bytes(
            variant,
            batch=spec.batch,
            heads=spec.heads,
            kv_heads=spec.kv_heads,
            head_dim=spec.head_dim,
            seq_len=spec.seq_len,
            cp=cp,
        )
        rows.append(
            dict(
                variant=variant,
                causal=causal,
                cp=cp,
                max_diff=max(res[(variant, causal)][0] for res in results),
                saved_bytes=saved,
                expected_saved_bytes=expected if causal else None,
            )
        )
    return rows
