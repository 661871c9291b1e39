"""Profiling chosen training steps: a torch.profiler trace and a per-rank summary of each step.

    run config:  profile: {steps: [4, 5]}          # or `scalelab profile CONFIG --steps 2`
    train_run(cfg, run_dir)                        # writes <run_dir>/profile/rank<r>/...

The loop opens one `StepProfiler` and runs every step inside `profiler.step(step)`; steps not in
`cfg.profile.steps` pass through untouched. Consecutive profiled steps share one profiler session
(started just before the first, stopped after the last), so a profile costs nothing outside them.
Per rank, each session leaves `trace_<first>-<last>.json` (Chrome trace: chrome://tracing or
ui.perfetto.dev), and `summary.json` holds every profiled step: the time categories from
`scalelab.train.trace_analysis` (compute, communication by collective, exposed communication,
optimizer, data loading, idle) and the peak memory by category.

Memory: parameters, gradients and optimizer state are the bytes of the tensors this rank holds
(local shards; gradients counted when the optimizer step starts, state after it ends). The peak is
the allocator's (CUDA: `max_memory_allocated` over the step; CPU: the profiler's allocation events,
which count bytes allocated while profiling, added to the state held when the step started), and
"activations" is what the peak holds beyond that state: saved activations plus temporaries.
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from scalelab.train.trace_analysis import STEP_PREFIX, analyse_trace

REGION_PREFIX = "scalelab/"


def region(name: str):
    """Label a part of the step in the trace (`scalelab/<name>`; the analysis reads `data`)."""
    return record_function(REGION_PREFIX + name)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t` (a DTensor's local shard)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def matmul_flops(n: int = 512, reps: int = 10) -> float:
    """FLOP/s of an n x n fp32 matmul in this process (the CPU "peak" the planner divides by)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def all_reduce_seconds(numel: int, reps: int = 5) -> float:
    """Median seconds of an fp32 all-reduce of `numel` elements over the default process group
    (after one warm-up call; a barrier before each). Every rank must call it."""
    x = torch.ones(numel)
    times = []
    for i in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bus_bandwidth(numel: int = 2**18, reps: int = 5) -> float:
    """All-reduce bus bandwidth of the default process group (bytes/s per rank, NCCL-tests' definition:
    2(n-1)/n x the buffer over the median time). Every rank must call it."""
    n = dist.get_world_size()
    return 2 * (n - 1) / n * numel * 4 / all_reduce_seconds(numel, reps)


def step_latency(reps: int = 20) -> float:
    """Seconds per ring step of an all-reduce too small for its bytes to count (one element):
    the planner's alpha for this link (its all-reduce takes 2(n-1) steps). Every rank must call it."""
    return all_reduce_seconds(1, reps) / (2 * (dist.get_world_size() - 1))


def measure_cpu() -> dict[str, float]:
    """This CPU as the planner's hardware: a matmul rate, and gloo's bandwidth and per-step latency
    between the ranks."""
    out = {"matmul_flops": matmul_flops()}
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        out["bus_bytes_per_s"] = bus_bandwidth()
        out["step_latency_s"] = step_latency()
    return out


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def state_bytes_held(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes this rank holds now (gradients: those present)."""
    params = _params(optimizer)
    opt = sum(tensor_bytes(v) for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    return {
        "params": sum(tensor_bytes(p) for p in params),
        "grads": sum(tensor_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": opt,
    }


class StepProfiler:
    """Profiles the steps of `steps` (see the module docstring); a no-op for the others."""

    def __init__(self, steps: list[int], out_dir: Path, optimizer: torch.optim.Optimizer, device: torch.device, *,
                 rank: int, memory: bool = True, meta: dict[str, Any] | None = None):  # fmt: skip
        self.steps = sorted(set(steps))
        self.out_dir = out_dir
        self.optimizer = optimizer
        self.device = device
        self.rank = rank
        self.memory = memory
        self.meta = meta or {}
        self._prof: profile | None = None
        self._session: list[dict[str, Any]] = []  # the steps of the open session
        self.records: list[dict[str, Any]] = []
        self._grads = 0
        self._hooks = []

    @classmethod
    def open(cls, cfg, run_dir: Path, optimizer, runtime, meta: dict[str, Any] | None = None) -> StepProfiler:
        return cls(
            list(cfg.profile.steps),
            Path(run_dir) / "profile" / f"rank{runtime.rank}",
            optimizer,
            runtime.device,
            rank=runtime.rank,
            memory=cfg.profile.memory,
            meta=meta,
        )

    @contextmanager
    def step(self, step: int):
        if step not in self.steps:
            yield
            return
        if self._prof is None:
            self._start()
        held = state_bytes_held(self.optimizer)  # before the step: parameters and optimizer state
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        with record_function(f"{STEP_PREFIX}{step}"):
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - t0
        rec = {"step": step, "wall_s": wall, "held_at_start": held, "grads": self._grads}
        rec["optimizer"] = state_bytes_held(self.optimizer)["optimizer"]
        if self.device.type == "cuda":
            rec["peak_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        self._session.append(rec)
        if step + 1 not in self.steps:
            self._stop()

    def _start(self) -> None:
        if self.device.type == "cpu" and "hardware" not in self.meta:  # before the trace starts
            self.meta["hardware"] = measure_cpu()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        self._prof = profile(activities=acts, profile_memory=self.memory, record_shapes=False)
        self._hooks = [self.optimizer.register_step_pre_hook(self._count_grads)]
        self._prof.__enter__()

    def _count_grads(self, *_args) -> None:
        self._grads = state_bytes_held(self.optimizer)["grads"]

    def _stop(self) -> None:
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        for h in self._hooks:
            h.remove()
        steps = [r["step"] for r in self._session]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"trace_{steps[0]}-{steps[-1]}.json"
        prof.export_chrome_trace(str(trace))
        analysed = analyse_trace(json.loads(trace.read_text()), device=self.device.type)
        for rec in self._session:
            a = analysed.get(rec["step"])
            if a is None:
                continue
            rec.update(
                times=a.times, comm_by_collective=a.comm_by_collective, exposed_by_collective=a.exposed_by_collective
            )
            rec["trace_step_s"] = a.step_s
            held = rec.pop("held_at_start")
            if "peak_bytes" not in rec and a.peak_alloc_bytes is not None:
                rec["peak_bytes"] = held["params"] + held["optimizer"] + held["grads"] + a.peak_alloc_bytes
            rec["memory"] = _memory_categories(
                held["params"], rec.pop("grads"), rec.pop("optimizer"), rec.get("peak_bytes")
            )
            rec["trace"] = trace.name
        self.records += self._session
        self._session = []
        self._write()

    def _write(self) -> None:
        doc = {"rank": self.rank, "device": self.device.type, **self.meta, "steps": self.records}
        tmp = self.out_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.out_dir / "summary.json")

    def close(self) -> None:
        """Stop a session left open (the run ended inside it)."""
        if self._prof is not None and self._session:
            self._stop()
        elif self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._prof = None


def _memory_categories(params: int, grads: int, optimizer: int, peak: int | None) -> dict[str, int | None]:
    acts = None if peak is None else max(peak - params - grads - optimizer, 0)
    return {"params": params, "grads": grads, "optimizer": optimizer, "activations": acts, "peak": peak}
