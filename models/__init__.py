"""Single-device model definitions, shape rules and exact parameter/FLOP accounting.

Knows nothing about process groups, Ray or files.
"""
