"""numba kernel of :func:`tolstat.models.scale.quantreg`: the element-wise step of one
iteration of statsmodels' ``QuantReg`` IRLS (the residuals' weights and the weighted
design), in one pass. Kept apart from :mod:`tolstat.models.scale`, which imports xarray."""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["reweight"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True)
def reweight(endog: np.ndarray, fit: np.ndarray, exog: np.ndarray, q: float, omq: float,
             xstar: np.ndarray) -> None:  # pragma: no cover - numba
    """``xstar = exog / w[:, None]`` with ``w = |rho'|`` of the residuals ``endog - fit``:
    statsmodels' steps, element by element and in its order (so bit for bit its values):
    a residual below 1e-6 in magnitude becomes +-1e-6 (its sign; +1e-6 for zero), then
    ``q * r`` where ``r < 0`` else ``omq * r`` (``omq = 1 - q``), then its absolute value."""
    n, p = exog.shape
    for i in range(n):
        r = endog[i] - fit[i]
        if abs(r) < 0.000001:
            r = 0.000001 if r >= 0 else -0.000001
        r = abs(q * r if r < 0 else omq * r)
        for j in range(p):
            xstar[i, j] = exog[i, j] / r
