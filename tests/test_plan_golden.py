"""The layout planner's search and `plan-run`'s plan, pinned (tests/assets/plan_golden.json).

The planner ranks thousands of candidate layouts per cluster size and plan-run asks it for the
planned size and each scale what-if; speeding that up must not change one answer. Pinned: every
candidate of `plan_layouts(..., include_unfit=True)` (its name, whether it fits, its step time,
MFU, memory, communication and time parts, each float to the last bit, in the ranked order) for a
dense model, a tied-embedding model and two MoE models; and the whole plan.json of a plan-run with
what-ifs from a saved fit (tests/assets/plan_fit.json: a Chinchilla fit of a synthetic table), its
floats to 9 significant digits (the loss model's numpy reductions may differ in the last bits
across CPUs and builds) and the fit's path by its file name (CI clones the repository elsewhere).

    python tests/test_plan_golden.py           # compare (exit 1 when something moved)
    python tests/test_plan_golden.py --write   # rewrite the asset after a change meant to move them
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from scalelab.cli.main import main as scalelab
from scalelab.models.presets import get_preset
from scalelab.parallel.planner import best_layout, plan_layouts
from scalelab.planning.cluster import gpu_cluster

ASSETS = Path(__file__).resolve().parent / "assets"
GOLDEN = ASSETS / "plan_golden.json"
FIT = ASSETS / "plan_fit.json"
# (preset, GPUs, seq_len, tokens per step): a dense model with an untied output, a tied one, two MoE
PLANNER_CASES = {
    "8b-64": ("8b", 64, 4096, 2**22),
    "3b-32": ("3b", 32, 4096, 2**21),
    "olmoe-32": ("olmoe-1b-7b", 32, 4096, 2**21),
    "mixtral-16": ("mixtral-8x7b", 16, 4096, 2**21),
}
PLAN_RUN_ARGS = ["--flops", "1e22", "--gpu", "H100-SXM", "--gpus", "256", "--vocab-size", "32000", "--seq-len",
                 "2048", "--scale", "64,256,1024"]  # fmt: skip


def _plan_row(p) -> list:
    """One candidate, every float as its hex (exact)."""

    def exact(d: dict) -> list:
        return [[k, float(v).hex()] for k, v in sorted(d.items())]

    return [
        p.name,
        asdict(p.parallel),
        p.fits,
        p.step_time_s.hex(),
        p.tokens_per_s_per_gpu.hex(),
        p.mfu.hex(),
        exact(p.memory),
        exact(p.comm_bytes),
        exact(p.time_parts),
    ]


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _rounded(obj):
    """A JSON value with every float at 9 significant digits."""
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    if isinstance(obj, float):
        return float(f"{obj:.9g}")
    return obj


def _search(name: str, search, **kw):
    preset, gpus, seq_len, batch = PLANNER_CASES[name]
    cluster = gpu_cluster("H100-SXM", gpus)
    return search(get_preset(preset), num_gpus=gpus, seq_len=seq_len, global_batch_tokens=batch, hw=cluster.hw,
                  consts=cluster.consts, **kw)  # fmt: skip


@functools.cache
def _every_candidate(name: str) -> list:
    return _search(name, plan_layouts, include_unfit=True)


def planner_case(name: str) -> dict:
    plans = _every_candidate(name)
    rows = [_plan_row(p) for p in plans]
    return {
        "candidates": len(rows),
        "fit": sum(p.fits for p in plans),
        "first": [[p.name, p.step_time_s] for p in plans[:3]],
        "sha256": _digest(rows),
    }


def plan_run_case() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        with contextlib.redirect_stdout(io.StringIO()):
            code = scalelab(["plan-run", str(FIT), *PLAN_RUN_ARGS, "--out", str(out)])
        assert code == 0, f"plan-run exited {code}"
        plan = json.loads((out / "plan.json").read_text())
    plan["fit_source"] = Path(plan["fit_source"]).name  # the path given: the clone's location is not the plan
    return {
        "layout": plan["layout"]["name"],
        "params": plan["run"]["params"],
        "wall_s": _rounded(plan["cost"]["wall_s"]),
        "loss": _rounded(plan["loss"]),
        "what_if": [[r["num_gpus"], r["layout"]] for r in plan["what_if"]["rows"]],
        "sha256": _digest(_rounded(plan)),
    }


def compute() -> dict:
    return {"planner": {name: planner_case(name) for name in PLANNER_CASES}, "plan_run": plan_run_case()}


def test_planner_search_is_as_pinned():
    golden = json.loads(GOLDEN.read_text())["planner"]
    for name in PLANNER_CASES:
        assert planner_case(name) == golden[name], f"{name}: the planner's candidates moved"


@pytest.mark.parametrize("name", list(PLANNER_CASES))
def test_best_layout_is_the_first_of_the_full_search(name):
    """best_layout skips candidates whose compute + bubble exceeds the best step found: exact only
    while no time part is negative (communication only adds)."""
    plans = _every_candidate(name)
    assert all(v >= 0 for p in plans for v in p.time_parts.values())
    fitting = [p for p in plans if p.fits]
    assert _plan_row(_search(name, best_layout)) == _plan_row(fitting[0])


def test_plan_run_plan_is_as_pinned():
    got = plan_run_case()
    assert got == json.loads(GOLDEN.read_text())["plan_run"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {GOLDEN.name} with the values computed now")
    args = ap.parse_args()
    got = compute()
    if args.write:
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
        sys.exit(0)
    want = json.loads(GOLDEN.read_text())
    moved = [k for k in want["planner"] if want["planner"][k] != got["planner"].get(k)]
    moved += ["plan_run"] if want["plan_run"] != got["plan_run"] else []
    print("moved: " + ", ".join(moved) if moved else "as pinned")
    sys.exit(1 if moved else 0)
