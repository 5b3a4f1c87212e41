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
from tolstat._base import numba_cache as _numba_cache

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

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
    _quantile_positions(m, qs, method, lo_idx, hi_idx, gam)
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


# --------------------------------------------------------------------------- radix select
# Large groups use a most-significant-digit radix selection on the float's ordered-integer
# key (``bits ^ ((bits >> 63) | SIGN)`` orders like the floats, -0.0 just below +0.0, and is
# compared as unsigned; the digits are 12 bits wide). One pass over the row builds the
# histogram of the top digit (NaNs skipped); a second pass gathers only the values of the
# digit buckets that hold a needed order statistic (all ranks of all ``p`` share these two
# passes); each gathered bucket is refined on the next digit the same way (two scratch
# buffers, the child regions nest inside their parent's range) until it is small, where an
# exact Floyd-Rivest selection on the keys finishes. Within a gathered bucket the keys share
# their top bit, so signed comparison of the int64 keys is the unsigned order.
_RADIX_BITS = 12
_RADIX_NB = 1 << _RADIX_BITS
_RADIX_MASK = _RADIX_NB - 1
_SIGN = np.int64(-0x8000000000000000)
_ABS = np.int64(0x7FFFFFFFFFFFFFFF)
_INF_BITS = np.int64(0x7FF0000000000000)
#: groups with at least this many values use the radix path (read at call time)
_RADIX_MIN_N = 1024
#: buckets up to this size are finished by exact selection instead of another digit
_RADIX_SMALL = 512


@njit(cache=True, nogil=True)
def _radix_hist_row(rb, hist):
    """Histogram of the top key digit of the non-NaN values of ``rb`` (float bits); count."""
    for d in range(hist.shape[0]):
        hist[d] = 0
    m = 0
    for i in range(rb.shape[0]):
        b = rb[i]
        if (b & _ABS) > _INF_BITS:
            continue
        k = b ^ ((b >> 63) | _SIGN)
        hist[(k >> 52) & _RADIX_MASK] += 1
        m += 1
    return m


@njit(cache=True, nogil=True)
def _select_keys(a, lo, hi, R, ja, jb, base, res):
    """Exact: ``res[j]`` = the key of local rank ``R[j] - base`` of ``a[lo:hi+1]``."""
    start = lo
    last = -2
    for j in range(ja, jb):
        k = lo + R[j] - base
        if k == last + 1:
            best = k
            for u in range(k + 1, hi + 1):
                if a[u] < a[best]:
                    best = u
            a[k], a[best] = a[best], a[k]
        else:
            _fr_select(a, start, hi, k)
        res[j] = a[k]
        start = k + 1
        last = k


@njit(cache=True, nogil=True)
def _radix_plan(hist, R, nr, pos, stk):
    """Top digit: the buckets holding the ranks ``R[0:nr]``, as tasks on ``stk`` whose
    regions lie back to back from 0; ``pos[d]`` = start of bucket ``d``'s region.
    Returns (number of tasks, total size of the regions)."""
    nt = 0
    j = 0
    cum = 0
    tot = 0
    for d in range(_RADIX_NB):
        c = hist[d]
        if c == 0:
            continue
        if R[j] < cum + c:
            ja = j
            while j < nr and R[j] < cum + c:
                j += 1
            pos[d] = tot
            stk[nt, 0] = 1
            stk[nt, 1] = tot
            stk[nt, 2] = c
            stk[nt, 3] = 52 - _RADIX_BITS
            stk[nt, 4] = ja
            stk[nt, 5] = j
            stk[nt, 6] = cum
            stk[nt, 7] = 0
            stk[nt, 8] = d
            nt += 1
            tot += c
            if j == nr:
                break
        cum += c
    return nt, tot


@njit(cache=True, nogil=True)
def _radix_select(rb, nt, R, res, b1, b2, hist, pos, stk, small):
    """Keys of the order statistics ``R`` (sorted, unique, 0-based) of the non-NaN values
    of ``rb`` (float64 bits) into ``res``, for the ``nt`` top-digit tasks planned by
    :func:`_radix_plan` (``b1`` and ``b2`` hold at least their total size). ``pos`` is
    all -1 on exit."""
    for i in range(rb.shape[0]):
        b = rb[i]
        if (b & _ABS) > _INF_BITS:
            continue
        k = b ^ ((b >> 63) | _SIGN)
        d = (k >> 52) & _RADIX_MASK
        p = pos[d]
        if p >= 0:
            b1[p] = k
            pos[d] = p + 1
    for t in range(nt):
        pos[stk[t, 8]] = -1
    _radix_refine(nt, R, res, b1, b2, hist, pos, stk, small)


