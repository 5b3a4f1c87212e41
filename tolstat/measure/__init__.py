"""Measurement: the error of one output against its float64 reference.

Element-wise metrics (:mod:`~tolstat.measure.metrics`), the operator noise model and its
whole-output statistics (:mod:`~tolstat.measure.noise`), their fused numba kernels and the
DLPack bridge. numpy and numba only: nothing here knows of xarray or of error datasets.
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("metrics", "invariants", "noise", "fused", "dlpack"))
