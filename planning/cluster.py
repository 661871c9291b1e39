"""The cluster a plan runs on: the planner's hardware and constants, and the planner's error band there.

    cluster = gpu_cluster("H100-SXM", num_gpus=2048)        # the planner's GPU table (parallel/hardware.py)
    cluster = cpu_cluster(sweep_dir)                         # this machine, calibrated on the sweep's runs
    cluster.hw, cluster.consts, cluster.band.lo, cluster.band.hi

The band is how far the planner's step time has been from measured ones, as the ratio measured /
predicted of the run's time (wall time on GPUs, CPU time on this CPU: `band.clock`; so a band
[0.8, 1.5] says the run may take from 0.8x to 1.5x the plan):
  - GPU types: the check against published cluster results (scalelab.parallel.planner_published,
    docs/planner-at-scale.md): the lowest and highest ratio over its goal rows (every figure there is
    a throughput, so measured / predicted wall time = predicted / published figure);
  - this CPU: the sweep's own runs. Each run's measured seconds per step (its trial's CPU seconds
    from events.jsonl, `train_cpu_s`, over its steps, so start-up and evaluation are in it) against
    the planner's step for its model and batch. On one process the planner's step is its FLOPs over
    peak x mfu; tiny models add a fixed cost per step (Python, the optimizer's loop over tensors, the
    data loader) that no FLOP count sees. So the CPU's rate R (FLOP/s: the planner's peak, with mfu
    1) and that cost per step b are fitted to the runs, step = FLOPs / R + b, by least squares on log
    step time; the band is the lowest and highest ratio measured / fitted left.

CPU seconds, not wall: on a machine shared with other work a run gets a share of a core that
changes from hour to hour, and its wall time is its CPU time over that share. A rate fitted on the
wall time of the sweep's runs would plan at the load of the day the sweep ran; fitted on their CPU
time it plans the run alone on one idle core, a figure the next run can be checked against whatever
the load then (its own CPU time). A store whose events predate `train_cpu_s` (any timed run without
it) is fitted on wall time, and the cluster's label and band say which clock they are.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from scalelab import store
from scalelab.errors import UsageError
from scalelab.models.config import ModelConfig
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.hardware import GPU_TYPES
from scalelab.parallel.planner import CostConstants, Hardware, Measurement, estimate
from scalelab.parallel.planner_published import evaluate_published
from scalelab.train.config import build_run_config

CPU = "cpu"


@dataclass(kw_only=True, slots=True)
class PlannerBand:
    """Measured / predicted wall time where the planner was checked: [lo, hi] over `n` cases."""

    lo: float
    hi: float
    n: int
    within_15: int  # cases whose step time the planner got within 15%
    source: str
    clock: str = "wall"  # the time the ratios are of: "wall", or "CPU" (a CPU plan fitted on CPU seconds)


@dataclass(kw_only=True, slots=True)
class Cluster:
    label: str  # e.g. "2048 x H100-SXM (8 per node)"
    gpu: str  # a key of parallel.hardware.GPU_TYPES, or "cpu"
    num_gpus: int
    hw: Hardware
    consts: CostConstants
    band: PlannerBand
    step_overhead_s: float = 0.0  # a fixed cost per optimizer step the planner does not model (CPU: fitted)

    @property
    def is_cpu(self) -> bool:
        return self.gpu == CPU

    def with_gpus(self, num_gpus: int) -> Cluster:
        label = self.label.replace(f"{self.num_gpus} x", f"{num_gpus} x", 1)
        return replace(self, num_gpus=num_gpus, label=label)


def published_band() -> PlannerBand:
    """The planner against the published cluster results (its goal rows), as a wall-time ratio."""
    rows = [r for r in evaluate_published(search_best=False) if r.row.in_goal]
    ratios = [1.0 + r.error for r in rows]
    return PlannerBand(
        lo=min(ratios),
        hi=max(ratios),
        n=len(ratios),
        within_15=sum(abs(r.error) <= 0.15 for r in rows),
        source="the planner vs published cluster results (docs/planner-at-scale.md)",
    )


def gpu_cluster(
    gpu: str,
    num_gpus: int,
    *,
    gpus_per_node: int | None = None,
    gpu_memory_bytes: int | None = None,
    intra_node_bytes_per_s: float | None = None,
    inter_node_bytes_per_s: float | None = None,
) -> Cluster:
    """A cluster of one GPU type of the planner's table; the keyword values override the table's."""
    if gpu not in GPU_TYPES:
        raise UsageError(f"--gpu {gpu!r} unknown; use one of {', '.join(GPU_TYPES)} or cpu (this machine)")
    if num_gpus < 1:
        raise UsageError(f"--gpus {num_gpus} must be >= 1")
    base, consts = GPU_TYPES[gpu]
    hw = replace(
        base,
        gpus_per_node=gpus_per_node or base.gpus_per_node,
        gpu_memory_bytes=gpu_memory_bytes or base.gpu_memory_bytes,
        intra_node_bytes_per_s=intra_node_bytes_per_s or base.intra_node_bytes_per_s,
        inter_node_bytes_per_s=inter_node_bytes_per_s or base.inter_node_bytes_per_s,
    )
    label = f"{num_gpus} x {gpu} ({hw.gpus_per_node} per node, {hw.gpu_memory_bytes / 2**30:.0f} GiB)"
    return Cluster(label=label, gpu=gpu, num_gpus=num_gpus, hw=hw, consts=consts, band=published_band())


def _machine_memory_bytes() -> int:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _timed_runs(sweep_dir: Path) -> list[tuple[Path, float, float | None]]:
    """(run directory, wall seconds per optimizer step, CPU seconds per step or None where the event
    has none) of the sweep's done runs that timed themselves."""
    out = []
    for ev in store.read_events(sweep_dir):
        if ev.get("event") != "end" or ev.get("status") != "done" or not ev.get("train_s"):
            continue
        run_dir = Path(store.run_path(sweep_dir, ev["run_id"]))
        try:
            steps = build_run_config(json.loads((run_dir / "config.json").read_text())).num_steps
        except (OSError, json.JSONDecodeError, UsageError):
            continue
        cpu = ev.get("train_cpu_s")
        out.append((run_dir, float(ev["train_s"]) / steps, float(cpu) / steps if cpu else None))
    return out


