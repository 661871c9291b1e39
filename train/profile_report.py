"""A profiled run's tables beside the layout planner's estimate, and a plot.

    report = build_report(run_dir, hw, consts)     # reads <run_dir>/profile/rank*/summary.json
    print(format_report(report)); plot_report(report, run_dir / "profile" / "profile.png")
    hw = cpu_hardware(load_rank_summaries(run_dir))  # this machine, as the ranks measured it

Per rank, the mean over the profiled steps of each time category (scalelab.train.trace_analysis)
and of the memory by category (scalelab.train.profiling), with the planner's estimate for the same
model, layout and batch as the last row (scalelab.parallel.planner.estimate for time; memory from
scalelab.parallel.planner_memory with the kernels and activation dtype this device runs: the torch
reference ops in fp32 on CPU, the fused kernels in bf16 on GPU). The measured step time without
the profiler (median of the unprofiled steps after the first) is printed beside the profiled one:
recording every op and allocation slows a step down.

On CPU the planner's hardware is this machine as the ranks measured it just before profiling:
`peak_flops` a one-thread fp32 matmul rate, the link bandwidth gloo's all-reduce bus bandwidth
between the job's own processes (comm_efficiency 1: the measurement already is what collectives
reach), gloo's latency per ring step (a one-element all-reduce), fp32 on the wire, and no forward
prefetch of FSDP's all-gathers (CPU ops run on the calling thread, so nothing queues ahead).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from scalelab.models.config import ModelConfig
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.dims import num_microbatches
from scalelab.parallel.layouts import layout_name
from scalelab.parallel.planner import CostConstants, Hardware, Measurement, calibrate, estimate
from scalelab.parallel.planner_memory import activation_bytes, layer_param_count, state_bytes
from scalelab.train.config import build_run_config
from scalelab.train.trace_analysis import CATEGORIES

MIB = 2**20
# gloo's latency per ring step between two processes on a 2-core CPU machine, for summaries recorded
# before the ranks measured it: the median of three fits of experiments/planner_calibrate.py --gloo (the
# intercept of all-reduce time vs bytes; the fits are in docs/benchmarks.md)
GLOO_STEP_LATENCY_S = 1.6e-4
MEMORY = ("params", "grads", "optimizer", "activations", "peak")


@dataclass(kw_only=True, slots=True)
class ProfileReport:
    layout: str
    device: str
    ranks: list[dict]  # per rank: times (s), comm/exposed by collective (s), memory (bytes), step_s
    planner: dict  # step_s, times, comm_bytes, memory (bytes)
    unprofiled_step_s: float | None
    profiled_steps: list[int] = field(default_factory=list)
    hardware: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {f: getattr(self, f) for f in self.__slots__}


# --- this machine as the planner's hardware --------------------------------------------------------
def cpu_hardware(summaries: list[dict]) -> Hardware:
    """This CPU as the planner's hardware, from what the ranks measured when profiling began
    (scalelab.train.profiling.measure_cpu): every rank on one node, memory unbounded."""
    measured = [s.get("hardware") or {} for s in summaries]
    peak = min((m["matmul_flops"] for m in measured if m.get("matmul_flops")), default=Hardware().peak_flops)
    bw = min((m["bus_bytes_per_s"] for m in measured if m.get("bus_bytes_per_s")), default=1e9)
    alpha = max((m["step_latency_s"] for m in measured if m.get("step_latency_s")), default=GLOO_STEP_LATENCY_S)
    return Hardware(
        gpu_memory_bytes=2**50,
        peak_flops=peak,
        gpus_per_node=max(len(summaries), 1),
        intra_node_bytes_per_s=bw,
        inter_node_bytes_per_s=bw,
        collective_latency_s=0.0,  # gloo's whole small-message cost is in the per-step figure
        intra_node_step_latency_s=alpha,
        inter_node_step_latency_s=alpha,
        compute_dtype_bytes=4,  # fp32 activations and parameters on the wire
        host_runs_ahead=False,  # ops run on the calling thread: FSDP's forward gathers wait
    )


def cpu_constants(hw: Hardware, calibrate_from: list[Path] | None = None) -> CostConstants:
    """Constants for CPU runs: measured bandwidth (efficiency 1), no CUDA overhead; `mfu` refitted from
    the unprofiled step times of `calibrate_from` (profile or run directories) when given, each on the
    hardware its own ranks measured (else `hw`)."""
    consts = CostConstants(comm_efficiency=1.0, overhead_bytes=0.0)
    measured = []
    for d in calibrate_from or []:
        summaries = load_rank_summaries(Path(d))
        own = cpu_hardware(summaries) if summaries and summaries[0].get("hardware") else hw
        measured.append(_measurement(Path(d), own))
    measured = [m for m in measured if m]
    return calibrate(measured, consts) if measured else consts


# --- reading a profiled run --------------------------------------------------------------------------
def _run_config(run_dir: Path):
    return build_run_config(json.loads((run_dir / "config.json").read_text()))


def unprofiled_step_s(run_dir: Path, profiled: list[int], skip_steps: int = 1) -> float | None:
    """Median wall time of the steps the profiler did not record (after `skip_steps` warm-up steps)."""
    path = run_dir / "metrics.parquet"
    if not path.exists():
        return None
    cfg = _run_config(run_dir)
    m = pl.read_parquet(path).filter((pl.col("step") > skip_steps) & ~pl.col("step").is_in(profiled))
    if m.is_empty():
        return None
    return float(cfg.tokens_per_step / m["tokens_per_s"].median())


def micro_batch_sequences(cfg) -> int:
    """Sequences per forward/backward on one rank as the planner counts them (a run config's
    micro-batch, split again into the pipeline's micro-batches under pp)."""
    micro = cfg.train.micro_batch_sequences or cfg.global_batch_sequences // cfg.parallel.dp_size
    if cfg.parallel.pp > 1:
        micro //= num_microbatches(cfg.parallel, cfg.parallel.pp)
    return micro


def _measurement(run_dir: Path, hw: Hardware) -> Measurement | None:
    cfg = _run_config(run_dir)
    step_s = unprofiled_step_s(run_dir, list(cfg.profile.steps))
    if step_s is None:
        return None
    return Measurement(
        cfg=cfg.model,
        parallel=cfg.parallel,
        micro_batch_sequences=micro_batch_sequences(cfg),
        seq_len=cfg.seq_len,
        global_batch_sequences=cfg.global_batch_sequences,
        step_time_s=step_s,
        hw=hw,
    )


def load_rank_summaries(run_dir: Path) -> list[dict]:
    out = []
    for path in sorted((run_dir / "profile").glob("rank*/summary.json"), key=lambda p: int(p.parent.name[4:])):
        out.append(json.loads(path.read_text()))
    return out


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _rank_row(summary: dict) -> dict:
    steps = [s for s in summary["steps"] if "times" in s]
    collectives = sorted({c for s in steps for c in s["comm_by_collective"]})
    return {
        "rank": summary["rank"],
        "step_s": _mean([s["trace_step_s"] for s in steps]),
        "wall_s": _mean([s["wall_s"] for s in steps]),
        "times": {c: _mean([s["times"][c] for s in steps]) for c in CATEGORIES},
        "comm_by_collective": {c: _mean([s["comm_by_collective"].get(c, 0.0) for s in steps]) for c in collectives},
        "exposed_by_collective": {
            c: _mean([s["exposed_by_collective"].get(c, 0.0) for s in steps]) for c in collectives
        },
        "memory": {k: max((s["memory"][k] or 0) for s in steps) if steps else None for k in MEMORY},
    }


# --- the planner's side ------------------------------------------------------------------------------
def planner_side(model: ModelConfig, lay: ParallelConfig, *, seq_len: int, global_batch_sequences: int,
                 micro_batch_sequences: int, device: str, hw: Hardware, consts: CostConstants) -> dict:  # fmt: skip
    """The planner's step time and per-rank memory for one layout, in the dtype `device` runs."""
    plan = estimate(model, lay, micro_batch_sequences=micro_batch_sequences, seq_len=seq_len,
                    global_batch_sequences=global_batch_sequences, hw=hw, consts=consts)  # fmt: skip
    memory = dict(plan.memory)
    if device != "cuda":  # fp32 everywhere, the torch reference ops, no CUDA context
        state = state_bytes(model, lay, seq_len=seq_len)
        saved, transient = activation_bytes(model, lay, seq_len, micro_batch_sequences=micro_batch_sequences,
                                            kernels="torch", act=4)  # fmt: skip
        block = layer_param_count(model, lay) if lay.dp_shard * lay.cp > 1 else 0
        memory = {
            "params": float(state.param_bytes),
            "grads": float(state.grad_bytes),
            "optimizer": float(state.optim_bytes),
            "activations": saved * consts.activation_scale,
            "buffers": 3 * 4 * block + transient,  # two gathered fp32 blocks + one block's gradients
        }
        memory["total"] = sum(memory.values())
    parts = plan.time_parts
    comm = sum(v for k, v in parts.items() if k.startswith("comm_"))
    return {
        "step_s": plan.step_time_s,
        "times": {"compute": parts["compute"], "comm_exposed": comm, "idle": parts["bubble"]},
        "comm_exposed_by_axis": {k[5:]: v for k, v in parts.items() if k.startswith("comm_")},
        "comm_bytes": plan.comm_bytes,
        "memory": memory,
    }


def build_report(run_dir: str | Path, hw: Hardware, consts: CostConstants) -> ProfileReport:
    run_dir = Path(run_dir)
    cfg = _run_config(run_dir)
    summaries = load_rank_summaries(run_dir)
    if not summaries:
        raise FileNotFoundError(f"{run_dir}/profile has no rank*/summary.json (was profile.steps set?)")
    device = summaries[0]["device"]
    planner = planner_side(cfg.model, cfg.parallel, seq_len=cfg.seq_len,
                           global_batch_sequences=cfg.global_batch_sequences,
                           micro_batch_sequences=micro_batch_sequences(cfg),
                           device=device, hw=hw, consts=consts)  # fmt: skip
    return ProfileReport(
        layout=layout_name(cfg.parallel),
        device=device,
        ranks=[_rank_row(s) for s in summaries],
        planner=planner,
        unprofiled_step_s=unprofiled_step_s(run_dir, list(cfg.profile.steps)),
        profiled_steps=sorted({s["step"] for r in summaries for s in r["steps"]}),
        hardware={k: getattr(hw, k) for k in hw.__slots__},
        constants={k: getattr(consts, k) for k in consts.__slots__},
    )


# --- tables and the plot -----------------------------------------------------------------------------
def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1e3:.1f}"


