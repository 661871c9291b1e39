"""`scalelab models`: the preset ladder (or the shape rule's answer) with parameter and FLOP counts.

    scalelab models                                  # every preset at its max_seq_len
    scalelab models --seq-len 2048 --vocab-size 32000
    scalelab models --target-params 3e8 --vocab-size 50304   # what the shape rule builds
    scalelab models --json                           # one JSON object per line

N counts the tied embedding matrix once; N_nonemb excludes the input embedding only. FLOPs are
training FLOPs per token: 6N, and the exact count (matmuls + full T x T attention, x3 for fwd+bwd;
see scalelab.models.accounting).
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list model presets with parameter and FLOP counts", description=__doc__)
    p.add_argument("names", nargs="*", help="presets to show (default: all)")
    p.add_argument("--seq-len", type=int, default=None, help="FLOPs at this length (default: max_seq_len)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="replace the presets' vocabulary size (--target-params: default 320)",
    )
    p.add_argument("--target-params", type=float, default=None, help="show the shape rule's config for this N instead")
    p.add_argument("--json", action="store_true", help="print one JSON object per model")
    p.set_defaults(func=run)


def _fmt(x: float, billion: str = "G") -> str:
    """SI-style short number; parameter counts use B for 1e9."""
    for unit, scale in (("T", 1e12), (billion, 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def run(args) -> int:
    # start-up time: the model package imports torch (~1 s); `scalelab --help` builds this parser
    from scalelab.models.accounting import model_summary
    from scalelab.models.presets import get_preset, list_presets
    from scalelab.models.shapes import shape_for_params

    if args.target_params is not None:
        vocab = args.vocab_size or 320
        rows = [("target", model_summary(shape_for_params(args.target_params, vocab), args.seq_len))]
    else:
        names = args.names or list_presets()
        rows = [(n, model_summary(get_preset(n, vocab_size=args.vocab_size), args.seq_len)) for n in names]
    if args.json:
        for name, row in rows:
            print(json.dumps({"name": name, **row}))
        return 0
    header = f"{'name':<10} {'N':>7} {'N_nonemb':>8} {'6N/tok':>7} {'exact/tok':>9} {'seq':>5} "
    header += f"{'layers':>6} {'d_model':>7} {'heads':>6} {'d_ff':>6} {'vocab':>6} tied"
    print(header)
    for name, r in rows:
        print(
            f"{name:<10} {_fmt(r['num_params'], 'B'):>7} {_fmt(r['num_params_nonembedding'], 'B'):>8} "
            f"{_fmt(r['flops_per_token_6n']):>7} {_fmt(r['flops_per_token_exact']):>9} {r['seq_len']:>5} "
            f"{r['num_layers']:>6} {r['d_model']:>7} {r['num_heads']:>3}/{r['num_kv_heads']:<2} "
            f"{r['d_ff']:>6} {r['vocab_size']:>6} {'yes' if r['tied_embeddings'] else 'no'}"
        )
    return 0
