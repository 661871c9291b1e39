"""bench/gpu_check.py without a GPU: it says what it would run and exits 0; `--cpu-smoke` runs its
training (with a profile) and kernel sections on tiny CPU configs and prints one table without
error rows (the GPU figures themselves come from a GPU machine)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "gpu_check.py"


def _run(*args, **env):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"WANDB_MODE": "disabled", **env},
        check=False,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine runs the real check")
def test_without_a_gpu_it_prints_the_plan_and_exits_0():
    res = _run()
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("No CUDA device")
    for section in ("training-fused", "training-unfused", "kernels"):
        assert section in res.stdout


def test_cpu_smoke_prints_one_table_without_errors():
    pytest.importorskip("triton")
    res = _run("--cpu-smoke", "--sections", "training-fused", "kernels", "--kernels", "rms_norm", TRITON_INTERPRET="1")
    assert res.returncode == 0, res.stderr[-2000:]
    table = res.stdout
    assert "MFU" in table and "profile steps [3, 4]" in table and "rms_norm" in table and "planner" in table
    for bad in ("ERROR", "INCOMPLETE", "MISMATCH", "SKIPPED"):
        assert bad not in table, table
