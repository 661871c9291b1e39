"""Sweep specs and generators, execution on Ray, the sweep store, next-sweep proposals."""
