"""Is B better than A: two fitted laws compared at a target.

The compute-efficiency multiplier, the paired gap model and its gap with an interval of three parts, shared
exponents, one bootstrap over design points, and the one comparison result with its verdict in words (`scalelab
compare`, the studies).
"""
