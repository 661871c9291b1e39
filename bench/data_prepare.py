"""`scalelab data prepare` on generated Parquet and .jsonl.zst corpora: tokens/s and peak memory by size.

    python bench/data_prepare.py --sizes-mb 100,1000 --formats parquet,jsonl.zst [--tokenizer tok.json]
        [--workdir /tmp/scalelab-data-bench] [--keep]

For each format and size it writes a corpus whose file is about that many MB on disk (cached in the
workdir: a second run reuses it), then runs `scalelab data prepare FILE --out DIR --tokenizer T
--progress off` as a child process and reads the child's peak resident memory from the kernel
(os.wait4's ru_maxrss: the figure `/usr/bin/time -v` prints as "Maximum resident set size"). It prints
one row per run: input MB on disk and of text, tokens, the child's wall seconds (CLI start-up
included) and prepare's own (index.json's prepare_seconds), tokens/s and MB of input per second over
the latter, peak RSS, and the peak's ratio to the smallest size's of the same format, measured in the same run
(the goal: ~1.0, memory flat in the input's size). `uptime` before and after gives the machine's load.
Shards are deleted after each run unless --keep (they are ~2 bytes per token).

The documents are text-like and synthetic: this Python's standard library sources cut at line breaks
into pieces of 0.5-6 KB, shuffled with a fixed seed, each pass over them reshuffled and each piece
prefixed by its document number, until the file reaches its size (FineWeb's documents average ~3 KB).
Parquet: one string column `text` (and an int64 `id`), row groups of 2,000 rows, snappy (pyarrow's
default). JSONL: {"id", "text"} per line, zstd level 3 in one stream.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from scalelab.train.data.corpus import default_corpus_files

_ROWS_PER_GROUP = 2_000  # ~6 MB of text a row group


def _pieces(seed: int) -> list[str]:
    """The stdlib sources cut at line breaks into pieces of 0.5-6 KB, in a seeded order."""
    rng = random.Random(seed)
    pieces = []
    for f in default_corpus_files():
        text = f.read_bytes().decode("utf-8", errors="replace")
        at = 0
        while at < len(text):
            end = text.find("\n", at + rng.randint(500, 6000))
            end = len(text) if end < 0 else end + 1
            pieces.append(text[at:end])
            at = end
    rng.shuffle(pieces)
    return pieces


def documents(seed: int = 0) -> Iterator[str]:
    """Endless text-like documents: passes over the shuffled pieces, each pass reshuffled."""
    rng = random.Random(seed)
    pieces = _pieces(seed)
    n = 0
    while True:
        for piece in pieces:
            yield f"# document {n}\n{piece}"
            n += 1
        rng.shuffle(pieces)


def write_parquet(path: Path, target_bytes: int) -> int:
    """A Parquet file of about `target_bytes` on disk; returns the text bytes it holds."""
    docs, text_bytes, n = documents(), 0, 0
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, pa.schema([("id", pa.int64()), ("text", pa.string())])) as writer:
        while tmp.stat().st_size < target_bytes:
            batch = [next(docs) for _ in range(_ROWS_PER_GROUP)]
            text_bytes += sum(len(t.encode()) for t in batch)
            writer.write_table(pa.table({"id": list(range(n, n + len(batch))), "text": batch}))
            n += len(batch)
    tmp.rename(path)
    return text_bytes


def write_jsonl_zst(path: Path, target_bytes: int) -> int:
    """A zstd-compressed JSONL file of about `target_bytes` on disk; returns the text bytes it holds."""
    docs, text_bytes, n = documents(), 0, 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as out:
        while raw.tell() < target_bytes:
            lines = []
            for _ in range(1000):
                text = next(docs)
                text_bytes += len(text.encode())
                lines.append(json.dumps({"id": n, "text": text}) + "\n")
                n += 1
            out.write("".join(lines).encode())
    tmp.rename(path)
    return text_bytes


WRITERS = {"parquet": write_parquet, "jsonl.zst": write_jsonl_zst}


def corpus(workdir: Path, fmt: str, size_mb: int) -> tuple[Path, int]:
    """The cached corpus file and its text bytes (written on first use)."""
    path = workdir / f"corpus-{size_mb}mb.{fmt}"
    meta = path.with_name(path.name + ".json")
    if not (path.exists() and meta.exists()):
        t0 = time.perf_counter()
        text_bytes = WRITERS[fmt](path, size_mb * 10**6)
        meta.write_text(json.dumps({"text_bytes": text_bytes}))
        print(f"  wrote {path} ({path.stat().st_size / 1e6:,.0f} MB) in {time.perf_counter() - t0:.0f} s", flush=True)
    return path, json.loads(meta.read_text())["text_bytes"]


def prepare_child(path: Path, out: Path, tokenizer: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of `scalelab data prepare` in a child process."""
    cmd = [sys.executable, "-m", "scalelab.cli", "data", "prepare", str(path), "--out", str(out)]
    cmd += ["--tokenizer", tokenizer, "--progress", "off", "--overwrite"]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed")
    return seconds, usage.ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="100,1000", help="corpus file sizes on disk, MB (default 100,1000)")
    ap.add_argument("--formats", default="parquet,jsonl.zst", help="parquet and/or jsonl.zst")
    ap.add_argument("--tokenizer", default="byte", help="'byte' or a tokenizer.json (default byte)")
    ap.add_argument("--workdir", default="/tmp/scalelab-data-bench", help="corpora and shards go here")
    ap.add_argument("--keep", action="store_true", help="keep the prepared shards (shards-<fmt>-<MB>)")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = sorted(int(s) for s in args.sizes_mb.split(","))
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs")
    header = f"{'format':10s} {'file MB':>8s} {'text MB':>8s} {'tokens':>14s} {'wall s':>7s} {'prep s':>7s}"
    rows = [header + f" {'tokens/s':>11s} {'input MB/s':>10s} {'peak RSS MiB':>12s} {'RSS ratio':>9s}"]
    for fmt in args.formats.split(","):
        base_rss = None
        for size in sizes:
            path, text_bytes = corpus(workdir, fmt, size)
            out = workdir / f"shards-{fmt}-{size}"
            seconds, rss = prepare_child(path, out, args.tokenizer)
            index = json.loads((out / "index.json").read_text())
            tokens, prep = sum(index["num_tokens"].values()), index["prepare_seconds"]
            base_rss = base_rss or rss
            rows.append(
                f"{fmt:10s} {path.stat().st_size / 1e6:8,.0f} {text_bytes / 1e6:8,.0f} {tokens:14,} {seconds:7.1f} "
                f"{prep:7.1f} {tokens / prep:11,.0f} {path.stat().st_size / 1e6 / prep:10.1f} {rss / 2**20:12,.0f} "
                f"{rss / base_rss:9.2f}"
            )
            print(rows[-1], flush=True)
            if not args.keep:
                shutil.rmtree(out)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
