"""Whole-process time of `scalelab fit` on a 240-point table, at one fit thread and at two.

    python bench/fit_process_time.py                      # a simulated 16 x 15 Chinchilla grid
    python bench/fit_process_time.py --table EPOCH240.csv --repeats 3

Issue 47 asks for `scalelab fit` of 240 points in under 10 s, whole process (start-up, the
4500-start fit, its backtests' refits, the frontier's forward folds). Each repeat runs the command
as a user would, once with SCALELAB_FIT_THREADS=1 (the default: one torch and one BLAS thread per
fit) and once with 2, interleaved so that both see the same load; it prints wall and CPU seconds
(user + system of the child), the ratio of the medians, and the load average before and after.
Why it matters: on a shared 2-core machine, threads that spin-wait for a busy core cost far more
than they save (scipy's L-BFGS-B calls OpenBLAS on 5 x 10 matrices in every polish step).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import polars as pl

from scalelab.fitting.selection.simulate import simulate


def _table(path: pathlib.Path | None, tmp: pathlib.Path) -> pathlib.Path:
    """The table to fit: the given one, else a simulated 240-point Chinchilla grid (2% noise)."""
    if path is not None:
        return path
    data = simulate("chinchilla", noise_sigma=0.02, seed=0)
    out = tmp / "sim240.csv"
    pl.DataFrame({"params": data["params"], "tokens": data["tokens"], "loss": data["loss"]}).write_csv(out)
    return out


def _run(table: pathlib.Path, out: pathlib.Path, threads: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one `scalelab fit` process with SCALELAB_FIT_THREADS=threads."""
    env = {**os.environ, "SCALELAB_FIT_THREADS": str(threads)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "scalelab.cli.main", "fit", str(table), "--out", str(out)]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=pathlib.Path, default=None, help="a CSV with params, tokens, loss")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = _table(args.table, pathlib.Path(tmp))
        print(f"table {table.name}, load average before {os.getloadavg()[0]:.2f}")
        times: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
        for r in range(args.repeats):
            for threads in (1, 2):
                wall, cpu = _run(table, pathlib.Path(tmp) / f"fit{threads}.json", threads)
                times[threads].append((wall, cpu))
                print(f"repeat {r}  threads {threads}  wall {wall:6.2f} s  cpu {cpu:6.2f} s")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    print(
        f"median wall {med[1][0]:.2f} s (1 thread) vs {med[2][0]:.2f} s (2): ratio {med[2][0] / med[1][0]:.2f}; "
        f"CPU {med[1][1]:.2f} vs {med[2][1]:.2f} s: ratio {med[2][1] / med[1][1]:.2f}"
    )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
