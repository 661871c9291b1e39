"""What gradient compression costs and saves: the debug model trained under one layout with each
`parallel.grad_compression`, on gloo, from the same init and batches (bench/grad_compression.py, tests).

    rows = compression_trial("dp2", ["none", "bf16", "powersgd"], ParitySpec(steps=20), powersgd_rank=2)
    rows[1]["grad_bytes_per_step"], rows[1]["losses"], rows[1]["max_loss_diff"]

Per method: the loss of every step (the dp mean), the bytes this rank handed to the gradient
reductions (reduce-scatter inputs + all-reduce tensors, counted by
`compression.count_collective_bytes` around forward+backward; all-gathers reported apart), and the
largest |Δloss| and final |Δparameter| against the first method (the uncompressed reference).

It lives in experiments/ (it was scalelab.parallel.compression_check) because no product code calls it:
it is bench/grad_compression.py's measurement, which tests/test_grad_compression.py also checks;
experiments is a package the bench, the tests and the gloo ranks it spawns import without path tricks.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab.models.llama import build_model
from scalelab.parallel.backend import spawn
from scalelab.parallel.compression import count_collective_bytes
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.layouts import parse_layout
from scalelab.parallel.parallelize import parallelize
from scalelab.parallel.parity import PARITY_BASE, ParitySpec, full_tensor, parity_batches, parity_optimizer


def _worker(layout: str, methods: list[str], spec: ParitySpec, powersgd_rank: int, out_dir: str) -> None:
    rank = dist.get_rank()
    mesh = None
    results = {}
    for method in methods:
        pcfg = dataclasses.replace(
            parse_layout(layout, PARITY_BASE), grad_compression=method, powersgd_rank=powersgd_rank
        )
        dims = ParallelDims.from_config(pcfg, world_size=dist.get_world_size())
        mesh = dims.build_mesh("cpu") if mesh is None else mesh  # one set of process groups for all methods
        dims.mesh = mesh
        par = parallelize(
            build_model(spec.model, device="cpu", seed=spec.seed), dims, pcfg, seq_len=spec.seq_len, z_loss=0.0
        )
        opt = parity_optimizer(par.model, spec)
        local = spec.global_batch_sequences // par.dp_size
        losses, reduce_bytes, gather_bytes = [], [], []
        for batch in parity_batches(spec):
            mine = batch[par.dp_rank * local : (par.dp_rank + 1) * local]
            with count_collective_bytes() as counted:
                ce = par.step.forward_backward(mine[:, :-1], mine[:, 1:], 1.0)
            reduce_bytes.append(counted.by_op.get("all_reduce", 0) + counted.by_op.get("reduce_scatter", 0))
            gather_bytes.append(counted.by_op.get("all_gather", 0))
            par.step.clip_grad_norm(par.model, spec.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = ce.detach().float().reshape(()).clone()
            dist.all_reduce(value)
            losses.append(float(value) / dist.get_world_size())
        params = {k: full_tensor(v) for k, v in par.model.state_dict().items()}
        results[method] = dict(losses=losses, reduce_bytes=reduce_bytes, gather_bytes=gather_bytes, params=params)
    if rank == 0:
        torch.save(results, Path(out_dir) / "results.pt")
    dist.barrier()


def compression_trial(
    layout: str, methods: list[str], spec: ParitySpec | None = None, *, powersgd_rank: int = 1
) -> list[dict]:
    """Train `spec`'s debug model under `layout` once per compression method (the first is the
    reference); one row per method (see the module docstring)."""
    spec = spec or ParitySpec()
    world = parse_layout(layout, PARITY_BASE).world_size
    with tempfile.TemporaryDirectory() as tmp:
        spawn(_worker, world, (layout, methods, spec, powersgd_rank, tmp), backend="gloo")
        results = torch.load(Path(tmp) / "results.pt", weights_only=True)
    ref = results[methods[0]]
    rows = []
    for method in methods:
        r = results[method]
        rows.append(
            {
                "method": method if method != "powersgd" else f"powersgd(rank {powersgd_rank})",
                "losses": r["losses"],
                "grad_bytes_per_step": r["reduce_bytes"][-1],  # a compressed step (PowerSGD starts at step 2)
                "gather_bytes_per_step": r["gather_bytes"][-1],
                "final_loss": r["losses"][-1],
                "max_loss_diff": max(abs(a - b) for a, b in zip(r["losses"], ref["losses"])),
                "max_param_diff": max(float((r["params"][k] - v).abs().max()) for k, v in ref["params"].items()),
            }
        )
    return rows


def format_rows(rows: list[dict], reference_bytes: int | None = None) -> str:
    ref = reference_bytes or rows[0]["grad_bytes_per_step"]
    lines = [
        "| method | grad-reduction bytes/step/rank | vs none | final loss | max abs dloss vs none | max abs dparam |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['grad_bytes_per_step']:,} | {r['grad_bytes_per_step'] / ref:.3f} | "
            f"{r['final_loss']:.4f} | {r['max_loss_diff']:.2e} | {r['max_param_diff']:.2e} |"
        )
    return "\n".join(lines)
