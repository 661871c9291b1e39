"""The planned run's layout on its cluster: the planner's fastest layout that fits (a GPU cluster) or the
sweep's own single-process layout (this CPU), the batch grown where no layout holds it, and the
layout as run-config keys (scalelab.planning.plan, step 5).

    p, grown = held_layout(cfg, cluster, design, seq_len=2048, batch=2**21, run=run)
    layout = layout_choice(p, cluster)     # the plan's "layout": step time, MFU, memory, shares
    gpu_overrides(p)                       # parallel.*, train.micro_batch_sequences, cuda, bf16
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scalelab.errors import UsageError
from scalelab.models.config import ModelConfig
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.planner import Plan, best_layout, estimate, plan_layouts
from scalelab.planning.cluster import Cluster
from scalelab.planning.design import Design
from scalelab.planning.whatif import shares

BATCH_GROWTH = 2  # times the batch may be doubled to find a layout


@dataclass(kw_only=True, slots=True)
class LayoutChoice:
    name: str
    parallel: dict[str, Any]
    micro_batch_sequences: int
    step_time_s: float  # the planner's step plus any fixed per-step cost of the cluster
    mfu: float | None  # None on this CPU (its rate is fitted: a fraction of it says nothing)
    tokens_per_s_per_gpu: float
    memory_gib: dict[str, float]
    time_parts: dict[str, float]
    comm_share: float
    bubble_share: float


def gpu_overrides(plan: Plan) -> dict[str, Any]:
    """The layout as run-config keys. Under a pipeline the planner's micro-batch is the pipeline's
    (parallel.pp_microbatches of them make one step: no loop accumulation); otherwise it is the
    loop's gradient-accumulation micro-batch."""
    over = {f"parallel.{k}": v for k, v in asdict(plan.parallel).items()}
    mbs = 0 if plan.parallel.pp > 1 else plan.micro_batch_sequences
    return over | {"train.micro_batch_sequences": mbs, "train.device": "cuda", "train.dtype": "bf16"}


def _layout(cfg: ModelConfig, cluster: Cluster, *, seq_len: int, batch_tokens: int, config: dict) -> Plan | None:
    """The planner's fastest layout that fits (GPU), or the run's own single-process layout (CPU)."""
    if cluster.is_cpu:
        seqs = batch_tokens // seq_len
        mbs = config["train"].get("micro_batch_sequences") or seqs
        return estimate(cfg, ParallelConfig(), micro_batch_sequences=mbs, seq_len=seq_len, global_batch_sequences=seqs,
                        hw=cluster.hw, consts=cluster.consts)  # fmt: skip
    return best_layout(cfg, num_gpus=cluster.num_gpus, seq_len=seq_len, global_batch_tokens=batch_tokens,
                       hw=cluster.hw, consts=cluster.consts)  # fmt: skip


def _cannot_hold(cfg: ModelConfig, cluster: Cluster, seq_len: int, batch_tokens: int, params: int) -> UsageError:
    closest = plan_layouts(cfg, num_gpus=cluster.num_gpus, seq_len=seq_len, global_batch_tokens=batch_tokens,
                           hw=cluster.hw, consts=cluster.consts, include_unfit=True)  # fmt: skip
    need = f"; the smallest layout needs {closest[0].memory['total'] / 2**30:.0f} GiB per GPU" if closest else ""
    return UsageError(
        f"--gpus {cluster.num_gpus} x {cluster.gpu}: no layout holds the {params / 1e9:.3g}B-parameter model at "
        f"{batch_tokens:,} tokens per step in {cluster.hw.gpu_memory_bytes / 2**30:.0f} GiB per GPU{need}; "
        "give more GPUs (--gpus) or a smaller budget"
    )


def layout_choice(p: Plan, cluster: Cluster) -> LayoutChoice:
    overhead_s = cluster.step_overhead_s
    comm, bubble = shares(p)
    return LayoutChoice(
        name=p.name,
        parallel=asdict(p.parallel),
        micro_batch_sequences=p.micro_batch_sequences,
        step_time_s=p.step_time_s + overhead_s,
        mfu=None if cluster.is_cpu else p.mfu * p.step_time_s / (p.step_time_s + overhead_s),
        tokens_per_s_per_gpu=p.tokens_per_s_per_gpu * p.step_time_s / (p.step_time_s + overhead_s),
        memory_gib={k: v / 2**30 for k, v in p.memory.items()},
        time_parts=dict(p.time_parts, **({"per_step_overhead": overhead_s} if overhead_s else {})),
        comm_share=comm,
        bubble_share=bubble,
    )


def held_layout(
    cfg: ModelConfig, cluster: Cluster, design: Design, *, seq_len: int, batch: int, run
) -> tuple[Plan, int]:
    """The best layout of the run's batch or, where none holds it, of the smallest batch x2^k
    (k <= BATCH_GROWTH) one holds, and that factor; UsageError when none does, or when the batch
    would have to grow and the sweep's recipe fixes it."""
    p = _layout(cfg, cluster, seq_len=seq_len, batch_tokens=batch, config=run.config)
    grown = 1
    while p is None and grown < 2**BATCH_GROWTH:
        grown *= 2
        p = _layout(cfg, cluster, seq_len=seq_len, batch_tokens=batch * grown, config=run.config)
    if p is None:
        raise _cannot_hold(cfg, cluster, seq_len, batch, run.params)
    if grown > 1 and design.recipe is not None:
        raise UsageError(
            f"--gpus {cluster.num_gpus}: no layout divides the {batch:,} tokens per step the sweep's recipe sets for "
            f"this run (it holds {batch * grown:,}); the recipe fixes the batch: plan on fewer GPUs"
        )
    return p, grown
