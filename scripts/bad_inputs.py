"""The bad-input fuzz table: every case's exit code, stderr lines, traceback?, files written, message.

    python scripts/bad_inputs.py [--jobs 2] [--only SUBSTRING]

Each case runs `python -m scalelab.cli ...` as its own process in its own copy of a scratch
directory holding a good run config, a good sweep spec, a finished tiny run (`done`), a copy of
it with an empty .metadata (`corrupt`) and a few broken files (made first, ~30 s).
A case passes when it exits 2 with one line on stderr, no traceback, and leaves the scratch
directory as it was. The table is printed as Markdown; the exit code is the number of failing
cases. A few cases are expected to fail for another reason than bad input (noted in the table).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

RUN = {
    "name": "fz",
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"num_tokens": 1024, "global_batch_tokens": 256},
    "eval": {"interval_steps": 0, "val_batch_sequences": 8},
    "checkpoint": {"interval_steps": 2},
    "logging": {"wandb": "disabled", "progress": "off"},
}
SWEEP = {"name": "s", "base": RUN, "grid": {"optim.lr": [1e-3, 3e-3]}}
LAYOUT_ARGS = ["--seq-len", "64", "--global-batch-tokens", "4096"]


def _set(*overrides: str) -> list[str]:
    return ["run", "run.yaml", "--out", "o"] + [x for o in overrides for x in ("--set", o)]


SPECS = {  # broken sweep specs, one file each
    "nogen.yaml": {"name": "s", "base": RUN},
    "badgenkey.yaml": {"name": "s", "base": RUN, "grid": {"optim.lrr": [1e-3]}},
    "dp0.yaml": {**SWEEP, "base": {**RUN, "parallel": {"dp_shard": 0}}},
    "nan.yaml": {**SWEEP, "grid": {"optim.lr": [float("nan")]}},
    "isoneg.yaml": {"name": "s", "base": RUN, "isoflop": {"budgets": [-1e12], "num_sizes": 3}},
    "exec.yaml": {**SWEEP, "execution": {"max_concurent": 2}},
    "seeds.yaml": {**SWEEP, "seeds": -1},
    "seeds25.yaml": {**SWEEP, "seeds": 2.5},
}

CASES: list[tuple[str, list[str]]] = [
    # scalelab run: files
    ("run: config file missing", ["run", "missing.yaml", "--out", "o"]),
    ("run: config is a directory", ["run", "adir", "--out", "o"]),
    ("run: YAML syntax error", ["run", "broken.yaml", "--out", "o"]),
    ("run: top level is a list", ["run", "list.yaml", "--out", "o"]),
    ("run: binary config file", ["run", "binary.yaml", "--out", "o"]),
    ("run: --out is a file", ["run", "run.yaml", "--out", "a_file"]),
    ("run: --out holds a run, no --resume", ["run", "run.yaml", "--out", "done"]),
    ("run: --resume with another config", ["run", "run.yaml", "--out", "done", "--resume", "--set", "optim.lr=0.01"]),
    # scalelab run: keys and overrides
    ("run: unknown top-level key", _set("optimizer.lr=1")),
    ("run: misspelt key", _set("model.d_modl=64")),
    ("run: wrong type", _set("train.num_tokens=abc")),
    ("run: override without =", ["run", "run.yaml", "--out", "o", "--set", "optim.lr"]),
    ("run: override value not YAML", _set("optim.lr=[1,")),
    ("run: list index out of range", _set("data.sources.5.weight=1")),
    ("run: override into a value", _set("optim.lr.x=1")),
    # layout
    ("run: parallel.dp_shard=0", _set("parallel.dp_shard=0")),
    ("run: parallel.tp=0", _set("parallel.tp=0")),
    ("run: parallel.tp=3 (heads)", _set("parallel.tp=3")),
    ("run: parallel.ep=2 on a dense model", _set("parallel.ep=2", "parallel.dp_shard=2")),
    ("run: parallel.pp_schedule unknown", _set("parallel.pp_schedule=bogus")),
    ("run: parallel.pp=8 > layers", _set("parallel.pp=8")),
    ("run: parallel.backend unknown", _set("parallel.backend=mpi")),
    # optimizer, schedule
    ("run: optim.lr=nan", _set("optim.lr=nan")),
    ("run: optim.lr=.inf", _set("optim.lr=.inf")),
    ("run: optim.lr=-1", _set("optim.lr=-1")),
    ("run: optim.beta1=1.5", _set("optim.beta1=1.5")),
    ("run: optim.weight_decay=-0.1", _set("optim.weight_decay=-0.1")),
    ("run: optim.eps=nan", _set("optim.eps=nan")),
    ("run: schedule.name unknown", _set("schedule.name=linear")),
    ("run: schedule.warmup_fraction=1.5", _set("schedule.warmup_fraction=1.5")),
    ("run: schedule.min_lr_ratio=nan", _set("schedule.min_lr_ratio=nan")),
    # train
    ("run: train.num_tokens=0", _set("train.num_tokens=0")),
    ("run: train.num_tokens=1e30", _set("train.num_tokens=1e30")),
    ("run: train.global_batch_tokens=100", _set("train.global_batch_tokens=100")),
    ("run: train.global_batch_tokens=0", _set("train.global_batch_tokens=0")),
    ("run: train.micro_batch_sequences=3", _set("train.micro_batch_sequences=3")),
    ("run: train.device=tpu", _set("train.device=tpu")),
    ("run: train.device=cuda (no GPU)", _set("train.device=cuda")),
    ("run: train.dtype=fp8", _set("train.dtype=fp8")),
    ("run: train.init_from=/missing", _set("train.init_from=/missing")),
    ("run: train.init_from=a run dir", _set("train.init_from=done")),
    ("run: train.init_from=corrupt ckpt", _set("train.init_from=corrupt/checkpoints/step_4")),
    ("run: train.max_loss_spike=0.5", _set("train.max_loss_spike=0.5")),
    ("run: train.num_threads=-1", _set("train.num_threads=-1")),
    # data, model, eval, logging
    ("run: data.seq_len=0", _set("data.seq_len=0")),
    ("run: data.seq_len > max_seq_len", _set("data.seq_len=100000", "train.global_batch_tokens=100000")),
    ("run: data.tokenizer missing", _set("data.tokenizer=/missing.json")),
    ("run: data source path missing", _set("data.sources.0.path=/missing")),
    ("run: model.preset unknown", _set("model.preset=nope")),
    ("run: model.num_heads=3", _set("model.num_heads=3")),
    ("run: eval.interval_steps=-1", _set("eval.interval_steps=-1")),
    ("run: eval.val_batch_sequences=0", _set("eval.val_batch_sequences=0")),
    ("run: eval.tasks unknown", _set("eval.tasks=[nope:x]")),
    ("run: logging.wandb=maybe", _set("logging.wandb=maybe")),
    ("run: checkpoint.keep_last=-1", _set("checkpoint.keep_last=-1")),
    # sweeps
    ("sweep plan: spec missing", ["sweep", "plan", "missing.yaml", "--no-measure"]),
    ("sweep plan: no generator", ["sweep", "plan", "nogen.yaml", "--no-measure"]),
    ("sweep plan: grid key misspelt", ["sweep", "plan", "badgenkey.yaml", "--no-measure"]),
    ("sweep plan: base parallel.dp_shard=0", ["sweep", "plan", "dp0.yaml", "--no-measure"]),
    ("sweep plan: grid lr=nan", ["sweep", "plan", "nan.yaml", "--no-measure"]),
    ("sweep plan: isoflop budget < 0", ["sweep", "plan", "isoneg.yaml", "--no-measure"]),
    ("sweep plan: execution key misspelt", ["sweep", "plan", "exec.yaml", "--no-measure"]),
    ("sweep plan: seeds=-1", ["sweep", "plan", "seeds.yaml", "--no-measure"]),
    ("sweep plan: seeds=2.5", ["sweep", "plan", "seeds25.yaml", "--no-measure"]),
    ("sweep launch: --out is a file", ["sweep", "launch", "sweep.yaml", "--out", "a_file"]),
    ("sweep launch: --out a non-sweep dir", ["sweep", "launch", "sweep.yaml", "--out", "done"]),
    ("sweep launch: --rounds 0", ["sweep", "launch", "sweep.yaml", "--out", "o", "--rounds", "0"]),
    ("sweep launch: --inject-fault bad", ["sweep", "launch", "sweep.yaml", "--out", "o", "--inject-fault", "x"]),
    ("sweep resume: not a sweep", ["sweep", "resume", "done"]),
    ("sweep resume: a file", ["sweep", "resume", "a_file"]),
    ("sweep status: missing dir", ["sweep", "status", "missing"]),
    ("sweep export: missing dir", ["sweep", "export", "missing", "--csv", "x.csv"]),
    # eval
    ("eval: path missing", ["eval", "missing"]),
    ("eval: neither run nor checkpoint", ["eval", "adir"]),
    ("eval: --batch-sequences 0", ["eval", "done", "--batch-sequences", "0"]),
    ("eval: --limit -1", ["eval", "done", "--limit", "-1"]),
    ("eval: --device cuda (no GPU)", ["eval", "done", "--device", "cuda"]),
    ("eval: --device tpu", ["eval", "done", "--device", "tpu"]),
    ("eval: --tasks unknown", ["eval", "done", "--tasks", "nope:x"]),
    ("eval: corrupt checkpoint", ["eval", "corrupt/checkpoints/step_4", "--no-write"]),
    ("export: --dtype int8", ["export", "done", "--hf", "hf", "--dtype", "int8"]),
    ("export: corrupt checkpoint", ["export", "corrupt/checkpoints/step_4", "--hf", "hf"]),
    ("export: --hf not empty", ["export", "done", "--hf", "done"]),
    # fitting, planning, data
    ("fit: data file missing", ["fit", "missing.csv"]),
    ("fit: unknown law", ["fit", "runs.csv", "--law", "nope"]),
    ("fit: columns missing", ["fit", "cols.csv"]),
    ("allocate: fit file missing", ["allocate", "missing.json", "--flops", "1e20"]),
    ("plan-layout: --gpus 0", ["plan-layout", "--model", "debug", "--gpus", "0", *LAYOUT_ARGS]),
    (
        "plan-layout: --gpu-memory 80XB",
        ["plan-layout", "--model", "debug", "--gpus", "8", "--gpu-memory", "80XB", *LAYOUT_ARGS],
    ),
    ("plan-layout: model YAML broken", ["plan-layout", "--model", "broken.yaml", "--gpus", "8", *LAYOUT_ARGS]),
    (
        "plan-layout: --seq-len 0",
        ["plan-layout", "--model", "debug", "--gpus", "8", "--seq-len", "0", "--global-batch-tokens", "4096"],
    ),
    ("parity: unknown layout", ["parity", "--layouts", "single,bogus"]),
    ("data prepare: input missing", ["data", "prepare", "/missing", "--out", "shards"]),
    ("data info: not a shard dir", ["data", "info", "adir"]),
]


def make_workdir(root: Path) -> None:
    """The good and broken inputs the cases point at, and a finished run (`done`) to resume/evaluate."""
    (root / "run.yaml").write_text(yaml.safe_dump(RUN))
    (root / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    for name, spec in SPECS.items():
        (root / name).write_text(yaml.safe_dump(spec))
    (root / "broken.yaml").write_text("model:\n  preset: debug\ndata: {seq_len: 64\ntrain:\n  seed: 1\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "binary.yaml").write_bytes(bytes(range(256)))
    (root / "a_file").write_text("not a directory\n")
    (root / "adir").mkdir()
    (root / "runs.csv").write_text("params,tokens,loss\n1e6,1e8,3.0\n2e6,1e8,2.9\n4e6,1e8,2.8\n")
    (root / "cols.csv").write_text("a,b\n1,2\n")
    done = subprocess.run(_cli(["run", "run.yaml", "--out", "done"]), cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"could not make the finished run:\n{done.stderr[-2000:]}")
    shutil.copytree(root / "done", root / "corrupt")
    (root / "corrupt" / "checkpoints" / "step_4" / ".metadata").write_bytes(b"")


def _cli(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "scalelab.cli", *argv]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def run_case(template: Path, workdir: Path, argv: list[str]) -> dict:
    """Run one case in its own copy of the scratch inputs; what it printed and wrote."""
    shutil.copytree(template, workdir, symlinks=True)
    before = _snapshot(workdir)
    proc = subprocess.run(_cli(argv), cwd=workdir, capture_output=True, text=True, timeout=600)
    after = _snapshot(workdir)
    written = sorted(set(after) - set(before)) + sorted(k for k in before if k in after and after[k] != before[k])
    shutil.rmtree(workdir, ignore_errors=True)
    err = proc.stderr.strip()
    lines = err.splitlines()
    return {
        "exit": proc.returncode,
        "lines": len(lines),
        "traceback": "Traceback" in err,
        "written": written,
        "message": lines[-1] if lines else "(no stderr) " + proc.stdout.strip()[-120:],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1, help="cases run at a time (each is its own process)")
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    args = p.parse_args()
    cases = [(n, a) for n, a in CASES if args.only in n]
    scratch = Path(tempfile.mkdtemp(prefix="scalelab-fuzz-"))
    os.environ.setdefault("SCALELAB_CACHE", str(scratch / "cache"))
    os.environ.setdefault("WANDB_MODE", "disabled")
    root = scratch / "inputs"
    root.mkdir()
    make_workdir(root)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda ic: run_case(root, scratch / f"case{ic[0]}", ic[1][1]), enumerate(cases)))
    failing = 0
    print("| # | case | exit | stderr lines | traceback | wrote | message |")
    print("|---|---|---|---|---|---|---|")
    for i, ((name, _), r) in enumerate(zip(cases, results), 1):
        ok = r["exit"] == 2 and r["lines"] == 1 and not r["traceback"] and not r["written"]
        failing += not ok
        wrote = ", ".join(r["written"][:3]) + (" ..." if len(r["written"]) > 3 else "") if r["written"] else "nothing"
        msg = r["message"].replace("|", "\\|")
        flag = "" if ok else " **(!)**"
        tb = "yes" if r["traceback"] else "no"
        print(f"| {i} | {name}{flag} | {r['exit']} | {r['lines']} | {tb} | {wrote} | {msg} |")
    print(f"\n{len(cases) - failing} of {len(cases)} cases: exit 2, one line, no traceback, nothing written")
    shutil.rmtree(scratch, ignore_errors=True)
    return failing


if __name__ == "__main__":
    sys.exit(main())
