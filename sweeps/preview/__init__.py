"""`scalelab sweep plan`: what a spec would run and cost, nothing started.

The dry run (every run expanded and validated, its layout, memory and time from measured throughput) and what an
IsoFLOP design carries around a reference N*(C).
"""
