"""The one fit entry: a table of runs and a FitOptions in, a ScalingFit out.

`fit_runs` and its options (one type, built and checked in one place), what it returns, the identification gates and
degenerate-law findings it carries; a saved fit's one loader, and the predictions and allocations `scalelab predict`
and `allocate` make from a saved fit.
"""
