"""Scaling-law fitting: law forms, robust fits, intervals, backtests, selection, allocation.

Pure numerical code: it fits tables (numpy, scipy, statsmodels, torch), never Ray, training or the store. The
sub-packages, from the bottom up (each imports only those listed before it):

    forms/          Law forms: the scaling laws, one registry.
    estimate/       Estimators: one law fitted to one table (Approaches 1, 2 and 3).
    uncertainty/    Uncertainty and backtests: bootstrap, prediction intervals, held-out and forward folds.
    loss_curves/    Loss-curve laws: one law fitted on every logged checkpoint of every run.
    allocation/     Compute-optimal allocation: N*(C), D*(C) and the compute frontier L*(C).
    selection/      Which law: selection by backtest, the stacked law.
    entry/          The one fit entry: a table of runs and a FitOptions in, a ScalingFit out.
    comparisons/    Is B better than A: two fitted laws compared at a target.
    hp_laws/        Hyperparameter laws: the best learning rate and its laws against size and compute.
    task_accuracy/  Task accuracy from loss: the loss-to-accuracy sigmoid.
"""
