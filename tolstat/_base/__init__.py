"""The base every step builds on: dtype facts and the one rounding to an output format,
argument validation, inference primitives (Clopper-Pearson, Holm, the budget verdict),
atomic writes, grouping of runs, numba's cache and the lazy package namespaces.

Private: the steps of the flow import from these modules; users do not.
"""
