"""The registered recipe audit's inputs to the first-round stores, rebuilt on a re-run of the audit.

The stores of docs/first-round.md read three things from the audit's audit.json: the audited recipe
(`audited_recipe`: the LR law rounded to 4 figures, the weight-decay timescale to 3), the frontier
N*(C) that centres the design, and the cells and bootstrap draws the recipe gate checks the design
against. The registered audit.json stayed on the machine that trained it; the audit re-run on
another machine type does not reproduce it (its runs' losses differ by up to 0.3%, enough to move
the audit's flat optima: docs/results/recipe-audit.md). This writes an audit.json that gives the
registered recipe exactly and the registered frontier at the figures the docs print, on the re-run's
cells, with the re-run's LR-law and timescale draws moved by the difference between the two laws
(so the gate's intervals keep the re-run's spread about the registered law).

    python experiments/first_round_audit_rebuild.py --rerun results/first_round/audit --out DIR
    python experiments/first_round_audit_rebuild.py --rerun A --out DIR --frontier E=1.3,A=60,B=1000,alpha=0.5,beta=0.6

The defaults are the registered values (docs/results/recipe-audit.md: the audited recipe's JSON line
and the frontier line of its table).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from scalelab.errors import UsageError, run_script
from scalelab.sweeps.recipes.recipe_audit import AUDIT_FILE, audited_recipe, load_audit

# docs/results/recipe-audit.md, the audited recipe: lr and weight_decay as `audited_recipe` rounds them
REGISTERED_LR = {"ref_params": 40310.0, "ref_lr": 0.006694, "exponent": -0.515, "ref_num_tokens": 1008000.0,
                 "tokens_exponent": 0.138}  # fmt: skip
REGISTERED_TIMESCALE = 1.0
REGISTERED_FRONTIER = "E=1.29,A=58.7,B=1040,alpha=0.532,beta=0.62"  # its table's frontier line, 3 figures


def _ln_lr(coef: list[float], law: dict, params: float, tokens: float) -> float:
    return coef[0] + coef[1] * math.log(params / law["ref_params"]) + coef[2] * math.log(tokens / law["ref_tokens"])


def rebuild(rerun: dict, lr: dict, timescale: float, frontier: dict[str, float]) -> dict:
    """The re-run audit's dict with its LR law, timescale law and frontier set to the given ones."""
    out = json.loads(json.dumps(rerun))
    law = out["lr_law"]
    if law is None or law["terms"] != ["params", "tokens"]:
        raise UsageError("--rerun: its LR law is not of (N, D); rebuild needs one to move")
    target = [math.log(lr["ref_lr"]), lr["exponent"], lr["tokens_exponent"]]
    ref = (lr["ref_params"], lr["ref_num_tokens"])
    at_ref = _ln_lr(law["coef"], law, *ref)  # the re-run law at the registered reference point
    law["draws"] = [
        [_ln_lr(k, law, *ref) - at_ref + target[0], *(k[i] - law["coef"][i] + target[i] for i in (1, 2))]
        for k in law["draws"]
    ]
    law.update(ref_params=ref[0], ref_tokens=ref[1], coef=target)
    wd = out["wd_law"]
    if wd is None:
        raise UsageError("--rerun: no weight-decay timescale law to move")
    shift = math.log(timescale) - wd["coef"][0]
    wd["draws"] = [[k[0] + shift] for k in wd["draws"]]
    wd["coef"] = [math.log(timescale)]
    out["frontier"]["params"] = dict(frontier)
    out["warnings"] = [*out["warnings"], "rebuilt: the recipe and frontier given, the re-run's cells and draws"]
    return out


def _frontier(text: str) -> dict[str, float]:
    try:
        pairs = dict(p.split("=") for p in text.split(","))
        values = {k: float(pairs[k]) for k in ("E", "A", "B", "alpha", "beta")}
    except (ValueError, KeyError):
        raise UsageError(f"--frontier {text!r}: give E=..,A=..,B=..,alpha=..,beta=.. (Chinchilla)") from None
    return values


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rerun", required=True, help="the re-run audit's store (its audit.json)")
    ap.add_argument("--out", required=True, help="a directory for the rebuilt audit.json")
    ap.add_argument("--lr", default=json.dumps(REGISTERED_LR), help="the recipe's lr block, JSON")
    ap.add_argument("--timescale", type=float, default=REGISTERED_TIMESCALE)
    ap.add_argument("--frontier", default=REGISTERED_FRONTIER)
    args = ap.parse_args(argv)
    frontier = _frontier(args.frontier)
    try:
        lr = json.loads(args.lr)
    except ValueError:
        raise UsageError(f"--lr {args.lr!r}: not JSON; give the recipe's lr block") from None
    load_audit(args.rerun)  # a readable audit, or one line saying what to run
    path = Path(args.rerun)
    rerun = json.loads(((path / AUDIT_FILE) if path.is_dir() else path).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / AUDIT_FILE).write_text(json.dumps(rebuild(rerun, lr, args.timescale, frontier), indent=1) + "\n")
    recipe = audited_recipe(load_audit(out))
    print(f"{out / AUDIT_FILE}: recipe {json.dumps(recipe)}; frontier {frontier}")


if __name__ == "__main__":
    run_script(main, __file__)
