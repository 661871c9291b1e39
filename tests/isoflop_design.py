"""A noiseless IsoFLOP design around a known Chinchilla law's optimum, shared by the fit tests that
need one (tests/test_fit_stacking.py, tests/test_identify.py)."""

import math

import numpy as np

from scalelab.fitting.allocation.allocate import optimum_for_law
from scalelab.fitting.forms.laws import get_law

CHIN = {"E": 1.2, "A": 60.0, "B": 80.0, "alpha": 0.32, "beta": 0.30}


def isoflop_design(budgets, sizes=4, span=3.0):
    """(N, D, C) of `sizes` runs per budget, log-spaced `span` either side of CHIN's optimum N*."""
    opt = optimum_for_law(get_law("chinchilla"))
    n, d, c = [], [], []
    for budget in budgets:
        n_star = opt(CHIN, budget)[0]
        for x in n_star * np.exp(np.linspace(-math.log(span), math.log(span), sizes)):
            n.append(x)
            d.append(budget / (6 * x))
            c.append(budget)
    return np.array(n), np.array(d), np.array(c)
