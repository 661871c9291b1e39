"""The YAML limits (scalelab.config_tree): the largest accepted spec's cost and how fast hostile ones are refused.

    python bench/yaml_limits.py            # ~1-2 minutes on 2 cores (Linux: reads /proc); a Markdown table

Four documents, each parsed two ways: by `load_yaml` alone in a process that imports only
scalelab.config_tree (seconds, and the growth of its peak RSS from after its imports), and end to
end as `scalelab sweep plan --no-measure FILE` in a process of its own under a 4 GiB address-space
limit (exit code, stderr lines, wall seconds, peak RSS). The CLI's start-up (torch, the package) is
most of its wall time; the first row, a one-run spec, measures it.

- largest accepted: a spec just under MAX_YAML_BYTES (its bulk a mapping of tags, one run);
- alias bomb: 20 KB whose aliases name one 20 KB string 333**2 = 110,889 times (2.2 GB expanded);
- 8 MB flat: a mapping of 8 MB, no aliases;
- 50,000 deep: `[[[...]]]` nested 50,000 levels.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalelab.config_tree import MAX_YAML_BYTES

GIB = 1 << 30
GRID = "grid: {optim.lr: [0.001]}\n"
BASE = (
    "name: big\nbase:\n  model: {preset: debug}\n  data: {seq_len: 64, val_sequences: 8}\n"
    "  train: {global_batch_tokens: 256, num_tokens: 1024}\n  logging: {wandb: disabled, progress: 'off'}\n"
)


def largest_accepted() -> str:
    """A spec of MAX_YAML_BYTES less a few bytes: the base run, and base.tags filling the rest."""
    lines, size, i = [BASE, "  tags:\n"], len(BASE) + 8 + len(GRID), 0
    while True:
        line = f"    tag{i:07d}: value{i:07d}\n"
        if size + len(line) > MAX_YAML_BYTES - 64:
            return "".join(lines) + GRID
        lines.append(line)
        size, i = size + len(line), i + 1


def alias_bomb() -> str:
    refs = ", ".join(["*s"] * 333)
    return f"s: &s {'x' * 20_000}\nb: &b [{refs}]\nc: [{', '.join(['*b'] * 333)}]\n" + BASE + GRID


def flat(n_bytes: int) -> str:
    lines, size, i = [BASE, GRID, "tags:\n"], len(BASE) + len(GRID) + 6, 0
    while size < n_bytes:
        line = f"  k{i}: v{i}\n"
        lines.append(line)
        size, i = size + len(line), i + 1
    return "".join(lines)


def deep(levels: int) -> str:
    return BASE + GRID + "nest: " + "[" * levels + "]" * levels + "\n"


_PARSE = """
import sys, time
from scalelab.config_tree import load_yaml
from scalelab.errors import ConfigError


def peak_kib():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])


open("/proc/self/clear_refs", "w").write("5")  # the peak from here on (not the parent's, inherited at fork)
before = peak_kib()
t0 = time.perf_counter()
try:
    load_yaml(sys.argv[1])
    outcome = "accepted"
except ConfigError as e:
    outcome = "refused: " + str(e).split(": ", 1)[1]
seconds = time.perf_counter() - t0
print(seconds, (peak_kib() - before) / 1024, outcome)
"""


def parse_alone(path: Path) -> tuple[str, float, float]:
    """(outcome, seconds, growth of peak RSS in MiB) of load_yaml(path) in a process that imports
    only scalelab.config_tree (VmHWM, from after its imports)."""
    r = subprocess.run([sys.executable, "-P", "-c", _PARSE, str(path)], capture_output=True, text=True, check=True)
    seconds, grown, outcome = r.stdout.split(" ", 2)
    return outcome.strip(), float(seconds), float(grown)


def cli(args: list[str], cwd: Path) -> tuple[int, int, float, float]:
    """(exit code, stderr lines, wall seconds, peak RSS in GiB) of `python -m scalelab.cli ARGS`."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))
        with open("/proc/self/clear_refs", "w") as f:  # the child's own peak, not this process's (fork)
            f.write("5")

    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-P", "-m", "scalelab.cli", *args],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=limit,
    )
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.stderr.close()
    return (
        os.waitstatus_to_exitcode(status),
        len(err.splitlines()),
        time.perf_counter() - t0,
        usage.ru_maxrss / (1 << 20),
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    with tempfile.TemporaryDirectory(prefix="yaml-limits-") as tmp:
        cwd = Path(tmp)
        docs = {
            "largest accepted": largest_accepted(),
            "alias bomb, 20 KB x 110,889 refs": alias_bomb(),
            "8 MB flat": flat(8 << 20),
            "50,000 deep": deep(50_000),
        }
        small = cwd / "small.yaml"
        small.write_text(BASE + GRID)
        code, lines, wall, peak = cli(["sweep", "plan", "--no-measure", str(small)], cwd)
        print(f"uptime: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1, 5, 15 min)\n")
        header = ["document", "bytes", "load_yaml", "load_yaml s", "load_yaml peak +MiB"]
        header += ["CLI exit", "stderr lines", "CLI s", "CLI peak GiB"]
        print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
        row = ["(a one-run spec: the CLI's start-up)", str(len(BASE + GRID)), "", "", ""]
        print("| " + " | ".join(row + [str(code), str(lines), f"{wall:.1f}", f"{peak:.2f}"]) + " |")
        for name, text in docs.items():
            path = cwd / (name.split(",")[0].replace(" ", "_") + ".yaml")
            path.write_text(text)
            outcome, seconds, grown = parse_alone(path)
            code, lines, wall, peak = cli(["sweep", "plan", "--no-measure", str(path)], cwd)
            print(
                f"| {name} | {len(text.encode()):,} | {outcome[:70]} | {seconds:.3f} | {grown:.0f} "
                f"| {code} | {lines} | {wall:.1f} | {peak:.2f} |"
            )


if __name__ == "__main__":
    main()
