"""Start-up of the `scalelab` command and a whole `plan-run` process, timed as fresh processes (not a test).

    python bench/startup_and_plan_run.py                                 # this checkout
    python bench/startup_and_plan_run.py --before f921b8e                # and that revision, same run
    python bench/startup_and_plan_run.py --fit FIT.json --before f921b8e --repeat 5 --plan-repeat 1

Measures, each the median over its repeats of a new process's wall time and CPU time (user + system
of the child, from getrusage), so that a busy machine shows as wall >> CPU:
  help          `scalelab --help`
  fit --help    `scalelab fit --help` (a command that needs no model)
  bad predict   `scalelab predict MISSING.json --params 1e9 --tokens 2e10` (exits 2 on its argument)
  plan-run      `scalelab plan-run FIT --flops 5.76e23 --gpu H100-SXM --gpus 2048 --vocab-size 32000
                --seq-len 2048` with its default scale what-ifs (128 to 10,240 GPUs)
With --before REV the same commands also run on that revision's code, in the same invocation and
interleaved with this checkout's, and each line gets the ratio before / now. The revision is
`git archive`d into a temporary directory and its folders assembled into the `scalelab` package
(pyproject's package-dir) ahead of this checkout on PYTHONPATH. FIT defaults to
tests/assets/plan_fit.json (a Chinchilla fit of a synthetic table); docs/benchmarks.md also gives the
figures for a fit of Epoch AI's Chinchilla data (not in the repository). The load average is printed
before and after: compare figures only at a similar load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAN_ARGS = ["--flops", "5.76e23", "--gpu", "H100-SXM", "--gpus", "2048", "--vocab-size", "32000", "--seq-len", "2048"]


def revision_tree(rev: str, where: Path) -> Path:
    """The `scalelab` package of revision `rev` as an import root: its floors' folders linked under
    scalelab/ and any other top-level package (experiments) beside it; a sub-package's folder
    (scalelab.sweeps.specs = sweeps/specs) lies inside its floor's, which comes with it."""
    src = where / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    tar = where / "rev.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(src, filter="data")
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = where / "import"
    package = root / "scalelab"
    package.mkdir(parents=True)
    for name, folder in dirs.items():
        parts = name.split(".")
        if name == "scalelab":
            for item in (src / folder).iterdir():
                (package / item.name).symlink_to(item)
        elif parts[0] == "scalelab" and len(parts) == 2:
            (package / parts[1]).symlink_to(src / folder)
        elif len(parts) == 1:
            (root / name).symlink_to(src / folder)
    return root


def timed(argv: list[str], pythonpath: Path | None, cwd: Path) -> tuple[float, float, int]:
    """(wall s, child CPU s, exit code) of one process, started in `cwd` (not the repository root, whose
    scalelab/ folder `python -m` would import ahead of PYTHONPATH)."""
    env = dict(os.environ, WANDB_MODE="disabled")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "scalelab.cli", *argv]
    code = subprocess.run(argv, env=env, cwd=cwd, capture_output=True).returncode
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


def measures(fit: Path, out: Path) -> list[tuple[str, list[str], str]]:
    """(name, argv, repeat kind) of every measure."""
    return [
        ("help", ["--help"], "short"),
        ("fit --help", ["fit", "--help"], "short"),
        ("bad predict", ["predict", str(out / "missing.json"), "--params", "1e9", "--tokens", "2e10"], "short"),
        ("plan-run", ["plan-run", str(fit), *PLAN_ARGS, "--out", str(out / "plan")], "plan"),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", type=Path, default=ROOT / "tests" / "assets" / "plan_fit.json", help="FIT.json")
    ap.add_argument("--before", default=None, metavar="REV", help="also time this git revision, interleaved")
    ap.add_argument("--repeat", type=int, default=5, help="processes per start-up measure (median)")
    ap.add_argument("--plan-repeat", type=int, default=1, help="processes per plan-run measure (median)")
    args = ap.parse_args(argv)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}  {sys.executable}  load {os.getloadavg()}  cpus {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sides = {"now": None}
        if args.before:
            (tmp / "rev").mkdir()
            sides = {"before": revision_tree(args.before, tmp / "rev"), "now": None}
        print(f"{'measure':<14}" + "".join(f"{s + ' wall':>13}{s + ' CPU':>12}" for s in sides) + "   before/now")
        for name, cmd, kind in measures(args.fit.resolve(), tmp):
            got: dict[str, list[tuple[float, float, int]]] = {s: [] for s in sides}
            for _ in range(args.repeat if kind == "short" else args.plan_repeat):
                for side, path in sides.items():  # interleaved: both see the same load
                    got[side].append(timed(cmd, path, tmp))
            line = f"{name:<14}"
            for side in sides:
                wall = statistics.median(w for w, _, _ in got[side])
                cpu = statistics.median(c for _, c, _ in got[side])
                codes = {c for _, _, c in got[side]}
                line += f"{wall:>12.2f}s{cpu:>11.2f}s" + ("" if codes <= {0, 2} else f" (exit {codes})")
            if args.before:
                ratio = statistics.median(w for w, _, _ in got["before"]) / statistics.median(
                    w for w, _, _ in got["now"]
                )
                line += f"   x{ratio:.1f}"
            print(line, flush=True)
    print(f"load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
