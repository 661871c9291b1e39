"""The research protocols: scripts that train, fit and score on the package's public API, each run as
`python -m experiments.NAME` (or `python experiments/NAME.py`) and smoke-tested on a tiny configuration
in tests/test_experiments_*.py. What several experiments share is a public function of the package,
or, for what belongs to the experiments alone (their data's loaders, their synthetic truths), a public
name of another experiment imported as `experiments.NAME`. The speed and memory benches that print
same-run ratios are bench/. docs/architecture.md, "Experiments", says the rules.
"""
