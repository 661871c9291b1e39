"""Golden losses: the debug preset's first steps as exact float-hex values, against tests/assets/golden_losses/.

    python scripts/golden_losses.py            # compute, compare with the asset, list what moved (exit 1)
    python scripts/golden_losses.py --json     # print the computed values as JSON (what the test reads)
    python scripts/golden_losses.py --write    # rewrite the asset after a change meant to move them

`--write` is refused under CI=true: golden values change on purpose, in a commit that says why.

What is pinned, per entry the loss and the gradient norm (before clipping) of every step, each the
`float.hex()` of the Python float the code reports:
  parity/<layout>  the parity harness (scalelab.parallel.parity, its default spec: the debug preset
                   with 4 layers, the AdamW recipe, gradient clipping, 3 steps) on one device
                   (`single`) and under every layout of PARITY_LAYOUTS at world 2 and 4. A layout
                   sums in another order than one device, so each layout has its own values.
  loop/debug       the training loop (`train_run`) on the debug preset on one device: a generated
                   corpus (byte tokenizer), the cosine schedule with warmup, 2 accumulation
                   micro-batches per step, clipping; and its final validation loss (`val_loss`).

The numerics are pinned so that the values do not depend on the CPU's vector width: ATen's
portable kernels (ATEN_CPU_CAPABILITY=default), MKL's reproducible mode (MKL_CBWR=COMPATIBLE),
one thread per process. They are set here, before torch is imported, and every rank inherits them.
Those pins do not make every value portable: the same code gives values a few ulps apart on an AMD
EPYC and an Intel Xeon (which dispatch still differs is not known: on the Intel type no MKL_CBWR
branch, oneDNN or MKL ISA cap, or ATen capability reproduces the AMD values). So each machine type
has its own asset, tests/assets/golden_losses/<type>.json (scalelab.train.runtime.machine_type:
architecture, CPU vendor, widest vector ISA), recording the torch release too; on a type or release
with no asset the comparison exits 3 and the test skips, saying why.
"""

from __future__ import annotations

import os

PINNED_NUMERICS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}
os.environ.update(PINNED_NUMERICS)  # before torch loads: both are read once, on first use

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402
import torch  # noqa: E402

from scalelab.parallel.parity import PARITY_LAYOUTS, ParitySpec, run_parity_jobs  # noqa: E402
from scalelab.train.config import build_run_config  # noqa: E402
from scalelab.train.loop import train_run  # noqa: E402
from scalelab.train.runtime import machine_type  # noqa: E402

ASSETS = Path(__file__).resolve().parent.parent / "tests" / "assets" / "golden_losses"
PARITY_WORLDS = (2, 4)  # world 8 stays in the parity test only: 8 processes cost more than the rest together
LOOP_RUN = {
    "name": "golden",
    "model": {"preset": "debug"},
    "data": {"tokenizer": "byte", "seq_len": 32, "val_sequences": 8},  # sources: the generated corpus
    "train": {
        "num_tokens": 6 * 256,
        "global_batch_tokens": 256,
        "micro_batch_sequences": 4,
        "seed": 0,
        "device": "cpu",
        "dtype": "fp32",
        "num_threads": 1,
    },
    "optim": {"lr": 3e-3},
    "schedule": {"name": "cosine", "warmup_tokens": 512},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 0, "final": False},
    "logging": {"wandb": "disabled", "progress": "off"},
}
_WORDS = (
    "the of and to in is that it for as with was on be by this are from or an which at not but have "
    "model loss scale data token layer law compute budget run step size rate fit curve point sweep"
).split()


def platform_key() -> dict[str, str]:
    """What the values depend on besides the code: the torch release and the machine type."""
    return {"torch": torch.__version__.split("+")[0], "machine": machine_type()}


def asset_path(machine: str) -> Path:
    """The asset of one machine type."""
    return ASSETS / (machine.replace("/", "-") + ".json")


def write_corpus(path: Path, num_documents: int = 400, words_per_document: int = 60) -> None:
    """A JSONL corpus of word sequences from a fixed 64-bit LCG (no library RNG whose stream could
    change), skewed toward the first words so that a few steps visibly learn."""
    state = 0x5EED
    lines = []
    for _ in range(num_documents):
        words = []
        for _ in range(words_per_document):
            state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
            a, b = (state >> 33) % len(_WORDS), (state >> 11) % len(_WORDS)
            words.append(_WORDS[min(a, b)])
        lines.append(json.dumps({"text": " ".join(words) + "."}))
    path.write_text("\n".join(lines) + "\n")


def _hex(values) -> list[str]:
    return [float(v).hex() for v in values]