def _step_times(sweep_dir: Path, hw: Hardware) -> tuple[list[Measurement], str]:
    """The sweep's one-process runs as measurements of seconds per step, and the clock they are in:
    CPU seconds when every such run recorded them, else wall seconds (an older store)."""
    runs = [(_measurement(d, wall, hw), wall, cpu) for d, wall, cpu in _timed_runs(sweep_dir)]
    runs = [(m, wall, cpu) for m, wall, cpu in runs if m is not None]
    if runs and all(cpu is not None for _, _, cpu in runs):
        return [replace(m, step_time_s=cpu) for m, _, cpu in runs], "CPU"
    return [m for m, _, _ in runs], "wall"


def _measurement(run_dir: Path, step_s: float, hw: Hardware) -> Measurement | None:
    cfg = json.loads((run_dir / "config.json").read_text())
    par = ParallelConfig(**(cfg.get("parallel") or {}))
    if par.world_size != 1:
        return None  # the CPU plan is one process per run, as the sweep's runs
    seq_len = cfg["data"]["seq_len"]
    sequences = cfg["train"]["global_batch_tokens"] // seq_len
    return Measurement(
        cfg=ModelConfig(**cfg["model"]),
        parallel=par,
        micro_batch_sequences=cfg["train"].get("micro_batch_sequences") or sequences,
        seq_len=seq_len,
        global_batch_sequences=sequences,
        step_time_s=step_s,
        hw=hw,
    )


def _fit_rate(flops_per_step: np.ndarray, step_s: np.ndarray) -> tuple[float, float]:
    """(R FLOP/s, b seconds) of step = flops / R + b, least squares on log step time, b >= 0."""
    r0 = float(np.median(flops_per_step / step_s))

    def resid(x):
        return np.log(flops_per_step / (r0 * x[0]) + x[1]) - np.log(step_s)

    sol = least_squares(resid, [1.0, 0.0], bounds=([1e-3, 0.0], [1e3, float(step_s.max())]))
    return r0 * float(sol.x[0]), float(sol.x[1])


def cpu_cluster(sweep_dir: str | Path) -> Cluster:
    """This machine, one process per run as the sweep's runs, calibrated on their step times."""
    sweep_dir = Path(sweep_dir)
    unit = Hardware(
        gpu_memory_bytes=_machine_memory_bytes(),
        peak_flops=1.0,  # with mfu 1 the planner's one-process step is its hardware FLOPs
        gpus_per_node=1,
        compute_dtype_bytes=4,  # fp32 on CPU
        host_runs_ahead=False,
    )
    consts = CostConstants(mfu=1.0, comm_efficiency=1.0, overhead_bytes=0.0)
    timed, clock = _step_times(sweep_dir, unit)
    if len(timed) < 3:
        raise UsageError(
            f"--gpu cpu: {sweep_dir} has {len(timed)} timed one-process run(s) in events.jsonl; the CPU plan "
            "fits the planner to 3 or more: give a sweep directory whose runs ran here"
        )
    flops = np.array([_step(m, unit, consts) for m in timed])
    measured = np.array([m.step_time_s for m in timed])
    rate, overhead = _fit_rate(flops, measured)
    ratios = measured / (flops / rate + overhead)
    band = PlannerBand(
        lo=float(ratios.min()),
        hi=float(ratios.max()),
        n=len(ratios),
        within_15=int(np.sum(np.abs(ratios - 1) <= 0.15)),
        source=f"the sweep's {len(ratios)} runs on this machine (rate and per-step cost fitted on their "
        f"{clock} seconds)",
        clock=clock,
    )
    hw = replace(unit, peak_flops=rate)
    label = f"1 x cpu (this machine: one process, fp32, {rate / 1e9:.1f} GFLOP/s + {1e3 * overhead:.1f} ms per step"
    label += (
        ", of CPU time: the run alone on one idle core)" if clock == "CPU" else ", of wall time at the sweep's load)"
    )
    return Cluster(label=label, gpu=CPU, num_gpus=1, hw=hw, consts=consts, band=band, step_overhead_s=overhead)


def _step(m: Measurement, hw: Hardware, consts: CostConstants) -> float:
    return estimate(
        m.cfg,
        m.parallel,
        micro_batch_sequences=m.micro_batch_sequences,
        seq_len=m.seq_len,
        global_batch_sequences=m.global_batch_sequences,
        hw=hw,
        consts=consts,
    ).step_time_s
