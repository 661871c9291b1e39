"""The research protocols: scripts that train, fit and score on the package's public API, each run as
`python experiments/NAME.py ...` (the command docs/ cite) and smoke-tested by calling its `main(argv)`
on a tiny configuration (tests/test_experiments_smoke.py and the protocol's own test module). What
several experiments share is a public function of the package, or, for what belongs to the experiments
alone (their data's loaders, their synthetic truths, measurements no product code makes), a public
name of another experiment imported as `experiments.NAME`. The speed and memory benches that print
same-run ratios are bench/. docs/architecture.md, "Experiments", says the rules.
"""