@njit(cache=True, nogil=True)
def _radix_refine(nt, R, res, b1, b2, hist, pos, stk, small):
    """Finish the ``nt`` tasks on ``stk`` (regions gathered as keys into ``b1``): refine on
    the next digits, then exact selection; ``res[j]`` = key of rank ``R[j]``."""
    while nt > 0:
        nt -= 1
        src_id = stk[nt, 0]
        lo = stk[nt, 1]
        cnt = stk[nt, 2]
        shift = stk[nt, 3]
        ja = stk[nt, 4]
        jb = stk[nt, 5]
        base = stk[nt, 6]
        stalls = stk[nt, 7]
        src = b1 if src_id == 1 else b2
        dst = b2 if src_id == 1 else b1
        if shift < 0:  # all keys of the region are equal
            for jj in range(ja, jb):
                res[jj] = src[lo]
            continue
        if cnt <= small or stalls >= 2:
            _select_keys(src, lo, lo + cnt - 1, R, ja, jb, base, res)
            continue
        for d in range(_RADIX_NB):
            hist[d] = 0
        for i in range(lo, lo + cnt):
            hist[(src[i] >> shift) & _RADIX_MASK] += 1
        nshift = shift - _RADIX_BITS if shift >= _RADIX_BITS else (0 if shift > 0 else -1)
        first = nt
        ngather = 0
        j = ja
        cum = 0
        for d in range(_RADIX_NB):
            c = hist[d]
            if c == 0:
                continue
            if R[j] - base < cum + c:
                js = j
                while j < jb and R[j] - base < cum + c:
                    j += 1
                if c == cnt:  # the digit does not split the region: next digit in place
                    stk[nt, 0] = src_id
                    stk[nt, 1] = lo
                    stk[nt, 7] = stalls + 1
                    stk[nt, 8] = -1
                else:
                    pos[d] = lo + cum
                    stk[nt, 0] = 3 - src_id
                    stk[nt, 1] = lo + cum
                    stk[nt, 7] = 0
                    stk[nt, 8] = d
                    ngather += 1
                stk[nt, 2] = c
                stk[nt, 3] = nshift
                stk[nt, 4] = js
                stk[nt, 5] = j
                stk[nt, 6] = base + cum
                nt += 1
                if j == jb:
                    break
            cum += c
        if ngather > 0:
            for i in range(lo, lo + cnt):
                k = src[i]
                d = (k >> shift) & _RADIX_MASK
                p = pos[d]
                if p >= 0:
                    dst[p] = k
                    pos[d] = p + 1
            for t in range(first, nt):
                if stk[t, 8] >= 0:
                    pos[stk[t, 8]] = -1


# One pass instead of two for groups like their predecessor: after a group's top-digit
# plan, the buckets holding its needed ranks, widened on each side by neighbouring
# buckets holding at most 2 sqrt(n) of its n values, are marked; the next group's
# histogram pass also gathers the values of the marked buckets. When its exact histogram
# confirms that every needed rank lies in a marked bucket (groups drawn alike: the usual
# case), the radix selection continues on the gathered values, else it re-reads the
# group (the two-pass path). Either way every bucket's region holds all of its values:
# the result is the same exact order statistic.
#: groups with at least this many values gather predicted buckets (read at call time)
_PREDICT_MIN_N = 1 << 14


@njit(cache=True, nogil=True)
def _radix_hist_gather(rb, hist, mark, gbuf):
    """:func:`_radix_hist_row` that also copies the bits of the values whose top digit is
    marked into ``gbuf`` (in row order). Returns (count, gathered); gathered is -1 when
    ``gbuf`` overflowed (then its content is incomplete)."""
    for d in range(hist.shape[0]):
        hist[d] = 0
    m = 0
    g = 0
    cap = gbuf.shape[0]
    for i in range(rb.shape[0]):
        b = rb[i]
        if (b & _ABS) > _INF_BITS:
            continue
        d = ((b ^ ((b >> 63) | _SIGN)) >> 52) & _RADIX_MASK
        hist[d] += 1
        m += 1
        if mark[d]:
            if g < cap:
                gbuf[g] = b
            g += 1
    return m, (g if g <= cap else -1)


@njit(cache=True, nogil=True)
def _mark_from_plan(hist, m, stk, nt, mark, marked):
    """Mark the top digits of the ``nt`` planned tasks and, on each side, the following
    digits while they hold at most ``2 sqrt(m)`` of the ``m`` values (about three standard
    deviations of the difference of a rank's value between two groups drawn alike, in
    values); returns (count, their share)."""
    nm = 0
    tot = 0
    budget = max(64, int(2.0 * math.sqrt(m)))
    for t in range(nt):
        d = stk[t, 8]
        if mark[d] == 0:
            mark[d] = 1
            marked[nm] = d
            nm += 1
            tot += hist[d]
        for step in (-1, 1):
            acc = 0
            dd = d + step
            while 0 <= dd < _RADIX_NB and acc + hist[dd] <= budget:
                acc += hist[dd]
                if mark[dd] == 0:
                    mark[dd] = 1
                    marked[nm] = dd
                    nm += 1
                    tot += hist[dd]
                dd += step
    return nm, tot / m


