"""Law forms: the scaling laws, one registry.

Each law is a small typed object (parameter names, bounds, an init grid, a batched log-space predict) found by
`get_law`; fit_terms says in words what each printed quantity of a fit is.
"""
