"""Exact empirical quantiles and top-k by selection (numba kernels).

The kernels work on plain float64 numpy arrays, one group per row of a 2-D array
(groups x observations, NaN padded). Each group is copied into a per-thread scratch
buffer (NaNs dropped) and the needed order statistics are found by introselect
(quickselect with median-of-three pivots and a sort fallback after too many rounds),
never by a full sort. Groups run in parallel (``prange`` over blocks of groups).

Results equal :func:`numpy.quantile` (and :func:`numpy.nanquantile` for
``nan_policy="omit"``) bit for bit for ``method`` in ``{"linear", "lower", "higher",
"nearest"}``, including numpy's handling of ``+inf`` (the 'linear' interpolation between
a finite value and ``inf`` at weight 0 is NaN in numpy, and so here).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

__all__ = [
    "QUANTILE_METHODS",
    "quantile",
    "quantile_groups",
    "kth_smallest_groups",
    "topk",
    "topk_groups",
]

#: supported interpolation methods -> kernel code
QUANTILE_METHODS = {"linear": 0, "lower": 1, "higher": 2, "nearest": 3}
NAN_POLICIES = ("raise", "omit")


# --------------------------------------------------------------------------- kernels
@njit(cache=True, nogil=True)
def _select(a, lo, hi, k):
    """Rearrange ``a[lo:hi+1]`` so that ``a[k]`` is its (k-lo)-th smallest; return it.

    Hoare-style quickselect (median-of-three pivot, ties split evenly so all-equal input
    is O(n)); after ``2*log2(n)+8`` rounds the remaining range is sorted (introselect).
    """
    budget = 2 * int(math.log2(hi - lo + 2)) + 8
    while hi > lo:
        if budget == 0:
            a[lo:hi + 1].sort()
            return a[k]
        budget -= 1
        mid = (lo + hi) >> 1
        # median of three into a[mid]
        if a[mid] < a[lo]:
            a[mid], a[lo] = a[lo], a[mid]
        if a[hi] < a[lo]:
            a[hi], a[lo] = a[lo], a[hi]
        if a[hi] < a[mid]:
            a[hi], a[mid] = a[mid], a[hi]
        pivot = a[mid]
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return a[k]
    return a[k]


@njit(cache=True, nogil=True)
def _fr_select(a, left, right, k):
    """Floyd-Rivest selection: ``a[k]`` becomes the (k-left)-th smallest of the range.

    For large ranges a small sample around the expected position is selected first
    (with :func:`_select`) to get two pivots-worth of a tight bracket, so the
    expected cost is about ``n + min(k, n - k)`` comparisons. Falls back to sorting
    the remaining range after too many rounds (bounded worst case).
    """
    budget = 2 * int(math.log2(right - left + 2)) + 8
    while right > left:
        if budget == 0:
            a[left:right + 1].sort()
            return a[k]
        budget -= 1
        if right - left > 600:
            n = right - left + 1
            i = k - left + 1
            z = math.log(n)
            s = 0.5 * math.exp(2.0 * z / 3.0)
            sgn = 1.0 if i - n / 2.0 >= 0 else -1.0
            sd = 0.5 * math.sqrt(z * s * (n - s) / n) * sgn
            new_left = max(left, int(math.floor(k - i * s / n + sd)))
            new_right = min(right, int(math.floor(k + (n - i) * s / n + sd)))
            _select(a, new_left, new_right, k)
        t = a[k]
        i = left
        j = right
        a[left], a[k] = a[k], a[left]
        if a[right] > t:
            a[right], a[left] = a[left], a[right]
        while i < j:
            a[i], a[j] = a[j], a[i]
            i += 1
            j -= 1
            while a[i] < t:
                i += 1
            while a[j] > t:
                j -= 1
        if a[left] == t:
            a[left], a[j] = a[j], a[left]
        else:
            j += 1
            a[j], a[right] = a[right], a[j]
        if j <= k:
            left = j + 1
        if k <= j:
            right = j - 1
    return a[k]


@njit(cache=True, nogil=True)
def _copy_valid(row, buf):
    m = 0
    for i in range(row.shape[0]):
        v = row[i]
        if not np.isnan(v):
            buf[m] = v
            m += 1
    return m


@njit(cache=True, nogil=True)
def _quantiles_of_buffer(buf, m, qs, method, out):
    """Quantiles of ``buf[:m]`` (mutated) at ``qs`` into ``out`` (numpy semantics)."""
    nq = qs.shape[0]
    if m == 0:
        for j in range(nq):
            out[j] = np.nan
        return
    lo_idx = np.empty(nq, np.int64)
    hi_idx = np.empty(nq, np.int64)
    gam = np.empty(nq, np.float64)
    for j in range(nq):
        v = (m - 1) * qs[j]
        if method == 0:
            prev = math.floor(v)
            if v >= m - 1:
                lo_idx[j] = m - 1
                hi_idx[j] = m - 1
                gam[j] = v + 1.0  # numpy sets previous index to -1 here
            else:
                lo_idx[j] = int(prev)
                hi_idx[j] = int(prev) + 1
                gam[j] = v - prev
        elif method == 1:
            lo_idx[j] = int(math.floor(v))
            hi_idx[j] = lo_idx[j]
        elif method == 2:
            lo_idx[j] = int(math.ceil(v))
            hi_idx[j] = lo_idx[j]
        else:
            lo_idx[j] = int(np.rint(v))
            hi_idx[j] = lo_idx[j]
    # needed positions, ascending and unique
    need = np.empty(2 * nq, np.int64)
    need[:nq] = lo_idx
    need[nq:] = hi_idx
    need.sort()
    start = 0
    last = -1
    for t in range(2 * nq):
        k = need[t]
        if k == last:
            continue
        if k == last + 1 and last >= 0:
            # the next order statistic is the minimum of the rest: one scan
            best = k
            for u in range(k + 1, m):
                if buf[u] < buf[best]:
                    best = u
            buf[k], buf[best] = buf[best], buf[k]
        else:
            _fr_select(buf, start, m - 1, k)
        start = k + 1
        last = k
    for j in range(nq):
        a = buf[lo_idx[j]]
        if method != 0:
            out[j] = a
        else:
            b = buf[hi_idx[j]]
            t = gam[j]
            d = b - a
            if t >= 0.5:
                out[j] = b - d * (1.0 - t)
            else:
                out[j] = a + d * t


@njit(cache=True, parallel=True)
def _quantile_groups_kernel(x, qs, method, nblocks):
    g = x.shape[0]
    nq = qs.shape[0]
    out = np.empty((g, nq), np.float64)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        buf = np.empty(x.shape[1], np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            m = _copy_valid(x[i], buf)
            nvalid[i] = m
            _quantiles_of_buffer(buf, m, qs, method, out[i])
    return out, nvalid


@njit(cache=True, parallel=True)
def _kth_groups_kernel(x, ranks, nblocks):
    """``ranks[i]``-th smallest (1-based) valid value of row i; NaN when out of range."""
    g = x.shape[0]
    out = np.empty(g, np.float64)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        buf = np.empty(x.shape[1], np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            m = _copy_valid(x[i], buf)
            nvalid[i] = m
            r = ranks[i]
            if r < 1 or r > m:
                out[i] = np.nan
            else:
                out[i] = _fr_select(buf, 0, m - 1, r - 1)
    return out, nvalid


@njit(cache=True, parallel=True)
def _topk_groups_kernel(x, k, nblocks):
    g = x.shape[0]
    out = np.full((g, k), np.nan)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        buf = np.empty(x.shape[1], np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            m = _copy_valid(x[i], buf)
            nvalid[i] = m
            kk = min(k, m)
            if kk == 0:
                continue
            if m > kk:
                _fr_select(buf, 0, m - 1, m - kk)
            tail = buf[m - kk:m].copy()
            tail.sort()
            for j in range(kk):
                out[i, j] = tail[kk - 1 - j]
    return out, nvalid


# --------------------------------------------------------------------------- wrappers
def _nblocks(g: int) -> int:
    return max(1, min(g, 4 * numba.get_num_threads()))


def _as_groups(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"expected a 1-D or 2-D (groups x obs) array, got {a.ndim}-D")
    return np.ascontiguousarray(a)


def _check_nan_policy(nan_policy: str, nvalid: np.ndarray, nobs: int) -> None:
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    if nan_policy == "raise" and np.any(nvalid < nobs):
        bad = int(np.flatnonzero(nvalid < nobs)[0])
        raise ValueError(
            f"input contains NaN (first in group {bad}); pass nan_policy='omit' to drop "
            "NaNs (e.g. the padding of unequal groups)"
        )


def _check_probs(p, name: str = "p") -> tuple[np.ndarray, bool]:
    q = np.asarray(p, dtype=np.float64)
    scalar = q.ndim == 0
    q = np.atleast_1d(q).ravel()
    if q.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all((q >= 0) & (q <= 1)):
        raise ValueError(f"{name} must lie in [0, 1], got {q}")
    return q, scalar


def quantile_groups(
    x, p, *, method: str = "linear", nan_policy: str = "omit"
) -> tuple[np.ndarray, np.ndarray]:
    """Exact quantiles of many groups at many probabilities.

    Parameters
    ----------
    x : array_like, shape (groups, obs) or (obs,)
        Values, one group per row; NaN is padding (with ``nan_policy="omit"``).
    p : float or array_like
        Probabilities in [0, 1].
    method : {"linear", "lower", "higher", "nearest"}
        numpy's interpolation method of the same name.
    nan_policy : {"omit", "raise"}
        ``"omit"`` drops NaNs per group (as :func:`numpy.nanquantile`); ``"raise"``
        raises ``ValueError`` when any NaN is present.

    Returns
    -------
    q : ndarray, shape (groups, len(p))
        Quantiles; NaN for groups without valid values.
    n : ndarray of int64, shape (groups,)
        Number of valid (non-NaN) values per group.
    """
    if method not in QUANTILE_METHODS:
        raise ValueError(f"method must be one of {tuple(QUANTILE_METHODS)}, got {method!r}")
    if nan_policy not in NAN_POLICIES:
        raise ValueError(f"nan_policy must be one of {NAN_POLICIES}, got {nan_policy!r}")
    a = _as_groups(x)
    q, _ = _check_probs(p)
    out, nvalid = _quantile_groups_kernel(a, q, QUANTILE_METHODS[method], _nblocks(a.shape[0]))
    _check_nan_policy(nan_policy, nvalid, a.shape[1])
    return out, nvalid


def quantile(x, p, *, method: str = "linear", nan_policy: str = "raise"):
    """Exact quantile(s) of a 1-D array by selection; equals :func:`numpy.quantile`.

    Parameters
    ----------
    x : array_like, 1-D
        Values.
    p : float or array_like
        Probabilities in [0, 1].
    method : {"linear", "lower", "higher", "nearest"}
        numpy's method of the same name.
    nan_policy : {"raise", "omit"}
        ``"omit"`` matches :func:`numpy.nanquantile`.

    Returns
    -------
    float or ndarray
        A float for scalar ``p``, else an array of ``len(p)``. Raises ``ValueError`` for
        an empty input (after omitting NaNs).

    Examples
    --------
    >>> quantile([3.0, 1.0, 2.0], 0.5)
    2.0
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"quantile expects a 1-D array, got {a.ndim}-D; use quantile_groups")
    q, scalar = _check_probs(p)
    out, n = quantile_groups(a, q, method=method, nan_policy=nan_policy)
    if n[0] == 0:
        raise ValueError("cannot take a quantile of an empty (or all-NaN) sample")
    return float(out[0, 0]) if scalar else out[0]


