"""`scalelab data`: train a BPE tokenizer, prepare token shards, show a shard dir's index.

scalelab data tokenizer --vocab-size 4096 --out tok.json [INPUTS...]   # default: the stdlib corpus
scalelab data prepare notes/ wiki.jsonl --out shards/mix --tokenizer tok.json --val-fraction 0.01
scalelab data prepare fineweb/*.parquet dolma/*.json.gz --out shards/web --tokenizer llama/tokenizer.json
scalelab data info shards/mix
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scalelab.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="tokenizers and token shards", description=__doc__)
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    t = dsub.add_parser("tokenizer", help="train a byte-level BPE tokenizer.json")
    t.add_argument("inputs", nargs="*", default=["default"], help="files, folders, JSONL (default: stdlib)")
    t.add_argument("--vocab-size", type=int, required=True, help="ids incl. 256 bytes and <|endoftext|>")
    t.add_argument("--out", required=True, help="where to write tokenizer.json")
    _add_reading_args(t)
    t.set_defaults(func=run)

    q = dsub.add_parser("prepare", help="tokenize text into train.bin / val.bin / index.json")
    q.add_argument(
        "inputs",
        nargs="+",
        help="text files, folders, Parquet, JSONL (.jsonl, .jsonl.gz, .json.gz, .jsonl.zst, .json.zst), "
        "or 'default' (the stdlib corpus)",
    )
    q.add_argument("--out", required=True, help="output shard dir (must not exist unless --overwrite)")
    q.add_argument(
        "--tokenizer", default="byte", help="'byte' (default) or a Hugging Face tokenizer.json (GPT-2/Llama BPE)"
    )
    q.add_argument("--val-fraction", type=float, default=0.01, help="share of tokens held out (by document)")
    q.add_argument("--val-tokens", type=int, default=None, help="hold out at least this many tokens instead")
    q.add_argument("--overwrite", action="store_true", help="replace an existing --out dir")
    q.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="input read so far: a bar on a terminal; auto (default) prints a plain line every 30 s elsewhere",
    )
    _add_reading_args(q)
    q.set_defaults(func=run)

    i = dsub.add_parser("info", help="print a prepared shard dir's index.json summary")
    i.add_argument("dir", help="a prepared shard dir")
    i.add_argument("--json", action="store_true", help="print the full index.json")
    i.set_defaults(func=run)


def _add_reading_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--patterns", default=None, help="comma-separated globs for folders, e.g. '*.py,*.md'")
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet column holding the text (default: text)")


def _patterns(args: argparse.Namespace) -> list[str] | None:
    return [s.strip() for s in args.patterns.split(",") if s.strip()] if args.patterns else None


def run(args: argparse.Namespace) -> int:
    if args.data_command == "tokenizer":
        return _tokenizer(args)
    if args.data_command == "prepare":
        return _prepare(args)
    return _info(args)


def _tokenizer(args: argparse.Namespace) -> int:
    from scalelab.train.data.corpus import check_inputs
    from scalelab.train.data.tokenizer import train_bpe

    check_inputs(args.inputs, _patterns(args), args.text_field)  # one-line error for a missing path, bad file
    t0 = time.perf_counter()
    tok = train_bpe(args.inputs, args.vocab_size, args.out, patterns=_patterns(args), text_field=args.text_field)
    print(f"wrote {tok.spec}: vocab {tok.vocab_size}, eot id {tok.eot_id} ({time.perf_counter() - t0:.1f} s)")
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from scalelab.train.data.corpus import check_inputs
    from scalelab.train.data.prepare import prepare
    from scalelab.train.data.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    # bad input is one line before a bar is drawn (prepare checks again: headers and first lines only)
    total = sum(f.stat().st_size for f in check_inputs(args.inputs, _patterns(args), args.text_field))
    t0 = time.perf_counter()
    with _Progress(total, args.progress) as progress:
        src = prepare(
            args.inputs,
            args.out,
            tok,
            val_fraction=args.val_fraction,
            val_tokens=args.val_tokens,
            patterns=_patterns(args),
            text_field=args.text_field,
            overwrite=args.overwrite,
            on_read=progress.update,
        )
    seconds = time.perf_counter() - t0
    tokens = sum(src.index["num_tokens"].values())
    rates = f"{tokens / seconds:,.0f} tokens/s, {total / seconds / 1e6:.1f} MB/s of input"
    print(f"prepared {src.path} in {seconds:.1f} s ({rates})")
    _print_summary(src.index)
    return 0


class _Progress:
    """Bytes of input read: a tqdm bar on a terminal (or --progress on); with auto elsewhere (a log
    file, a batch job) a plain line every 30 s instead of a bar's carriage returns; off: nothing."""

    def __init__(self, total: int, mode: str) -> None:
        self.total, self.done, self.bar = total, 0, None
        self.lines = mode == "auto" and not sys.stderr.isatty()
        self.t0 = self.last = time.monotonic()
        if mode == "on" or (mode == "auto" and not self.lines):
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc="read", dynamic_ncols=True)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.lines and time.monotonic() - self.last >= 30:
            self.last = time.monotonic()
            rate = self.done / max(self.last - self.t0, 1e-9) / 1e6
            print(f"read {self.done / 1e6:,.0f} of {self.total / 1e6:,.0f} MB ({rate:.1f} MB/s)", file=sys.stderr)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


def _info(args: argparse.Namespace) -> int:
    from scalelab.train.data.shards import PreparedSource

    if not Path(args.dir).expanduser().exists():
        raise UsageError(f"{args.dir} does not exist")
    src = PreparedSource(args.dir)
    if args.json:
        print(json.dumps(src.index, indent=2))
    else:
        print(src.path)
        _print_summary(src.index)
    return 0


def _print_summary(ix: dict) -> None:
    print(f"  tokenizer {ix['tokenizer']} (vocab {ix['vocab_size']}, {ix['dtype']})")
    for split, s in ix["splits"].items():
        bpt = s["num_bytes"] / s["num_tokens"] if s["num_tokens"] else float("nan")
        print(
            f"  {split:5s} {s['num_tokens']:>14,} tokens {s['num_bytes']:>14,} bytes "
            f"{s['num_documents']:>8,} docs  {bpt:.3f} bytes/token"
        )
    print(f"  content hash {ix['content_hash'][:16]}  sources {', '.join(ix['sources'])}")
