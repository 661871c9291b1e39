"""`scalelab sweep plan`: the dry run. Every run expanded and validated, a table, the total cost.

    rows, totals = dry_run_table(load_sweep("isoflop.yaml"))
    print(format_dry_run(rows, totals))

Columns: run id, N (total parameters), D (tokens), C (6ND; a cooldown branch shows its own C but
costs only its tail), the layout, memory (estimate) and the estimated time. Time comes from
*measured* throughput: a few optimizer steps of each distinct model shape are timed in this process
with the run's thread count (the fastest of three blocks, so other load on the machine does not
inflate it: on a busy machine the real runs take longer; training steps only: evals and
checkpoints add a few percent), and runs of the same shape share the figure. `measure=False`
skips that and shows no times.

A study (`study:` arms, scalelab.sweeps.studies.study_spec) adds its cost per arm below the total.

Memory (per rank, the fullest one): scalelab.parallel.planner_memory's model of the layout (exact
fp32 parameter, gradient and AdamW state bytes; activations saved for backward per micro-batch);
a run whose figure exceeds this machine's RAM (CPU) is flagged in the warnings.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from scalelab.config_tree import from_dict
from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.layouts import layout_name
from scalelab.parallel.planner_memory import activation_bytes, state_bytes
from scalelab.sweeps.specs.runspec import RunSpec
from scalelab.sweeps.specs.spec import Sweep
from scalelab.train.config import build_run_config
from scalelab.train.optim import build_optimizer


def _shape_key(run: RunSpec) -> tuple:
    m, d, t = run.config["model"], run.config["data"], run.config["train"]
    return (
        tuple(sorted(m.items())),
        d["seq_len"],
        t["global_batch_tokens"],
        t["num_threads"],
        t["micro_batch_sequences"],
    )


def measure_tokens_per_s(config: dict[str, Any], steps: int = 3) -> float:
    """Tokens per second of `steps` optimizer steps on random tokens in this process (after one
    warm-up step; the fastest of three blocks)."""
    cfg = build_run_config(config)
    threads = torch.get_num_threads()
    if cfg.train.num_threads > 0:
        torch.set_num_threads(cfg.train.num_threads)
    try:
        device = torch.device("cuda" if torch.cuda.is_available() and cfg.train.device != "cpu" else "cpu")
        model = build_model(cfg.model, device=device, seed=0)
        opt = build_optimizer(model, cfg.optim, device.type)
        seqs = cfg.global_batch_sequences
        micro = cfg.train.micro_batch_sequences or seqs
        x = torch.randint(0, cfg.model.vocab_size, (seqs, cfg.seq_len + 1), device=device)

        def step():
            for chunk in x.split(micro):
                loss, _ = lm_loss(model, chunk[:, :-1], chunk[:, 1:])
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        best = float("inf")
        for _ in range(3):  # the fastest of 3 blocks: other processes only ever slow a block down
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return steps * cfg.tokens_per_step / best
    finally:
        torch.set_num_threads(threads)


def _parallel(run: RunSpec) -> ParallelConfig:
    return from_dict(ParallelConfig, run.config.get("parallel") or {}, "parallel")


def memory_bytes(run: RunSpec) -> float:
    """Bytes on the fullest rank: scalelab.parallel.planner_memory's exact state + activation model."""
    pcfg = _parallel(run)
    seq = run.config["data"]["seq_len"]
    local = run.config["train"]["global_batch_tokens"] // seq // pcfg.dp_size
    micro = run.config["train"]["micro_batch_sequences"] or local
    cfg = ModelConfig(**run.config["model"])
    saved, transient = activation_bytes(cfg, pcfg, seq, micro_batch_sequences=micro)
    return state_bytes(cfg, pcfg, seq_len=seq).total_bytes + saved + transient


def layout(run: RunSpec, cpus: int, gpus: float) -> str:
    """The run's layout name (scalelab.parallel.layouts) and its processes, or the one process's devices."""
    pcfg = _parallel(run)
    if pcfg.world_size == 1:
        return f"1 proc, {f'{gpus:g} gpu' if gpus else f'{cpus} cpu'}"
    return f"{layout_name(pcfg)} ({pcfg.world_size} procs)"


