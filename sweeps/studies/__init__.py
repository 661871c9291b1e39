"""Studies: arms crossed with one design, each compared with the baseline.

Named arms (config overrides) crossed with one design; each arm fitted the loop's way and compared with the baseline
(matched pairs, the paired gap, the joint law), the round that decides the study, and its verdict in words (`sweep
study`).
"""
