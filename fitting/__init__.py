"""Scaling-law fitting: law forms, robust fits, intervals, backtests, allocation.

Pure numerical code: depends on numpy/scipy/statsmodels/scikit-learn/torch, never on Ray or training.
"""
