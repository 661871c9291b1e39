"""scalelab: scaling-law experiments for LLM pretraining.

The repository root holds the subpackages (models, parallel, kernels, train, sweeps, fitting,
analysis, cli); pyproject.toml maps each into `scalelab.<folder>`. See ARCHITECTURE.md in shared/.
"""

__version__ = "0.1.0"