def parity_values() -> dict[str, dict[str, list[str]]]:
    layouts = ["single", *(name for world in PARITY_WORLDS for name in PARITY_LAYOUTS[world])]
    report = run_parity_jobs([(layouts, ParitySpec())])
    return {f"parity/{r.layout}": {"loss": _hex(r.losses), "grad_norm": _hex(r.grad_norms)} for r in report.rows}


def loop_values(work: Path) -> dict[str, dict[str, list[str]]]:
    corpus = work / "corpus.jsonl"
    write_corpus(corpus)
    tree = json.loads(json.dumps(LOOP_RUN))
    tree["data"]["sources"] = [{"name": "golden", "path": str(corpus), "weight": 1.0}]
    train_run(build_run_config(tree), work / "run")
    metrics = pl.read_parquet(work / "run" / "metrics.parquet").sort("step")
    evals = pl.read_parquet(work / "run" / "evals.parquet")
    val = evals.filter((pl.col("task") == "val") & (pl.col("metric") == "loss")).sort("step")
    return {
        "loop/debug": {
            "loss": _hex(metrics["loss"]),
            "grad_norm": _hex(metrics["grad_norm"]),
            "val_loss": _hex(val["value"]),
        }
    }


def compute() -> dict:
    """Every golden entry, computed now under the pinned numerics."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="scalelab-golden-") as tmp:
        # the corpus is prepared into a cache of its own, never the user's
        os.environ["SCALELAB_CACHE"] = str(Path(tmp) / "cache")
        values = {**loop_values(Path(tmp)), **parity_values()}
    return {**platform_key(), "values": dict(sorted(values.items()))}


def differences(expected: dict, got: dict) -> list[str]:
    """One line per entry whose values moved (or that is missing on one side)."""
    lines = []
    want, have = expected.get("values", {}), got["values"]
    for key in sorted(set(want) | set(have)):
        if key not in want:
            lines.append(f"{key}: no golden values (a new entry)")
            continue
        if key not in have:
            lines.append(f"{key}: golden values exist but nothing computed them")
            continue
        for field in sorted(set(want[key]) | set(have[key])):
            a, b = want[key].get(field, []), have[key].get(field, [])
            if a == b:
                continue
            bad = [i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i]]
            i = bad[0]
            old = f"{a[i]} ({float.fromhex(a[i])!r})" if i < len(a) else "-"
            new = f"{b[i]} ({float.fromhex(b[i])!r})" if i < len(b) else "-"
            lines.append(f"{key} {field}: {len(bad)} of {len(b)} steps moved; step {i + 1}: golden {old}, now {new}")
    return lines


def render(values: dict) -> str:
    """The asset's text: one line per entry and field, so that a diff shows which steps moved."""
    about = "golden losses: python scripts/golden_losses.py --write rewrites this file (see its docstring)"
    head = {"about": about, **{k: v for k, v in values.items() if k != "values"}}
    entries = []
    for key, fields in values["values"].items():
        body = ",\n".join(f"   {json.dumps(name)}: {json.dumps(v)}" for name, v in fields.items())
        entries.append(f"  {json.dumps(key)}: {{\n{body}\n  }}")
    top = "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
    return "{\n" + top + ' "values": {\n' + ",\n".join(entries) + "\n }\n}\n"


def main(argv: list[str] | None = None) -> int:
    """Exit 0: every value as golden; 1: some moved (listed); 2: --write under CI; 3: the asset was
    computed on another torch release or machine type, so its values cannot be compared here."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the computed values as JSON, compare nothing")
    p.add_argument(
        "--write", action="store_true", help="rewrite this machine type's asset in tests/assets/golden_losses/"
    )
    args = p.parse_args(argv)
    if args.write and os.environ.get("CI", "").lower() in ("true", "1"):
        print("--write is refused under CI=true: update the golden values in a commit of their own", file=sys.stderr)
        return 2
    asset = asset_path(platform_key()["machine"])
    expected = json.loads(asset.read_text()) if asset.exists() else {}
    recorded = {k: expected.get(k) for k in platform_key()}
    if not (args.json or args.write) and recorded != platform_key():
        types = sorted(p.stem for p in ASSETS.glob("*.json"))
        print(f"no golden values for {platform_key()} (recorded: {', '.join(types) or 'none'}): not comparable here")
        return 3
    got = compute()
    if args.json:
        print(json.dumps(got))
        return 0
    moved = differences(expected, got)
    for line in moved:
        print(line)
    if args.write:
        ASSETS.mkdir(parents=True, exist_ok=True)
        asset.write_text(render(got))
        print(f"{len(got['values'])} entries ({len(moved)} changed) -> {asset}")
        return 0
    print(f"{len(got['values'])} entries; {len(moved)} value lists moved" + ("; --write to accept" if moved else ""))
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
