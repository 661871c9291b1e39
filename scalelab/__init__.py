"""scalelab: scaling-law experiments for LLM pretraining.

The repository root holds the subpackages (store, models, parallel, kernels, train, sweeps, fitting,
analysis, cli); pyproject.toml maps each into `scalelab.<folder>`. docs/architecture.md describes
the floors they form and who may import whom.
"""

__version__ = "0.1.0"
