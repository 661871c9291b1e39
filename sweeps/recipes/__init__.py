"""The small-scale training recipe, its audit and the gates that check it.

The rule that sets each run's batch, length, warmup and learning rate; the recipe audit (its `audit:` generator and
`scalelab sweep audit`); and the two gates before a design spends its compute, the recipe gate and the LR-transfer
gate.
"""
