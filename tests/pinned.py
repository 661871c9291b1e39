"""Run test code in a fresh interpreter whose numerics do not depend on the CPU's vector width.

Exact (float-hex, digest) values of a training step hold only where every kernel rounds the same
way, and ATen picks AVX2 or AVX-512 code by the CPU it finds. The pins are those of
scripts/golden_losses.py: ATen's portable kernels, MKL's reproducible mode, one thread per process.
ATen reads them once, when torch loads, so the code runs in a new Python whose PYTHONPATH holds
tests/; ranks it spawns inherit them. The pins do not make every value portable (an AMD EPYC and an
Intel Xeon still differ in the last bits of some), so a recorded value names the machine types it
was computed on (scalelab.train.runtime.machine_type) and its torch release; elsewhere the test
skips, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelab.train.runtime import machine_type

PINNED_NUMERICS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}


def skip_unless_recorded_here(torch_release: str, machines: tuple[str, ...]) -> None:
    here = (torch.__version__.split("+")[0], machine_type())
    if here[0] != torch_release or here[1] not in machines:
        pytest.skip(f"the exact values were recorded with torch {torch_release} on {', '.join(machines)}; here {here}")


def run_pinned(code: str, timeout: float = 300) -> str:
    """Run `code` with `python -c` under the pinned numerics; its stdout (fails the test on an error)."""
    env = {**os.environ, **PINNED_NUMERICS, "PYTHONPATH": str(Path(__file__).parent)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
