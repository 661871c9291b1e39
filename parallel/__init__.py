"""Parallel layouts applied from outside the model: ParallelDims, parallelize, pipelines, CP, EP."""
