"""Compute-optimal allocation: N*(C), D*(C) and the compute frontier L*(C).

N*(C) and D*(C) from a law (and which laws can allocate), the frontier as measured (each compute group's lowest
loss) and as fitted with an interval calibrated by forward folds, and the one compute-optimal prediction every
command gives.
"""
