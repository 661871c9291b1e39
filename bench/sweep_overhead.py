"""How much of a sweep's wall time is training: 12 runs of ~20 s each on a local Ray.

    python bench/sweep_overhead.py [--runs 12] [--tokens 327680] [--slots 2] [--out DIR]

busy fraction = sum over trials of the seconds spent inside the one-run train function
(`train_s` in events.jsonl: model build, data, steps, evals, checkpoints) / (wall time x slots),
where slots = concurrent trials (one CPU each). Reported twice: with the wall time of the whole
`launch` call (Ray start-up included) and from the first trial start to the last trial end (the
steady-state scheduling overhead). Goal: >= 90%. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=327_680, help="tokens per run (~20 s of the debug model)")
    ap.add_argument("--slots", type=int, default=2, help="concurrent trials = CPUs of the local Ray")
    ap.add_argument("--out", default=None, help="store root (default: a temp dir)")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "disabled")

    from scalelab import store
    from scalelab.sweeps.execution.execute import launch
    from scalelab.sweeps.specs.spec import expand_sweep

    spec = {
        "name": "overhead",
        "base": {
            "model": {"preset": "debug"},
            "data": {"seq_len": 64, "val_sequences": 16},
            "train": {"global_batch_tokens": 1024, "num_tokens": args.tokens},
            "eval": {"interval_steps": 0, "val_batch_sequences": 16},
            "checkpoint": {"interval_steps": 100, "keep_last": 1},
            "logging": {"wandb": "disabled", "progress": "off"},
        },
        "grid": {"optim.lr": [1e-3 * (1 + i) for i in range(args.runs)]},
        "execution": {"cpus_per_run": 1, "max_concurrent": args.slots},
    }
    root = Path(args.out or tempfile.mkdtemp(prefix="scalelab-bench-"))
    sweep_dir = root / f"overhead-{int(time.time())}"
    sweep = expand_sweep(spec)
    t0 = time.time()
    launch(sweep, sweep_dir, spec_text=yaml.safe_dump(spec), num_cpus=args.slots, log=lambda m: None)
    wall = time.time() - t0
    events = store.read_events(sweep_dir)
    ends = [e for e in events if e["event"] == "end"]
    starts = [e for e in events if e["event"] == "start"]
    busy = sum(e["train_s"] for e in ends)
    span = max(e["time"] for e in ends) - min(e["time"] for e in starts)
    result = {
        "runs": len(ends),
        "slots": args.slots,
        "mean_run_s": busy / max(len(ends), 1),
        "wall_s": wall,
        "trial_span_s": span,
        "busy_fraction_wall": busy / (wall * args.slots),
        "busy_fraction_span": busy / (span * args.slots),
        "load_average_1m": os.getloadavg()[0],
        "store": str(sweep_dir),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
