"""Sweep specs: a YAML file to validated runs, each addressed by the hash of its config.

The spec and the checks its sections share, the design context every generator sizes runs through, the generators
with modules of their own (isoflop, seeds, WSD cooldowns), and RunSpec, one resolved run. A section another
sub-package owns (the recipe and its gate, early stopping, W&B, a study) is parsed by its owner there, with the
checks here.
"""
