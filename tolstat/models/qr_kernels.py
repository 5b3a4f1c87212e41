"""numba kernel of :func:`tolstat.models.scale.quantreg`: the residuals' weights of one
iteration of statsmodels' ``QuantReg`` IRLS, in one pass (the weighted design is then one
flat numpy division, which numpy vectorises). Kept apart from :mod:`tolstat.models.scale`, which imports xarray."""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["residual_weights"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True)
def residual_weights(endog: np.ndarray, fit: np.ndarray, q: float, omq: float,
                     w: np.ndarray) -> None:  # pragma: no cover - numba
    """``w = |rho'|`` of the residuals ``endog - fit``, each repeated ``p = w.size // n``
    times (``w`` is laid out like the C-ordered ``(n, p)`` design, so that ``exog / w`` is
    one flat division): statsmodels' steps, element by element and in its order (so bit
    for bit its values): a residual below 1e-6 in magnitude becomes +-1e-6 (its sign;
    +1e-6 for zero), then ``q * r`` where ``r < 0`` else ``omq * r`` (``omq = 1 - q``),
    then its absolute value."""
    n = endog.size
    p = w.size // n
    for i in range(n):
        r = endog[i] - fit[i]
        if abs(r) < 0.000001:
            r = 0.000001 if r >= 0 else -0.000001
        r = abs(q * r if r < 0 else omq * r)
        for j in range(p):
            w[i * p + j] = r