@njit(cache=True, nogil=True)
def _unique_ranks(m, qs, method, lo_idx, hi_idx, gam, need, R):
    """numpy's positions for ``m`` values and the distinct ranks they need (ascending)."""
    nq = qs.shape[0]
    _quantile_positions(m, qs, method, lo_idx, hi_idx, gam)
    need[:nq] = lo_idx
    need[nq:] = hi_idx
    need.sort()
    nr = 0
    for t in range(2 * nq):
        if nr == 0 or need[t] != R[nr - 1]:
            R[nr] = need[t]
            nr += 1
    return nr


@njit(cache=True, nogil=True)
def _quantile_positions(m, qs, method, lo_idx, hi_idx, gam):
    """numpy's order-statistic positions (0-based) and weights for ``m`` values."""
    for j in range(qs.shape[0]):
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


@njit(cache=True, nogil=True)
def _interp(a, b, t, method):
    if method != 0:
        return a
    d = b - a
    if t >= 0.5:
        return b - d * (1.0 - t)
    return a + d * t


@njit(cache=True, parallel=True)
def _quantile_groups_radix_kernel(x, xb, qs, method, nblocks, radix_min, small, predict_min=-1):
    """As :func:`_quantile_groups_kernel`; rows with at least ``radix_min`` valid values
    use the radix selection (``xb`` is ``x`` viewed as int64). Rows of at least
    ``predict_min`` values (``-1``: none) gather, during the histogram pass, the buckets
    the previous row of the block needed."""
    g = x.shape[0]
    n = x.shape[1]
    nq = qs.shape[0]
    out = np.empty((g, nq), np.float64)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    predict = predict_min >= 0 and n >= predict_min
    for blk in prange(nblocks):
        mark = np.zeros(_RADIX_NB, np.uint8)
        marked = np.empty(_RADIX_NB, np.int64)
        nm = 0
        gbuf = np.empty(min(n, 1 << 16) if predict else 0, np.int64)
        b1 = np.empty(min(n, 1 << 16), np.int64)
        b2 = np.empty(b1.shape[0], np.int64)
        buf = np.empty(min(n, radix_min), np.float64)
        hist = np.empty(_RADIX_NB, np.int64)
        pos = np.full(_RADIX_NB, -1, np.int64)
        stk = np.empty((2 * nq + 2, 9), np.int64)
        lo_idx = np.empty(nq, np.int64)
        hi_idx = np.empty(nq, np.int64)
        gam = np.empty(nq, np.float64)
        need = np.empty(2 * nq, np.int64)
        R = np.empty(2 * nq, np.int64)
        res = np.empty(2 * nq, np.int64)
        vals = res.view(np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            ng = 0
            if nm > 0:
                m, ng = _radix_hist_gather(xb[i], hist, mark, gbuf)
            else:
                m = _radix_hist_row(xb[i], hist)
            nvalid[i] = m
            if m == 0:
                out[i, :] = np.nan
                continue
            if m < radix_min:
                _copy_valid(x[i], buf)
                _quantiles_of_buffer(buf, m, qs, method, out[i])
                continue
            nr = _unique_ranks(m, qs, method, lo_idx, hi_idx, gam, need, R)
            nt, tot = _radix_plan(hist, R, nr, pos, stk)
            if tot > b1.shape[0]:  # scratch grows to the largest gathered set
                b1 = np.empty(tot, np.int64)
                b2 = np.empty(tot, np.int64)
            have = nm > 0 and ng >= 0
            for t in range(nt):
                have = have and mark[stk[t, 8]] == 1
            for t in range(nm):
                mark[marked[t]] = 0
            nm = 0
            if predict:  # the next group gathers what this one needed (and its neighbours)
                nm, share = _mark_from_plan(hist, m, stk, nt, mark, marked)
                want = int(1.5 * share * n) + 4096
                if want > n // 2:  # most of the group: the two passes are as good
                    for t in range(nm):
                        mark[marked[t]] = 0
                    nm = 0
                elif want > gbuf.shape[0]:
                    gbuf2 = np.empty(want, np.int64)
                    if ng > 0 and have:
                        gbuf2[:ng] = gbuf[:ng]
                    gbuf = gbuf2
            # every needed bucket was gathered whole: select from the gathered values
            _radix_select(gbuf[:ng] if have else xb[i], nt, R, res, b1, b2, hist, pos, stk, small)
            for t in range(nr):
                k = res[t]
                res[t] = k ^ _SIGN if k < 0 else ~k
            for j in range(nq):
                ia = np.searchsorted(R[:nr], lo_idx[j])
                ib = np.searchsorted(R[:nr], hi_idx[j])
                out[i, j] = _interp(vals[ia], vals[ib], gam[j], method)
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
    code = QUANTILE_METHODS[method]
    if a.shape[1] >= _RADIX_MIN_N:
        out, nvalid = _quantile_groups_radix_kernel(
            a, a.view(np.int64), q, code, _nblocks(a.shape[0]), _RADIX_MIN_N, _RADIX_SMALL,
            _PREDICT_MIN_N)
    else:
        out, nvalid = _quantile_groups_kernel(a, q, code, _nblocks(a.shape[0]))
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
