"""Estimators: one law fitted to one table (Approaches 1, 2 and 3).

Approach 3 is a robust multi-start fit (a batched, bound-constrained L-BFGS on a Huber loss of log loss, solved once
per process); Approaches 1 and 2 take IsoFLOP minima without a parametric law. Beside them: the run table they read,
input checks and fit diagnostics, delta-method intervals.
"""
