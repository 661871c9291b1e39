"""The closed loop: fit the store, check the gates, propose and launch the next round.

A store fitted with its spec's `fit:` options through the one fit entry, the next round proposed (typed, each run
with its prediction), round after round in one call (`run_rounds`), and `scalelab demo`, the loop end to end on a
laptop.
"""
