"""Scale what-ifs: the same run on several cluster sizes, and where adding GPUs stops paying.

    what_if = scale_what_ifs(cfg, seq_len=2048, batch_tokens=2**22, steps=150_000, cluster=cluster,
                             sizes=[256, 512, 1024, 2048, 4096, 8192, 10240])
    what_if.rows, what_if.knee, what_if.ceiling, what_if.assumptions

Each size gets the planner's fastest layout that fits memory (scalelab.parallel.planner.best_layout)
for the planned model and global batch: its step time, MFU, the share of the step spent in exposed
communication and in the pipeline bubble, the wall time for the planned steps and the GPU-hours.
Between two neighbouring sizes the marginal scaling exponent is e = log(speedup) / log(GPU ratio):
1 when twice the GPUs halve the time, 0 when they gain nothing. The knee is the first size past
which e falls below KNEE_EXPONENT (0.5: a doubling buys less than x1.41 in time for x2 the GPUs,
so the GPU-hours grow by more than 41%); the ceiling is the shortest wall time over every size (more
GPUs than that size's do not shorten the run at all, in this model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scalelab.models.config import ModelConfig
from scalelab.parallel.planner import Plan, best_layout
from scalelab.planning.cluster import Cluster

KNEE_EXPONENT = 0.5
MAX_GPUS = 10240
ASSUMPTIONS = (
    "the model and the global batch stay the plan's (more GPUs do not buy a larger batch: past the critical "
    "batch a larger one costs tokens, and the loss prediction assumes this one)",
    "the planner's constants for this GPU type at every size (one mfu, NCCL's latencies, one NIC per GPU, a "
    "network that does not congest as the cluster grows)",
    "the planner's layouts only: no asynchronous TP, no all-to-all/compute overlap, the pipeline schedules "
    "scalelab implements",
    "no failures, restarts, checkpoint stalls or slow data loading; no stragglers",
)


@dataclass(kw_only=True, slots=True)
class WhatIfRow:
    num_gpus: int
    layout: str | None  # None: no layout fits (or none divides the batch)
    step_time_s: float | None = None
    mfu: float | None = None
    comm_share: float | None = None  # exposed communication / step
    bubble_share: float | None = None
    wall_s: float | None = None
    gpu_hours: float | None = None
    memory_gib: float | None = None


@dataclass(kw_only=True, slots=True)
class WhatIf:
    rows: list[WhatIfRow]
    knee: int | None  # GPUs past which adding more stops paying (None: scales to the largest size)
    ceiling: WhatIfRow | None  # the fastest size
    exponents: list[tuple[int, int, float]] = field(default_factory=list)  # (from, to, e)
    assumptions: tuple[str, ...] = ASSUMPTIONS

    def to_dict(self) -> dict:
        return {
            "rows": [
                {f: getattr(r, f) for f in r.__slots__}  # type: ignore[attr-defined]
                for r in self.rows
            ],
            "knee": self.knee,
            "ceiling": None if self.ceiling is None else self.ceiling.num_gpus,
            "ceiling_wall_s": None if self.ceiling is None else self.ceiling.wall_s,
            "exponents": [list(e) for e in self.exponents],
            "assumptions": list(self.assumptions),
        }


def default_sizes(num_gpus: int) -> list[int]:
    """Powers of two from num_gpus/16 (at least 8) to 8192, the planned size, and 10,240."""
    sizes = {num_gpus, MAX_GPUS}
    g = 8
    while g <= 8192:
        if g >= num_gpus / 16:
            sizes.add(g)
        g *= 2
    return sorted(s for s in sizes if s <= MAX_GPUS)


def shares(plan: Plan) -> tuple[float, float]:
    """(exposed communication, bubble) as fractions of the step."""
    comm = sum(v for k, v in plan.time_parts.items() if k.startswith("comm_"))
    return comm / plan.step_time_s, plan.time_parts.get("bubble", 0.0) / plan.step_time_s


def row_for(plan: Plan | None, num_gpus: int, steps: int, overhead_s: float) -> WhatIfRow:
    if plan is None:
        return WhatIfRow(num_gpus=num_gpus, layout=None)
    comm, bubble = shares(plan)
    wall = steps * (plan.step_time_s + overhead_s)
    return WhatIfRow(
        num_gpus=num_gpus,
        layout=plan.name,
        step_time_s=plan.step_time_s + overhead_s,
        mfu=plan.mfu,
        comm_share=comm,
        bubble_share=bubble,
        wall_s=wall,
        gpu_hours=wall * num_gpus / 3600.0,
        memory_gib=plan.memory["total"] / 2**30,
    )


def scale_what_ifs(
    cfg: ModelConfig, *, seq_len: int, batch_tokens: int, steps: int, cluster: Cluster, sizes: list[int]
) -> WhatIf:
    rows = []
    for g in sorted(set(sizes)):
        best = best_layout(cfg, num_gpus=g, seq_len=seq_len, global_batch_tokens=batch_tokens, hw=cluster.hw,
                           consts=cluster.consts)  # fmt: skip
        rows.append(row_for(best, g, steps, cluster.step_overhead_s))
    knee, ceiling, exponents = knee_and_ceiling(rows)
    return WhatIf(rows=rows, knee=knee, ceiling=ceiling, exponents=exponents)


def knee_and_ceiling(rows: list[WhatIfRow]) -> tuple[int | None, WhatIfRow | None, list[tuple[int, int, float]]]:
    """(knee, ceiling, exponents) of rows sorted by GPUs (module docstring); sizes without a layout skipped."""
    timed = [r for r in rows if r.wall_s is not None]
    exponents = []
    knee = None
    for a, b in zip(timed, timed[1:]):
        e = math.log(a.wall_s / b.wall_s) / math.log(b.num_gpus / a.num_gpus)
        exponents.append((a.num_gpus, b.num_gpus, e))
        if knee is None and e < KNEE_EXPONENT:
            knee = a.num_gpus
    ceiling = min(timed, key=lambda r: r.wall_s) if timed else None
    return knee, ceiling, exponents
