"""`scalelab coordcheck CONFIG --widths 64,128,256,512 [--depths 2,4] --steps 4`: µP coordinate check.

Trains CONFIG's model at each width (and depth) for a few AdamW steps at one LR on CONFIG's data
and prints, per parametrization, the RMS of every layer's output (and of the logits) after the last
step against width, with the log-log slope; the plot (one panel per step) and every measurement go
to --out. Flat (|slope| <= ~0.1) = activations do not grow with width; SP's hidden layers grow
~width^1.5-2.5 at a LR that suits the smallest width. Logic: scalelab.train.coordcheck.

    scalelab coordcheck examples/debug.yaml --widths 64,128,256,512 --parametrizations sp,mup,completep
    scalelab coordcheck examples/debug.yaml --widths 64,256 --depths 2,4 --parametrizations completep

Widths keep CONFIG's heads (head_dim grows); the base shape of mup/completep is CONFIG's model
(or its base_d_model / base_num_layers / base_head_dim / base_d_ff when set). Every model trains on
the same --batch-sequences batches and is measured on one --probe-sequences batch that none of
them trains on; each RMS is the geometric mean over --seeds inits (noise from one init shows up
as non-monotone RMS across widths, and so as slope).
"""

from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("coordcheck", help="coordinate check of sp / mup / completep", description=__doc__)
    p.add_argument("config", help="run config YAML (model, data, optim.lr)")
    p.add_argument("--widths", default="64,128,256,512", help="comma-separated d_model values (default 64,128,256,512)")
    p.add_argument("--depths", default="", help="comma-separated num_layers values (default: the config's)")
    p.add_argument("--steps", type=int, default=4, help="AdamW steps per model (default 4)")
    p.add_argument("--parametrizations", default="", help="e.g. sp,mup,completep (default: the config's)")
    p.add_argument("--seeds", type=int, default=4, help="inits averaged per model (geometric mean; default 4)")
    p.add_argument("--lr", type=float, default=0.0, help="constant LR (default: the config's optim.lr)")
    p.add_argument("--batch-sequences", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument(
        "--probe-sequences", type=int, default=32, help="sequences the RMS is measured on, not trained on (default 32)"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--out", default="", help="directory for coordcheck.png and coordcheck.json")
    p.set_defaults(func=run)


def _ints(text: str, key: str) -> list[int]:
    from scalelab.errors import ConfigError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(key, f"{text!r} is not a comma-separated list of integers", "e.g. 64,128,256") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(key, f"{text!r} must list positive integers", "e.g. 64,128,256")
    return values


def _check(args, cfg) -> tuple[list[int], list[int], list[str]]:
    """The parsed lists; ConfigError naming the option for anything the models cannot be built with."""
    from scalelab.errors import ConfigError
    from scalelab.models.parametrization import PARAMETRIZATIONS

    widths = _ints(args.widths, "--widths")
    depths = _ints(args.depths, "--depths") if args.depths else [cfg.model.num_layers]
    heads = cfg.model.num_heads
    for w in widths:
        if w % heads or (w // heads) % 2:
            raise ConfigError(
                "--widths", f"{w} is not {heads} heads of an even head_dim", f"use multiples of {2 * heads}"
            )
    names = [x.strip() for x in args.parametrizations.split(",") if x.strip()] or [cfg.model.parametrization]
    for name in names:
        if name not in PARAMETRIZATIONS:
            raise ConfigError("--parametrizations", f"{name!r} is not known", f"use {','.join(PARAMETRIZATIONS)}")
    for key in ("steps", "seeds", "batch_sequences", "probe_sequences"):
        if getattr(args, key) < 1:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(flag, f"{getattr(args, key)} must be >= 1", f"e.g. {flag} 4")
    if len(widths) < 2:
        raise ConfigError("--widths", "one width has no slope", "give two or more, e.g. 64,128,256,512")
    return widths, depths, names


def run(args) -> int:
    import dataclasses

    import torch

    from scalelab.train.config import load_run_config
    from scalelab.train.coordcheck import coord_check
    from scalelab.train.data.bundle import build_data

    cfg = load_run_config(args.config, args.set)
    widths, depths, names = _check(args, cfg)
    optim = dataclasses.replace(cfg.optim, lr=args.lr or cfg.optim.lr)
    torch.manual_seed(cfg.train.seed)
    data = build_data(cfg.data, seed=cfg.data_order_seed)
    batches = [data.sampler.next_batch(args.batch_sequences) for _ in range(args.steps)]
    probe = data.sampler.next_batch(args.probe_sequences)[:, :-1]  # a fixed batch none of the models trains on
    check = coord_check(
        cfg.model, widths=widths, depths=depths, steps=args.steps, batches=batches, optim_cfg=optim,
        parametrizations=names, seeds=args.seeds, probe=probe,
    )  # fmt: skip
    print(check.table())
    if args.out:
        from scalelab.analysis.plots import plot_coordcheck

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        fig = plot_coordcheck(check)
        fig.savefig(out / "coordcheck.png", dpi=110)
        slopes = [dict(parametrization=p, depth=d, layer=k, slope=v) for (p, d, k), v in check.slopes.items()]
        depth_slopes = [dict(parametrization=p, layer=k, slope=v) for (p, k), v in check.depth_slopes.items()]
        record = dict(
            config=args.config, widths=widths, depths=depths, steps=args.steps, lr=optim.lr, seeds=args.seeds,
            batch_sequences=args.batch_sequences, probe_sequences=args.probe_sequences, rows=check.rows(),
            slopes=slopes, depth_slopes=depth_slopes,
        )  # fmt: skip
        (out / "coordcheck.json").write_text(json.dumps(record, indent=1))
        print(f"wrote {out / 'coordcheck.png'} and {out / 'coordcheck.json'}")
    return 0
