"""Which law: selection by backtest, the stacked law.

Law selection among candidate forms by backtest, the stacked law (forms combined in log space by forward evidence),
and synthetic tables drawn from a known law to check them on.
"""