def _mib(v: float | None) -> str:
    return "—" if v is None else f"{v / MIB:.2f}"


def format_report(r: ProfileReport) -> str:
    """Two markdown tables (time in ms, memory in MiB): one row per rank, the planner's last."""
    collectives = sorted({c for row in r.ranks for c in row["comm_by_collective"]})
    head = "| rank | step | compute | comm exposed | optimizer | data | idle |"
    head += "".join(f" {c} (exposed) |" for c in collectives)
    lines = [
        f"layout {r.layout} on {r.device}; profiled steps {r.profiled_steps}; time in ms (mean of those steps)",
        "",
        head,
        "|" + "---|" * (7 + len(collectives)),
    ]
    for row in r.ranks:
        t = row["times"]
        cells = [str(row["rank"]), _ms(row["step_s"])] + [_ms(t[c]) for c in CATEGORIES]
        cells += [f"{_ms(row['comm_by_collective'][c])} ({_ms(row['exposed_by_collective'][c])})"
                  if c in row["comm_by_collective"] else "0" for c in collectives]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    p = r.planner
    cells = ["planner", _ms(p["step_s"]), _ms(p["times"]["compute"]), _ms(p["times"]["comm_exposed"]), "—", "—",
             _ms(p["times"]["idle"]) + " (bubble)"] + ["" for _ in collectives]  # fmt: skip
    lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"unprofiled step (median of the other steps after the first): {_ms(r.unprofiled_step_s)} ms; "
                 f"planner: {_ms(p['step_s'])} ms")  # fmt: skip
    if p["comm_bytes"]:
        lines.append("planner communication per rank per step: " + ", ".join(
            f"{k} {v / MIB:.2f} MiB (exposed {_ms(p['comm_exposed_by_axis'].get(k, 0.0))} ms)"
            for k, v in p["comm_bytes"].items()))  # fmt: skip
    lines += [
        "",
        "memory in MiB (peak over the profiled steps; activations = peak - parameters - gradients - "
        "optimizer state, temporaries included)",
        "",
        "| rank | params | grads | optimizer | activations | buffers | peak |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r.ranks:
        m = row["memory"]
        lines.append(f"| {row['rank']} | " + " | ".join(_mib(m[k]) for k in MEMORY[:4]) + f" | — | {_mib(m['peak'])} |")
    m = p["memory"]
    lines.append("| planner | " + " | ".join(_mib(m[k]) for k in ("params", "grads", "optimizer", "activations",
                                                                     "buffers", "total")) + " |")  # fmt: skip
    return "\n".join(lines)


def plot_report(r: ProfileReport, path: str | Path) -> Path:
    """Stacked bars of the time categories per rank and the planner's estimate."""
    import matplotlib  # start-up time: only the plot needs it; the backend is chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"rank {row['rank']}" for row in r.ranks] + ["planner"]
    rows = [row["times"] for row in r.ranks] + [dict.fromkeys(CATEGORIES, 0.0) | r.planner["times"]]
    fig, ax = plt.subplots(figsize=(7.2, 0.6 * len(labels) + 1.8))
    left = [0.0] * len(labels)
    for cat in CATEGORIES:
        vals = [(row.get(cat) or 0.0) * 1e3 for row in rows]
        ax.barh(labels, vals, left=left, label=cat.replace("_", " "))
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("ms per step")
    ax.set_title(f"{r.layout} ({r.device}): where a step's time goes")
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=len(CATEGORIES), loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dir: str | Path, hw: Hardware, consts: CostConstants) -> tuple[ProfileReport, str]:
    """Build the report; write profile/report.md, report.json and profile.png; return it and its text."""
    run_dir = Path(run_dir)
    report = build_report(run_dir, hw, consts)
    text = format_report(report)
    (run_dir / "profile" / "report.md").write_text(text + "\n")
    (run_dir / "profile" / "report.json").write_text(json.dumps(report.as_dict(), indent=1))
    plot_report(report, run_dir / "profile" / "profile.png")
    return report, text
