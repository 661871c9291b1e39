"""Hyperparameter laws: the best learning rate and its laws against size and compute.

The best LR of one size and log-log laws of an optimum against compute; an optimizer setting's optimum over (N, D)
and the loss a setting away from it costs (the recipe audit's laws).
"""