def dry_run_table(sweep: Sweep, *, measure: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows of the plan table and the totals (FLOPs spent, estimated serial and wall time)."""
    speed: dict[tuple, float] = {}
    if measure:
        for run in sweep.runs:
            key = _shape_key(run)
            if key not in speed:
                speed[key] = measure_tokens_per_s(run.config)
    ex = sweep.execution
    rows = []
    for run in sweep.runs:
        own_tokens = run.num_tokens * (run.cost_flops / run.flops_6n if run.flops_6n else 1.0)
        tps = speed.get(_shape_key(run))
        rows.append(
            dict(
                run_id=run.run_id,
                params=run.params,
                tokens=run.num_tokens,
                flops=run.flops_6n,
                cost_flops=run.cost_flops,
                layout=layout(run, ex.cpus_per_run, ex.gpus_per_run),
                memory_gib=memory_bytes(run) / 2**30,
                est_s=own_tokens / tps if tps else None,
                tokens_per_s=tps,
                label=_label(run.labels),
                steps=run.num_tokens // run.config["train"]["global_batch_tokens"],
                batch_tokens=run.config["train"]["global_batch_tokens"],
                warmup_steps=_warmup_steps(run),
                lr=run.config["optim"]["lr"],
            )
        )
    totals = dict(_totals(rows, measure), warnings=list(sweep.warnings))
    if sweep.study is not None:  # a study's cost per arm (its arms run the same design)
        totals["arms"] = {
            arm: _totals([r for r, run in zip(rows, sweep.runs) if run.labels.get("arm") == arm], measure)
            for arm in sweep.study.names
        }
    return rows, totals


def _totals(rows: list[dict[str, Any]], measure: bool) -> dict[str, Any]:
    serial = sum(r["est_s"] for r in rows if r["est_s"] is not None) if measure else None
    return dict(num_runs=len(rows), cost_flops=sum(r["cost_flops"] for r in rows), serial_s=serial)


def _warmup_steps(run: RunSpec) -> int:
    sched, batch = run.config["schedule"], run.config["train"]["global_batch_tokens"]
    tokens = sched["warmup_tokens"] or int(sched["warmup_fraction"] * run.config["train"]["num_tokens"])
    return tokens // batch


def _machine_ram_bytes() -> float | None:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _label(labels: dict[str, Any]) -> str:
    parts = [f"arm={labels['arm']}"] if "arm" in labels else []
    if "flops_budget" in labels:
        parts.append(f"C={labels['flops_budget']:.2g}")
    if "tokens_per_param" in labels:
        parts.append(f"D/N={labels['tokens_per_param']:g}")
    if labels.get("cooldown") == "branch":
        parts.append(f"branch@{labels['branch_step']}")
    elif labels.get("cooldown") == "stable":
        parts.append("stable")
    for k in (
        "seed",
        "data_seed",
        "lr",
        "d_model",
        "global_batch_tokens",
        "sample",
        "proposal",
        "mixture",
        "epochs",
        "audit",
        "lr_multiplier",
        "wd_timescale",
        "beta2",
        "layers",
    ):
        if k in labels:
            v = labels[k]
            parts.append(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.1f}s" if s < 10 else f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}m" if s < 7200 else f"{s / 3600:.1f}h"


def format_dry_run(rows: list[dict[str, Any]], totals: dict[str, Any], slots: int | None = None) -> str:
    head = (
        f"{'run_id':12s}  {'N':>10s}  {'D':>10s}  {'C (6ND)':>9s}  {'steps':>6s}  {'batch':>6s}  {'warm':>4s}  "
        f"{'lr':>7s}  {'layout':14s}  {'mem':>7s}  {'est':>6s}  design"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['run_id']:12s}  {r['params']:>10,d}  {r['tokens']:>10,d}  {r['flops']:>9.3g}  {r['steps']:>6d}  "
            f"{r['batch_tokens']:>6d}  {r['warmup_steps']:>4d}  {r['lr']:>7.2g}  {r['layout']:14s}  "
            f"{r['memory_gib'] * 1024:>5.0f}Mi  {_fmt_s(r['est_s']):>6s}  {r['label']}"
        )
    total = f"{totals['num_runs']} runs, {totals['cost_flops']:.3g} FLOPs (6ND, branches count their tail only)"
    if totals.get("serial_s") is not None:
        total += f", ~{_fmt_s(totals['serial_s'])} of training one after another"
        if slots:
            total += f", ~{_fmt_s(totals['serial_s'] / slots)} on {slots} concurrent slots"
    lines.append(total)
    for arm, t in (totals.get("arms") or {}).items():
        line = f"  arm {arm}: {t['num_runs']} runs, {t['cost_flops']:.3g} FLOPs"
        if t.get("serial_s") is not None:
            line += f", ~{_fmt_s(t['serial_s'])} of training one after another"
        lines.append(line)
    lines += [f"warning: {w}" for w in totals.get("warnings", [])]
    return "\n".join(lines)
