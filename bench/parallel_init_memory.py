"""Benchmark: peak host memory per rank to build and shard a model, full build vs meta build (CPU, gloo).

Full build: every rank materialises and initialises the whole model, then shards it (FSDP2).
Meta build (what `train_run` does for a parallel layout): the model is sharded on the meta device,
then each rank allocates and initialises only its shards (`Parallelized.materialize`), drawing one
full parameter at a time. Both give the same weights (checked here: the sum of squares of all
parameters, reduced over ranks, must agree to 1e-6 relative).

Printed per rank: the growth of peak RSS (ru_maxrss) from just before building to after sharding,
and the bytes of parameters the rank holds. Each variant runs in its own fresh process group so
that one variant's peak does not hide the other's.

    python bench/parallel_init_memory.py [--preset 350m] [--world 4]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from pathlib import Path

import torch


def _worker(preset: str, meta: bool, out_dir: str) -> None:
    import torch.distributed as dist

    from scalelab.models.llama import build_model
    from scalelab.models.presets import get_preset
    from scalelab.parallel.config import ParallelConfig
    from scalelab.parallel.dims import ParallelDims
    from scalelab.parallel.parallelize import parallelize

    world = dist.get_world_size()
    cfg = get_preset(preset, kernels="torch")
    pcfg = ParallelConfig(dp_shard=world, mixed_precision="fp32", backend="gloo")
    dims = ParallelDims.from_config(pcfg, world_size=world, model=cfg)
    dims.build_mesh("cpu")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    device = torch.device("cpu")
    if meta:
        par = parallelize(build_model(cfg, device="meta"), dims, pcfg, seq_len=cfg.max_seq_len, device=device)
        par.materialize(seed=0)
    else:
        par = parallelize(build_model(cfg, device=device, seed=0), dims, pcfg, seq_len=cfg.max_seq_len, device=device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    held = sum(p.to_local().numel() * p.element_size() for p in par.model.parameters())
    sq = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for p in par.model.parameters():
            sq += p.to_local().double().pow(2).sum()
    dist.all_reduce(sq)
    row = {"rank": dist.get_rank(), "peak_growth_bytes": peak - before, "param_bytes": held, "sum_sq": float(sq)}
    Path(out_dir, f"{'meta' if meta else 'full'}{dist.get_rank()}.json").write_text(json.dumps(row))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="350m")
    ap.add_argument("--world", type=int, default=4)
    args = ap.parse_args()
    from scalelab.models.accounting import num_params
    from scalelab.models.presets import get_preset
    from scalelab.parallel.backend import spawn

    n = num_params(get_preset(args.preset))
    print(f"{args.preset}: {n / 1e6:.0f}M parameters = {4 * n / 2**30:.2f} GiB fp32; FSDP over {args.world} ranks")
    with tempfile.TemporaryDirectory() as tmp:
        rows = {}
        for meta in (False, True):
            spawn(_worker, args.world, (args.preset, meta, tmp), backend="gloo")
            name = "meta" if meta else "full"
            rows[name] = [json.loads(Path(tmp, f"{name}{r}.json").read_text()) for r in range(args.world)]
    for name, rs in rows.items():
        growth = max(r["peak_growth_bytes"] for r in rs)
        held = max(r["param_bytes"] for r in rs)
        print(
            f"{name:>5} build: peak RSS growth per rank {growth / 2**30:6.2f} GiB (max over ranks); "
            f"holds {held / 2**30:.2f} GiB of parameters"
        )
    full, meta = (max(r["peak_growth_bytes"] for r in rows[k]) for k in ("full", "meta"))
    print(f"meta / full peak growth: {meta / full:.2f}")
    a, b = rows["full"][0]["sum_sq"], rows["meta"][0]["sum_sq"]
    same = abs(a - b) <= 1e-6 * abs(a)
    print(f"same weights (sum of squares over all shards): {a:.6f} vs {b:.6f} -> {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
