"""`scalelab profile CONFIG [--layout NAME] [--steps N]`: where each rank's step time and memory go, beside the planner.

Trains CONFIG for W warm-up steps and N profiled steps with the processes `scalelab run` would
start (scalelab.train.launch), records the profiled steps with torch.profiler, and prints per rank
where a step's time went (compute, communication by collective, exposed communication, optimizer,
data loading, idle) and the peak memory by category, each beside the layout planner's estimate for
the same model, layout and batch. Left in OUT/profile/: per rank a Chrome trace and summary.json,
report.md / report.json (the tables) and profile.png (the plot).

    scalelab profile examples/debug.yaml --layout fsdp2 --steps 2 --out runs/prof-fsdp2
    scalelab profile runs/prof-fsdp2                      # the report again (e.g. a sweep run's profile)
    scalelab profile cfg.yaml --layout tp2sp --calibrate runs/prof-single   # refit the planner's mfu first

On CPU the planner's hardware is this machine (a measured matmul rate and gloo bandwidth); on GPU
the planner's defaults (H100). Evaluation runs once at the end; checkpoints are off.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from scalelab.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="profile a few training steps of any layout", description=__doc__)
    p.add_argument("config", help="run config YAML, or a run directory holding a profile to report again")
    p.add_argument("--layout", default=None, help="layout name, e.g. single, dp2, fsdp2, tp2sp, pp2, fsdp2xtp2sp")
    p.add_argument("--steps", type=int, default=3, help="steps to profile (default 3)")
    p.add_argument("--warmup", type=int, default=4, help="unprofiled steps before them (default 4)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. --set model.d_model=256 (repeatable)")  # fmt: skip
    p.add_argument("--out", default=None, help="run directory (default profiles/<config name>-<layout>)")
    p.add_argument("--no-memory", action="store_true", help="do not record allocations (faster, no CPU peak)")
    p.add_argument("--calibrate", nargs="*", default=[], metavar="RUN_DIR",
                   help="refit the planner's mfu from these runs' unprofiled step times (CPU)")  # fmt: skip
    p.set_defaults(func=run)


def run(args) -> int:
    path = Path(args.config)
    if path.is_dir():
        return _report(path, args.calibrate)
    if args.steps < 1 or args.warmup < 1:
        raise UsageError(f"--steps {args.steps} --warmup {args.warmup}: both must be >= 1 (the first step warms up)")
    cfg = _profile_config(args)
    out = Path(args.out) if args.out else Path("profiles") / f"{path.stem}-{_layout_name(cfg.parallel)}"
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} is not empty; choose another --out")
    if cfg.parallel.world_size > 1:
        from scalelab.train.launch import launch_local

        code = launch_local(cfg, out)
        if code:
            return code
    else:
        from scalelab.train.loop import train_run

        summary = train_run(cfg, out)
        if summary.get("status") != "done":
            print(f"run {summary.get('status')}: {summary.get('reason', '')}  ({out})")
            return 1
    return _report(out, args.calibrate)


def _layout_name(pcfg) -> str:
    from scalelab.parallel.layouts import layout_name

    return layout_name(pcfg)


def _profile_config(args):
    """The run config with the layout, the run's length and the profiled steps set; checkpoints off."""
    from scalelab.parallel.layouts import parse_layout
    from scalelab.train.config import load_run_config

    cfg = load_run_config(args.config, args.overrides)  # ConfigError on bad input: exit 2 before anything runs
    overrides = list(args.overrides)
    if args.layout:
        lay = parse_layout(args.layout, base=cfg.parallel)
        overrides += [f"parallel.{k}={v}" for k, v in dataclasses.asdict(lay).items()]
    num_steps = args.warmup + args.steps
    overrides += [
        f"train.num_tokens={num_steps * cfg.tokens_per_step}",
        f"profile.steps=[{','.join(str(args.warmup + i + 1) for i in range(args.steps))}]",
        f"profile.memory={'false' if args.no_memory else 'true'}",
        "checkpoint.interval_steps=0",
        "checkpoint.final=false",
        "eval.interval_steps=0",
        "logging.progress=off",
        "logging.interval_steps=1",
    ]
    if cfg.train.num_threads == 0 and cfg.train.device != "cuda":
        # CPU ranks run one thread each (scalelab.parallel.backend); one process does the same, so
        # layouts compare at equal cores and the planner's one-thread matmul peak applies.
        overrides.append("train.num_threads=1")
    return load_run_config(args.config, overrides)


def _report(run_dir: Path, calibrate_from: list[str]) -> int:
    from scalelab.parallel.planner import CostConstants, Hardware
    from scalelab.train.profile_report import cpu_constants, cpu_hardware, write_report

    if not (run_dir / "config.json").exists():
        raise UsageError(f"{run_dir} holds no config.json; give a run config YAML or a profiled run directory")
    summaries = sorted((run_dir / "profile").glob("rank*/summary.json"))
    if not summaries:
        raise UsageError(f"{run_dir}/profile holds no rank summaries; profile steps with profile.steps or a config")
    if json.loads(summaries[0].read_text())["device"] == "cuda":
        hw, consts = Hardware(), CostConstants()
    else:
        hw = cpu_hardware([json.loads(p.read_text()) for p in summaries])
        consts = cpu_constants(hw, [Path(d) for d in calibrate_from])
    _, text = write_report(run_dir, hw, consts)
    print(text)
    print(f"\ntraces, summaries, report.md and profile.png in {run_dir / 'profile'}")
    return 0
