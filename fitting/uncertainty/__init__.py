"""Uncertainty and backtests: bootstrap, prediction intervals, held-out and forward folds.

The bootstrap over runs; prediction intervals for a run the law has not seen (parameters, run noise, extrapolation
error per decade); the compute groups runs are held out by; backtests that hold out the largest compute; forward
folds, and the stacking weights scored on them.
"""
