"""Plots, HTML reports, architecture comparison and evaluation-noise analysis."""
