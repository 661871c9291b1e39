"""What each printed quantity of a fit is: the law's formula, one line per parameter and per derived
quantity, and which law made the numbers (for `scalelab fit`, the demo and the report's fit section,
so that they say it in the same words).

    law_formula("chinchilla")            # 'L(N, D) = E + A / N^alpha + B / D^beta'
    meaning("chinchilla", "G")           # 'N*(C) = G (C/6)^a, D*(C) = (C/6)^b / G; ...'
    law_heading(record)                  # 'auto: the stacked law (chinchilla 1.00, kaplan 0.00)'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FORMULAS = {
    "chinchilla": "L(N, D) = E + A / N^alpha + B / D^beta",
    "kaplan": "L(N, D) = [(Nc / N)^(alpha_N / alpha_D) + Dc / D]^alpha_D",
    "farseer": "L(N, D) = E + A / N^alpha + B (N / 1e6)^gamma / D^beta",
    "power_law": "L(C) = E + A C^-alpha",
    "power_law_no_e": "L(C) = A C^-alpha",
    "data_constrained": "L = E + A / N'^alpha + B / D'^beta, N' and D' the size and data repeats are worth",
    "lr_annealing": "L(N, s) = E + A / N^alpha + B / S1^beta - C S2 (S1: LR-weighted tokens, S2: annealing area)",
    "lr_area": "L(N, s) = E + A / N^alpha + B / S1^beta (S1: LR-weighted tokens)",
    "lr_annealing_sized": "L(N, s) = E + A / N^alpha + B N^gamma / S1^beta - C S2",
}

_SIZE_DATA = {  # the Chinchilla form's terms, shared by the laws built on it
    "E": "irreducible loss: what no size or data removes (nats/token)",
    "A": "scale of the size term A / N^alpha",
    "alpha": "how fast the loss falls with parameters N (the size term's exponent)",
    "B": "scale of the data term B / D^beta",
    "beta": "how fast the loss falls with training tokens D (the data term's exponent)",
}
PARAMETERS: dict[str, dict[str, str]] = {
    "chinchilla": _SIZE_DATA,
    "farseer": {**_SIZE_DATA, "gamma": "how the data term's scale grows with N ((N / 1e6)^gamma; 0: Chinchilla)"},
    "data_constrained": {
        **_SIZE_DATA,
        "R_D_star": "repeats of the data after which more epochs are worth little (R_D*)",
        "R_N_star": "excess size beyond the data's optimum after which more parameters are worth little (R_N*)",
    },
    "kaplan": {
        "Nc": "size scale of the law (N in Kaplan et al.'s units)",
        "Dc": "data scale of the law (tokens)",
        "alpha_N": "how fast the loss falls with parameters N",
        "alpha_D": "how fast the loss falls with tokens D",
    },
    "power_law": {"E": "irreducible loss (nats/token)", "A": "scale of the compute term", "alpha": "exponent in C"},
    "power_law_no_e": {"A": "scale of the compute term", "alpha": "exponent in C"},
    "lr_annealing": {
        **_SIZE_DATA,
        "B": "scale of the data term B / S1^beta",
        "beta": "how fast the loss falls with the LR-weighted tokens S1",
        "C": "how much annealing the LR lowers the loss (the S2 term)",
    },
    "lr_area": {**_SIZE_DATA, "beta": "how fast the loss falls with the LR-weighted tokens S1"},
}
PARAMETERS["lr_annealing_sized"] = {**PARAMETERS["lr_annealing"], "gamma": "how the data term's scale grows with N"}
DERIVED = {
    "a": "N*(C) grows as C^a: a = beta / (alpha + beta)",
    "n_opt_exponent": "a: N*(C) grows as C^a, a = beta / (alpha + beta)",
    "d_opt_exponent": "b: D*(C) grows as C^b, b = alpha / (alpha + beta) = 1 - a",
    "G": "N*(C) = G (C/6)^a and D*(C) = (C/6)^b / G: G = (alpha A / (beta B))^(1 / (alpha + beta))",
}


def law_formula(law: str) -> str:
    return FORMULAS.get(law, "")


def meaning(law: str, name: str) -> str:
    """What parameter or derived quantity `name` of `law` is ('' when not known)."""
    return PARAMETERS.get(law, {}).get(name) or DERIVED.get(name, "")


def stacked_weights(stacked: Mapping[str, Any] | None) -> dict[str, float]:
    """The stacked law's weights of a saved fit's `stacked` entry (StackedFit.to_dict), {} without one."""
    if not stacked:
        return {}
    weights = stacked.get("weights") or (stacked.get("stack") or {}).get("weights") or {}
    return {str(k): float(v) for k, v in weights.items()}


def law_heading(record: Mapping[str, Any]) -> str:
    """Which law made a fit's numbers: its own name, or for law auto the stacked law with its weights
    and the incumbent whose parameters, allocation and gates the fit reports."""
    weights = stacked_weights(record.get("stacked"))
    if not weights:
        return str(record["law"])
    shown = ", ".join(f"{name} {w:.2f}" for name, w in weights.items())
    return f"auto: the stacked law ({shown}), with the parameters of {record['law']}, the incumbent"


def stacked_note(record: Mapping[str, Any]) -> str:
    """For a stacked fit, what is whose: '' for a single law."""
    if not stacked_weights(record.get("stacked")):
        return ""
    law = record["law"]
    return (
        f"The parameters, the compute-optimal N* and D*, the backtests and the gates are those of {law}, the "
        "incumbent law; the loss predictions and their intervals (the proposed round, the ledger) are the "
        "stacked law's: each candidate form weighted by how it did in forward backtests."
    )
