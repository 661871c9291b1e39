"""A store's fit as the report's plots draw it: StoreFit, read from a saved fit record.

    fit = store_fit_from_record(scaling_fit.to_record())      # or a fits/round_K.json record
    fit.params, fit.draw_dicts(), fit.predict(params=N, tokens=D)

The fit itself is made by the one fit entry, scalelab.fitting.entry.fit_runs.fit_runs (a store's:
scalelab.sweeps.closed_loop.store_fit.fit_store); this module only holds its record in the arrays the plots use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from scalelab.fitting.entry.saved_fit import SavedFit, load_saved_fit
from scalelab.fitting.forms.laws import get_law


@dataclass(kw_only=True, slots=True)
class StoreFit:
    """A law fitted to a store's runs, with bootstrap draws and a hold-out-the-largest-budget backtest."""

    law: str
    params: dict[str, float]
    draws: np.ndarray  # (n_boot, P) natural parameters, order law.param_names
    n: np.ndarray  # the runs fitted: params, tokens, loss, flops, run ids
    d: np.ndarray
    loss: np.ndarray
    flops: np.ndarray
    run_id: list[str]
    backtest: dict | None  # fitting.uncertainty.backtest.BacktestResult.to_dict(), or None when not possible
    warnings: list[str] = field(default_factory=list)

    def law_object(self):
        return get_law(self.law)

    def predict(self, law_params: dict[str, float] | None = None, **inputs) -> np.ndarray:
        """The law at `inputs` (e.g. params=N, tokens=D), with the fitted or the given parameters."""
        return self.law_object().predict(law_params or self.params, **inputs)

    def draw_dicts(self) -> list[dict[str, float]]:
        names = self.law_object().param_names
        return [dict(zip(names, row)) for row in self.draws]


def store_fit_from_record(record: dict | SavedFit) -> StoreFit:
    """The StoreFit the plots draw, from a store fit's record (scalelab.fitting.entry.scaling_fit.ScalingFit.to_record:
    what `sweep next` saves in fits/round_K.json), so the report shows exactly the round's fit."""
    fit = load_saved_fit(record, name="the store's fit record")
    law = get_law(fit.law)
    pts = fit.record["points"]
    draws = np.array([[d[name] for name in law.param_names] for d in fit.draws], dtype=float)
    holdout = fit.backtest.get("holdout")
    return StoreFit(
        law=law.name,
        params=dict(fit.params),
        draws=draws.reshape(-1, law.n_params),
        n=np.array(pts["params"], dtype=float),
        d=np.array(pts["tokens"], dtype=float),
        loss=np.array(pts["loss"], dtype=float),
        flops=np.array(pts["budgets"], dtype=float),
        run_id=list(fit.run_ids),
        backtest=holdout if holdout and "runs" in holdout else None,
        warnings=list(fit.warnings),
    )
