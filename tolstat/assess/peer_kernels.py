"""numba kernel of the peers' run variables (:class:`tolstat.assess.rules.EagerBaseline`):
one pass over an output, its eager output and the reference, for what the eager-relative
rules compare (torch dynamo's ``same``, FlashAttention's test rule)."""

from __future__ import annotations

import numba
import numpy as np

from tolstat._base import numba_cache as _numba_cache

__all__ = ["peer_pass"]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@numba.njit(cache=True, nogil=True)
def peer_pass(a: np.ndarray, eager: np.ndarray, ref: np.ndarray, ref_lp: np.ndarray,
              d: np.ndarray) -> tuple[float, float]:  # pragma: no cover - numba
    """One pass over flat float64 arrays of one size; returns ``(close, lp)``:

    * ``d[i] = ref[i] - a[i]`` (written; the RMSE is ``sqrt(dot(d, d) / n)``, summed by the
      caller so that it is numpy's sum);
    * ``close = max_i c_i``: ``c_i = 0`` where ``eager[i] == a[i]`` (equal infinities
      included, as ``torch.isclose``), else ``|eager[i] - a[i]| / (1 + |a[i]|)`` where both
      are finite, else ``inf``;
    * ``lp = max_i |a[i] - ref_lp[i]|`` (0 where they are equal, equal infinities
      included), ``inf`` when some difference is NaN (a NaN output fails every comparison).

    Both maxima are 0.0 for empty arrays. Each term is the numpy expression's element, so
    the maxima equal numpy's, bit for bit.
    """
    close = 0.0
    lp = 0.0
    lp_nan = False
    for i in range(a.size):
        ai = a[i]
        ei = eager[i]
        d[i] = ref[i] - ai
        if ei != ai:
            if np.isfinite(ei) and np.isfinite(ai):
                c = abs(ei - ai) / (1.0 + abs(ai))
            else:
                c = np.inf
            if c > close:
                close = c
        li = ref_lp[i]
        if li != ai:
            v = abs(ai - li)
            if v != v:
                lp_nan = True
            elif v > lp:
                lp = v
    return close, (np.inf if lp_nan else lp)
