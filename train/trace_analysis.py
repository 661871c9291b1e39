"""Where a profiled step's time went, read from a torch.profiler Chrome trace.

    steps = analyse_trace(json.loads(Path("trace_4-5.json").read_text()), device="cpu")
    steps[4].times        # {"compute": s, "comm_exposed": s, "optimizer": s, "data": s, "idle": s}
    steps[4].comm_by_collective, steps[4].exposed_by_collective, steps[4].peak_alloc_bytes

A step is the `scalelab/step#N` range (scalelab.train.profiling). Its wall time is split into five
parts that never overlap and sum to it exactly:
  data          the `scalelab/data` range (the sampler and the host-to-device copy);
  optimizer     `Optimizer.step#...` and `Optimizer.zero_grad#...` (torch labels them itself);
                on GPU both are the ranges of their kernels on the device timeline;
  compute       time the device computes, outside those two. CPU: the main thread inside an op that
                is not a collective or a wait for one (ops nest, e.g. a DTensor matmul waiting on
                its all-gather; the collective part is carved out). GPU: non-NCCL kernels and copies;
  comm_exposed  communication while nothing computes: collective intervals minus compute;
  idle          the rest (Python between ops, launch gaps, pipeline bubbles, stragglers).
Communication by collective is the union of each collective's intervals inside the step, hidden
or not, with its exposed part beside it. The intervals are gloo's own ranges (`gloo:all_reduce`
on its worker threads, `gloo:send`/`gloo:recv` on the calling thread), each named after the c10d
op that queued it, or NCCL kernels on GPU; when a trace has neither, the calling thread's c10d ops
stand in. Collectives can run concurrently, so the per-collective rows may sum to more than the
exposed total. A rank waiting in a collective for a slower one counts that wait as communication.

Memory (CPU): the profiler's allocation events carry the allocator's running total of bytes
allocated since profiling began; the step's peak is its maximum inside the step minus its value
when the step started.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

STEP_PREFIX = "scalelab/step#"
DATA_REGION = "scalelab/data"
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#")
# Collective ops and waits on the calling thread (CPU ops); their time is not compute.
_COMM_OP = re.compile(r"^(c10d::|_c10d_functional::|c10d_functional::|record_param_comms|nccl:|gloo:)|wait_tensor")
_COLLECTIVES = (
    ("reduce_scatter", re.compile(r"reduce_?scatter|ReduceScatter", re.I)),
    ("all_gather", re.compile(r"all_?gather|allgather", re.I)),
    ("all_reduce", re.compile(r"all_?reduce|AllReduce", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all|alltoall", re.I)),
    ("send_recv", re.compile(r"send|recv|SendRecv", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("barrier", re.compile(r"barrier", re.I)),
)
CATEGORIES = ("compute", "comm_exposed", "optimizer", "data", "idle")

Intervals = list[tuple[float, float]]


# --- interval algebra (microseconds) ---------------------------------------------------------------
def union(iv: Intervals) -> Intervals:
    out: Intervals = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def subtract(iv: Intervals, minus: Intervals) -> Intervals:
    """Parts of union(iv) not covered by union(minus)."""
    out, minus = [], union(minus)
    for a, b in union(iv):
        for c, d in minus:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    return [(max(a, lo), min(b, hi)) for a, b in iv if b > lo and a < hi]


def length(iv: Intervals) -> float:
    return sum(b - a for a, b in union(iv))


# --- the trace ---------------------------------------------------------------------------------------
def collective_of(name: str) -> str | None:
    """'gloo:all_reduce', 'c10d::_allgather_base_', 'ncclDevKernel_ReduceScatter_...' -> a collective name."""
    if not (_COMM_OP.search(name) or name.startswith(("nccl", "ncclDevKernel", "ncclKernel"))):
        return None
    if "wait" in name:
        return "wait"
    for label, pat in _COLLECTIVES:
        if pat.search(name):
            return label
    return "other"


@dataclass(kw_only=True, slots=True)
class StepProfile:
    step: int
    step_s: float
    times: dict[str, float]  # CATEGORIES, seconds, summing to step_s
    comm_by_collective: dict[str, float] = field(default_factory=dict)  # seconds, hidden or exposed
    exposed_by_collective: dict[str, float] = field(default_factory=dict)
    comm_total_s: float = 0.0  # union of all communication intervals
    peak_alloc_bytes: int | None = None  # CPU: bytes allocated at the step's peak beyond its start (None:
    # the trace has no allocation events)


def _spans(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def analyse_trace(trace: dict, device: str = "cpu") -> dict[int, StepProfile]:
    """One StepProfile per `scalelab/step#N` range in the trace (see the module docstring)."""
    events = trace.get("traceEvents", [])
    spans = _spans(events)
    steps = [e for e in spans if e["name"].startswith(STEP_PREFIX) and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        return {}
    main_tid = steps[0]["tid"]
    main = [e for e in spans if e["tid"] == main_tid]
    ops = [(e["ts"], e["ts"] + e["dur"]) for e in main if e.get("cat") == "cpu_op" and not _COMM_OP.search(e["name"])]
    blocking = [(e["ts"], e["ts"] + e["dur"]) for e in main if e.get("cat") == "cpu_op" and _COMM_OP.search(e["name"])]
    # GPU: a labelled range's kernels appear as a `gpu_user_annotation` on the device timeline; the
    # host range only covers their launches
    regions = main
    if device == "cuda" and any(e.get("cat") == "gpu_user_annotation" for e in spans):
        regions = [e for e in spans if e.get("cat") == "gpu_user_annotation"]
    data = [(e["ts"], e["ts"] + e["dur"]) for e in regions if e["name"] == DATA_REGION]
    optim = [(e["ts"], e["ts"] + e["dur"]) for e in regions if e["name"].startswith(OPTIMIZER_PREFIXES)]
    comm_named = _comm_intervals(spans, main_tid, device)
    if device == "cuda":
        kernels = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        compute_raw = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if collective_of(e["name"]) is None]
    else:
        compute_raw = subtract(ops, blocking)
    memory = sorted(
        (e["ts"], e["args"].get("Total Allocated", 0))
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
    )
    out = {}
    for s in steps:
        lo, hi = s["ts"], s["ts"] + s["dur"]
        step_no = int(s["name"][len(STEP_PREFIX) :])
        d = union(clip(data, lo, hi))
        o = subtract(clip(optim, lo, hi), d)
        k = subtract(clip(compute_raw, lo, hi), d + o)
        comm_all = [iv for ivs in comm_named.values() for iv in clip(ivs, lo, hi)]
        exposed = subtract(comm_all, k + d + o)
        busy = d + o + k + exposed
        times = {
            "compute": length(k),
            "comm_exposed": length(exposed),
            "optimizer": length(o),
            "data": length(d),
            "idle": (hi - lo) - length(busy),
        }
        by, exp_by = {}, {}
        for name, ivs in comm_named.items():
            mine = clip(ivs, lo, hi)
            if mine:
                by[name] = length(mine) / 1e6
                exp_by[name] = length(subtract(mine, k + d + o)) / 1e6
        out[step_no] = StepProfile(
            step=step_no,
            step_s=(hi - lo) / 1e6,
            times={c: times[c] / 1e6 for c in CATEGORIES},
            comm_by_collective=by,
            exposed_by_collective=exp_by,
            comm_total_s=length(comm_all) / 1e6,
            peak_alloc_bytes=_peak_alloc(memory, lo, hi) if memory and device != "cuda" else None,
        )
    return out


def _comm_intervals(spans: list[dict], main_tid, device: str) -> dict[str, Intervals]:
    """Collective name -> its intervals: gloo worker ranges or NCCL kernels; else the caller's c10d ops.

    A gloo range is named after the c10d op that queued it (the latest one started before it): gloo
    runs a reduce-scatter as `gloo:all_reduce`, while the caller says `c10d::_reduce_scatter_base_`.
    """
    calls = sorted(
        (e["ts"], collective_of(e["name"]))
        for e in spans
        if e["tid"] == main_tid
        and e.get("cat") == "cpu_op"
        and collective_of(e["name"]) not in (None, "wait", "other")  # not the functional wrappers
    )
    if device == "cuda":
        own = [e for e in spans if e.get("cat") == "kernel" and collective_of(e["name"]) not in (None, "wait")]
    else:  # worker threads run collectives; send/recv run on the calling thread
        own = [e for e in spans if e["name"].startswith("gloo:")]
    if not own:  # no worker or kernel ranges: the calling thread's ops
        own = [e for e in spans if e["tid"] == main_tid and e.get("cat") == "cpu_op" and collective_of(e["name"])]
    starts = [t for t, _ in calls]
    out: dict[str, Intervals] = {}
    for e in own:
        name = collective_of(e["name"]) or "other"
        if device != "cuda" and e["name"].startswith("gloo:"):
            i = bisect_right(starts, e["ts"]) - 1
            name = calls[i][1] if i >= 0 else name
        out.setdefault(name, []).append((e["ts"], e["ts"] + e["dur"]))
    return out


def _peak_alloc(memory: list[tuple[float, int]], lo: float, hi: float) -> int:
    before = [v for t, v in memory if t < lo]
    start = before[-1] if before else 0
    inside = [v for t, v in memory if lo <= t <= hi]
    return max([start, *inside]) - start
