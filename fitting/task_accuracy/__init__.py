"""Task accuracy from loss: the loss-to-accuracy sigmoid.

Step two of a downstream prediction (step one is a loss law; `scalelab predict-task` runs both,
analysis/downstream.py).
"""
