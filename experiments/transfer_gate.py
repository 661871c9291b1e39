"""The LR-transfer gate on a ladder whose width grows x8: refused under sp, passed under mup.

Launches (local Ray, 2 CPUs, into one store, so a rerun trains nothing twice) the same ladder spec
twice, once with `model.parametrization: sp` and once with `mup`, through what `scalelab sweep launch
SPEC --out DIR` runs (scalelab.sweeps.closed_loop.rounds.run_rounds: the gate, then the ladder; the
exit code printed is the one that command gives the outcome: 2 refused, 0 done, 1 a run unfinished).
The ladder's sizes (1.5e4 .. 9e5 parameters, the shape rule at 32 channels per layer from 16 wide)
go from d_model 16 to 128; its `transfer:` section checks 7 LRs x2 apart at those two widths
(1 layer, 1 token per parameter, 4 sequences of 32 tokens per step, 3 seeds per point). Expected:
sp exits 2 with the check's table (its best LR moves more than one grid step from d_model 16 to
128); mup passes and its ladder runs at the base width's best LR.

    python experiments/transfer_gate.py                # ~16 min on 2 idle cores (fresh store); prints both tables

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from scalelab.errors import run_script
from scalelab.sweeps.closed_loop.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.specs.spec import load_sweep

SPEC = {
    "base": {
        "model": {"parametrization": "sp", "kernels": "torch"},
        "data": {"seq_len": 32, "val_sequences": 32},
        "train": {"global_batch_tokens": 128},
        "schedule": {"warmup_fraction": 0.05},
        "eval": {"interval_steps": 0},
        "checkpoint": {"interval_steps": 0},
        "logging": {"wandb": "disabled", "interval_steps": 10},
    },
    "recipe": {  # only for its shape rule and a fixed batch; the gate sets every run's LR
        "min_steps": 20,
        "shape": {"min_layers": 1, "width_per_layer": 32, "min_width": 16},
        "warmup": {"fraction": 0.05, "max_steps": 50},
        "batch": {"ref_tokens": 128, "exponent": 0.0, "min_sequences": 4},
    },
    "ladder": {"sizes": [1.5e4, 1.0e5, 9.0e5], "tokens_per_param": [0.3]},
    "transfer": {
        "check": True,
        "lrs": [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2, 1.28e-1],
        "tokens_per_param": 1,
        "seeds": 3,
    },
    "execution": {"max_concurrent": 2, "cpus_per_run": 1},
}


def main(argv: list[str] | None = None, trainer=None) -> int:
    """Both ladders through the gate (trained by `trainer` when given, else Ray's launcher), then both tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/transfer_gate", help="store root")
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args(argv)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    codes = {}
    for p in ("sp", "mup"):
        spec = yaml.safe_load(yaml.safe_dump(SPEC))
        spec["name"] = f"ladder-{p}"
        spec["base"]["model"]["parametrization"] = p
        path = root / f"ladder-{p}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        t0, out = time.time(), root / f"ladder-{p}"
        print(f"\n=== scalelab sweep launch {path} --out {out}", flush=True)
        options = LaunchOptions(num_cpus=args.num_cpus, trainer=trainer)
        result = run_rounds(load_sweep(path), out, spec_text=path.read_text(), spec_name=path.stem, options=options)
        codes[p] = result.exit_code()
        print(f"=== exit code {codes[p]} ({time.time() - t0:.0f} s)", flush=True)
    for p in ("sp", "mup"):
        print(f"\n{p}: exit {codes[p]}\n" + (root / f"ladder-{p}-transfer" / "gate.txt").read_text())
    verdict = "as expected" if codes["sp"] == 2 and codes["mup"] == 0 else "NOT as expected"
    print(f"sp refused (exit 2) and mup passed (exit 0): {verdict}")
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
