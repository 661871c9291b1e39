"""Watching runs as they train: loss curves, early stopping, W&B.

The loss curves of stored runs, early stopping of a run whose final loss is already known within the noise, the live
predicted final loss, and Weights & Biases (a sweep's runs, a round's fit, a store logged after the fact).
"""