def kth_smallest_groups(x, ranks) -> tuple[np.ndarray, np.ndarray]:
    """The ``ranks[i]``-th smallest (1-based) non-NaN value of each row of ``x``.

    Returns ``(values, n_valid)``; a value is NaN where the rank is outside ``1..n``.
    """
    a = _as_groups(x)
    r = np.broadcast_to(np.asarray(ranks, dtype=np.int64), (a.shape[0],)).copy()
    return _kth_groups_kernel(a, r, _nblocks(a.shape[0]))


def topk_groups(x, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest non-NaN values of each group, exact, in descending order.

    Parameters
    ----------
    x : array_like, shape (groups, obs) or (obs,)
        NaN-padded values.
    k : int
        How many to keep (>= 1).

    Returns
    -------
    top : ndarray, shape (groups, k)
        Descending; NaN padded where a group has fewer than ``k`` values. Merging the
        top-k of chunks and taking the top-k again gives the top-k of the union.
    n : ndarray of int64
        Valid values per group.
    """
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    a = _as_groups(x)
    return _topk_groups_kernel(a, k, _nblocks(a.shape[0]))


def topk(x, k: int) -> np.ndarray:
    """The ``k`` largest non-NaN values of a 1-D array, descending (see :func:`topk_groups`)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError("topk expects a 1-D array")
    top, n = topk_groups(a, k)
    return top[0, : min(int(k), int(n[0]))]
