"""Extreme-value tails: peaks over threshold (GPD) and block maxima (GEV), numba kernels.

Parameterisation (as scipy, with ``xi = c`` for genpareto and ``xi = -c`` for genextreme):

* GPD for exceedances ``y = x - u > 0``: ``F(y) = 1 - (1 + xi*y/sigma)**(-1/xi)``
  (``1 - exp(-y/sigma)`` at ``xi = 0``); bounded above by ``-sigma/xi`` when ``xi < 0``.
* GEV for block maxima: ``F(x) = exp(-(1 + xi*(x - mu)/sigma)**(-1/xi))``.

Estimators
----------
* :func:`gpd_fit_mle` — maximum likelihood through the profile likelihood in
  ``theta = xi/sigma`` (Grimshaw 1993): ``xi(theta) = mean(log1p(theta*y))``, one-dimensional
  safeguarded Newton (analytic first and second derivatives, step halving until the
  likelihood increases) started from the better of the method-of-moments estimate and
  (for up to 2000 exceedances) the Zhang–Stephens estimate. The likelihood is unbounded
  for ``xi < -1``; the estimate is restricted to ``xi >= -1`` (at ``xi = -1`` the fit is the
  uniform tail ``sigma = max(y)``).
* :func:`gpd_fit_zhang_stephens` — Zhang & Stephens (2009) empirical-Bayes estimator,
  closed form, no optimiser (``m = 20 + sqrt(n)`` grid points, O(m n)).
* :func:`gpd_fit_pwm` — Hosking & Wallis (1987) probability-weighted moments.
* :func:`gev_fit_mle` — GEV maximum likelihood by Nelder–Mead on (mu, log sigma, xi)
  with restarts, started from Hosking's L-moment estimate.

Threshold choice (:func:`pot_fit`, documented rule)
---------------------------------------------------
The tail is the ``k = max(min_exceedances, ceil(tail_fraction * n))`` largest values
(defaults 10 % and 30); the threshold ``u`` is the largest value below them, i.e. the
(n-k)-th smallest, and the exceedances are the values strictly above ``u`` (with ties at
``u`` the tail may hold fewer than ``k``). The exceedance rate is ``zeta_u = #{x > u}/n``.
``n`` must be at least ``min_exceedances + 1``.

Degenerate tails: with fewer than two distinct exceedance values (all-equal data, a lattice
with one value above ``u``, or no exceedance at all) the tail is returned as the bounded
uniform tail ``xi = -1, sigma = max(y)`` (``sigma = 0`` when nothing exceeds ``u``), so the
return level never exceeds the sample maximum and all-equal data give that value — never a
crash or NaN.

Return level for an exceedance probability ``q`` (per observation):
``u + sigma/xi*((zeta_u/q)**xi - 1)`` (``u + sigma*log(zeta_u/q)`` at ``xi = 0``; computed
with ``expm1`` so ``xi -> 0`` is continuous), never above the endpoint ``u - sigma/xi``
for ``xi < 0``. When ``q >= zeta_u`` the level lies inside the data and the empirical
``1 - q`` quantile ('higher') is returned instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
from numba import njit, prange

from tolstat._base.validate import unit_interval as _unit
from tolstat.models.estimators import quantiles as _q
from tolstat.models.estimators.quantiles import (
    _ABS,
    _INF_BITS,
    _RADIX_MASK,
    _RADIX_NB,
    _SIGN,
    _copy_valid,
    _fr_select,
    _radix_hist_row,
    _radix_plan,
    _radix_refine,
    _radix_select,
)
from tolstat._base import numba_cache as _numba_cache

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

__all__ = [
    "GPDFit",
    "gpd_loglik",
    "gpd_fit_mle",
    "gpd_fit_zhang_stephens",
    "gpd_fit_pwm",
    "gpd_return_level",
    "pot_fit",
    "pot_fit_groups",
    "gev_loglik",
    "gev_fit_mle",
    "gev_fit_groups",
    "gev_return_level",
    "POT_FIELDS",
    "GEV_FIELDS",
]

#: columns of :func:`pot_fit_groups` output
POT_FIELDS = ("u", "sigma", "xi", "zeta", "n_exceed", "loglik", "endpoint", "return_level")
#: columns of :func:`gev_fit_groups` output
GEV_FIELDS = ("mu", "sigma", "xi", "loglik", "endpoint", "return_level")

_XI_ZERO = 1e-12
#: rows at least this long use the radix-selection POT kernel (no copy of the row)
_POT_RADIX_MIN_N = 1 << 16


# --------------------------------------------------------------------------- GPD core
@njit(cache=True, nogil=True)
def _gpd_ll(y, k, sigma, xi):
    """GPD log-likelihood of ``y[:k]`` (-inf outside the support)."""
    if sigma <= 0.0:
        return -np.inf
    s = 0.0
    if xi == -1.0:  # uniform on [0, sigma]: density 1/sigma up to and including the endpoint
        for i in range(k):
            if y[i] > sigma:
                return -np.inf
        return -k * math.log(sigma)
    if abs(xi) < _XI_ZERO:
        for i in range(k):
            s += y[i]
        return -k * math.log(sigma) - s / sigma
    r = xi / sigma
    for i in range(k):
        t = r * y[i]
        if t <= -1.0:
            return -np.inf
        s += math.log1p(t)
    return -k * math.log(sigma) - (1.0 / xi + 1.0) * s


@njit(cache=True, nogil=True)
def _profile(y, k, theta):
    """Profile log-likelihood l(theta)/k and its first two derivatives; also xi(theta)."""
    a = 0.0
    b = 0.0
    c = 0.0
    for i in range(k):
        yi = y[i]
        w = 1.0 + theta * yi
        if w <= 0.0:
            return -np.inf, 0.0, 0.0, np.nan
        a += math.log1p(theta * yi)
        q = yi / w
        b += q
        c += q * q
    a /= k
    b /= k
    c /= k
    if a == 0.0 or theta == 0.0:
        return -np.inf, 0.0, 0.0, a
    ratio = a / theta
    if ratio <= 0.0:
        return -np.inf, 0.0, 0.0, a
    f = -math.log(ratio) - 1.0 - a
    g = -b / a + 1.0 / theta - b
    h = c / a + (b * b) / (a * a) - 1.0 / (theta * theta) + c
    return f, g, h, a


@njit(cache=True, nogil=True)
def _nudge(theta, ymax):
    eps = 1e-7 / ymax
    if abs(theta) < eps:
        return eps if theta >= 0 else -eps
    return theta


@njit(cache=True, nogil=True)
def _newton_profile(y, k, ymax, theta0):
    """Maximise the profile likelihood from theta0; returns (theta, f, xi, ok)."""
    lo = -1.0 / ymax
    theta = _nudge(max(theta0, lo + 1e-3 * (0.0 - lo)), ymax)
    f, g, h, a = _profile(y, k, theta)
    if not np.isfinite(f):
        theta = _nudge(0.0, ymax)
        f, g, h, a = _profile(y, k, theta)
    for it in range(100):
        if h < 0.0:
            step = -g / h
        else:
            step = (abs(theta) + 1.0 / ymax) * (1.0 if g > 0 else -1.0)
        cand = theta + step
        if cand <= lo:
            cand = 0.5 * (theta + lo)
        improved = False
        for ls in range(60):
            cand = _nudge(cand, ymax)
            fc, gc, hc, ac = _profile(y, k, cand)
            if np.isfinite(fc) and fc >= f - 1e-15 * abs(f):
                improved = True
                break
            cand = 0.5 * (theta + cand)
        if not improved:
            break
        dtheta = abs(cand - theta)
        theta, f, g, h, a = cand, fc, gc, hc, ac
        if a < -1.0:
            return theta, f, a, False  # walking into the unbounded xi < -1 region
        if dtheta <= 1e-12 * (abs(theta) + 1.0 / ymax):
            break
        # Newton decrement: the predicted further gain of l/k is negligible
        if h < 0.0 and g * g / (-h) < 1e-15 * (1.0 + abs(f)):
            break
    return theta, f, a, True


@njit(cache=True, nogil=True)
def _zs_theta(y, k, ymax, yq):
    """Zhang–Stephens posterior mean of theta (our theta = -b of the paper)."""
    m = 20 + int(math.sqrt(k))
    bs = np.empty(m)
    ll = np.empty(m)
    for j in range(m):
        b = 1.0 / ymax + (1.0 - math.sqrt(m / (j + 0.5))) / (3.0 * yq)
        bs[j] = b
        s = 0.0
        for i in range(k):
            s += math.log1p(-b * y[i])
        kk = -s / k  # ZS's k = -xi
        if kk == 0.0 or b == 0.0:
            ll[j] = -np.inf
        else:
            ll[j] = k * (math.log(b / kk) + kk - 1.0)
    wsum = 0.0
    bpost = 0.0
    lmax = ll.max()
    for j in range(m):
        w = math.exp(ll[j] - lmax) if np.isfinite(ll[j]) else 0.0
        wsum += w
        bpost += w * bs[j]
    return -bpost / wsum


@njit(cache=True, nogil=True)
def _gpd_mle_core(y, k, use_zs):
    """MLE of (sigma, xi) for exceedances ``y[:k]`` (y > 0). Returns sigma, xi, loglik."""
    ymax = 0.0
    s1 = 0.0
    s2 = 0.0
    distinct = False
    for i in range(k):
        v = y[i]
        if v > ymax:
            ymax = v
        s1 += v
        if v != y[0]:
            distinct = True
    if k == 0 or ymax <= 0.0:
        return 0.0, -1.0, 0.0
    if not distinct or k < 2:
        return ymax, -1.0, _gpd_ll(y, k, ymax, -1.0)
    mean = s1 / k
    for i in range(k):
        d = y[i] - mean
        s2 += d * d
    var = s2 / (k - 1)
    # method-of-moments start
    r2 = mean * mean / var
    xi0 = 0.5 * (1.0 - r2)
    sig0 = 0.5 * mean * (r2 + 1.0)
    theta0 = xi0 / sig0
    best_t, best_f, best_a, ok = _newton_profile(y, k, ymax, theta0)
    if use_zs or not ok:
        # Zhang-Stephens start needs the first quartile of y: select on a copy
        tmp = y[:k].copy()
        iq = max(0, min(k - 1, int(k / 4.0 + 0.5) - 1))
        yq = _fr_select(tmp, 0, k - 1, iq)
        if yq <= 0.0:
            yq = mean
        t2, f2, a2, ok2 = _newton_profile(y, k, ymax, _zs_theta(y, k, ymax, yq))
        if ok2 and (not ok or f2 > best_f):
            best_t, best_f, best_a, ok = t2, f2, a2, ok2
    # uniform tail (xi = -1, sigma = ymax) is the boundary of the admissible region
    ll_unif = -k * math.log(ymax)
    if ok and best_a >= -1.0:
        sigma = best_a / best_t
        xi = best_a
        # the profile log-likelihood at theta is the log-likelihood at (a/theta, a): k * f
        ll = k * best_f
        # the exponential limit (theta -> 0) is the other special point
        ll_exp = -k * math.log(mean) - k
        if ll_exp > ll:
            sigma, xi, ll = mean, 0.0, ll_exp
        if ll >= ll_unif:
            return sigma, xi, ll
    ll_exp = -k * math.log(mean) - k
    if ll_exp > ll_unif:
        return mean, 0.0, ll_exp
    return ymax, -1.0, ll_unif


@njit(cache=True, nogil=True)
def _return_level(u, sigma, xi, zeta, q):
    if sigma <= 0.0:
        return u
    lr = math.log(zeta / q)
    if abs(xi) < _XI_ZERO:
        return u + sigma * lr
    rl = u + sigma * math.expm1(xi * lr) / xi
    if xi < 0.0:
        ep = u - sigma / xi
        if rl > ep:
            rl = ep
    return rl


@njit(cache=True, nogil=True)
def _pack_pot(out, u, sigma, xi, zeta, ne, ll, q):
    """Fill a POT result row; True when the return level came from the tail model.

    Layout: u, sigma, xi, zeta, n_exceed, loglik, upper endpoint, return level (the last
    left to the caller when ``q >= zeta``: the level is then inside the data).
    """
    out[0] = u
    out[1] = sigma
    out[2] = xi
    out[3] = zeta
    out[4] = ne
    out[5] = ll
    out[6] = u - sigma / xi if xi < 0.0 else np.inf
    if ne == 0:
        out[6] = u
    if q < zeta:
        out[7] = _return_level(u, sigma, xi, zeta, q)
        return True
    return False


@njit(cache=True, nogil=True)
def _pot_core(buf, m, tail_fraction, min_exc, q, use_zs, out):
    """POT fit of ``buf[:m]`` (mutated) into ``out`` (POT_FIELDS order)."""
    for j in range(out.shape[0]):
        out[j] = np.nan
    if m < min_exc + 1:
        return
    k = max(min_exc, int(math.ceil(tail_fraction * m)))
    if k > m - 1:
        k = m - 1
    u = _fr_select(buf, 0, m - 1, m - k - 1)
    # exceedances: the values strictly above u are all in buf[m-k-1+1:]
    ne = 0
    for i in range(m - k, m):
        if buf[i] > u:
            buf[m - k + ne] = buf[i] - u
            ne += 1
    y = buf[m - k:m - k + ne]
    sigma, xi, ll = _gpd_mle_core(y, ne, use_zs)
    zeta = ne / m
    if not _pack_pot(out, u, sigma, xi, zeta, ne, ll, q):
        # inside the data: empirical (1 - q)-quantile, numpy 'higher'
        idx = int(math.ceil((m - 1) * (1.0 - q)))
        if idx >= m - k:
            # the tail was overwritten by exceedances: restore value = u + y
            pos = idx - (m - k)
            # tail values above u are sorted? no: take the order statistic of y
            tmp = y.copy()
            # number of tail slots equal to u (ties) come first in order
            nties = k - ne
            if pos < nties:
                out[7] = u
            else:
                out[7] = u + _fr_select(tmp, 0, ne - 1, pos - nties)
        else:
            out[7] = _fr_select(buf, 0, m - k - 1, idx)


@njit(cache=True, parallel=True)
def _pot_groups_kernel(x, tail_fraction, min_exc, q, use_zs, nblocks):
    g = x.shape[0]
    out = np.empty((g, 8), np.float64)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        buf = np.empty(x.shape[1], np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            m = _copy_valid(x[i], buf)
            nvalid[i] = m
            _pot_core(buf, m, tail_fraction, min_exc, q, use_zs, out[i])
    return out, nvalid


@njit(cache=True, nogil=True)
def _key_value(k):
    """float64 value of an ordered key (inverse of the radix key map)."""
    b = k ^ _SIGN if k < 0 else ~k
    return np.array([b], np.int64).view(np.float64)[0]


@njit(cache=True, parallel=True)
def _pot_groups_radix_kernel(x, xb, tail_fraction, min_exc, q, use_zs, nblocks, small):
    """As :func:`_pot_groups_kernel` for long rows, without copying the row: the threshold
    ``u`` (the (m-k-1)-th smallest) is found by radix selection (quantile module), and the
    same gather pass collects the values of the digit buckets above u's bucket (all of
    them exceed u) plus u's bucket, which is filtered once u is known. Same u, n_exceed
    and zeta as the copying kernel; the exceedances are summed in another order."""
    g = x.shape[0]
    out = np.empty((g, 8), np.float64)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        hist = np.empty(_RADIX_NB, np.int64)
        pos = np.full(_RADIX_NB, -1, np.int64)
        stk = np.empty((4, 9), np.int64)
        R = np.empty(1, np.int64)
        res = np.empty(1, np.int64)
        b1 = np.empty(1, np.int64)
        b2 = np.empty(1, np.int64)
        yc = np.empty(1, np.float64)
        ybuf = np.empty(1, np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            rb = xb[i]
            row = x[i]
            o = out[i]
            for j in range(8):
                o[j] = np.nan
            m = _radix_hist_row(rb, hist)
            nvalid[i] = m
            if m < min_exc + 1:
                continue
            k = max(min_exc, int(math.ceil(tail_fraction * m)))
            if k > m - 1:
                k = m - 1
            R[0] = m - k - 1
            nt, tot = _radix_plan(hist, R, 1, pos, stk)
            du = stk[0, 8]
            pos[du] = -1
            if tot > b1.shape[0]:
                b1 = np.empty(tot, np.int64)
                b2 = np.empty(tot, np.int64)
                yc = np.empty(tot, np.float64)
            if k > ybuf.shape[0]:
                ybuf = np.empty(k, np.float64)
            nh = 0
            c = 0
            for t in range(rb.shape[0]):
                b = rb[t]
                if (b & _ABS) > _INF_BITS:
                    continue
                key = b ^ ((b >> 63) | _SIGN)
                d = (key >> 52) & _RADIX_MASK
                if d > du:
                    ybuf[nh] = row[t]
                    nh += 1
                elif d == du:
                    b1[c] = key
                    yc[c] = row[t]
                    c += 1
            _radix_refine(nt, R, res, b1, b2, hist, pos, stk, small)
            u = _key_value(res[0])
            for t in range(c):
                if yc[t] > u:
                    ybuf[nh] = yc[t]
                    nh += 1
            for t in range(nh):
                ybuf[t] = ybuf[t] - u
            ne = nh
            y = ybuf[:ne]
            sigma, xi, ll = _gpd_mle_core(y, ne, use_zs)
            zeta = ne / m
            if not _pack_pot(o, u, sigma, xi, zeta, ne, ll, q):
                # inside the data: empirical (1 - q)-quantile, numpy 'higher'
                _radix_hist_row(rb, hist)
                R[0] = int(math.ceil((m - 1) * (1.0 - q)))
                nt, tot = _radix_plan(hist, R, 1, pos, stk)
                if tot > b1.shape[0]:
                    b1 = np.empty(tot, np.int64)
                    b2 = np.empty(tot, np.int64)
                    yc = np.empty(tot, np.float64)
                _radix_select(rb, nt, R, res, b1, b2, hist, pos, stk, small)
                o[7] = _key_value(res[0])
    return out, nvalid


#: values of the strided sample that predicts a long row's tail threshold (:func:`pot_one_read`)
_POT_SAMPLE = 1 << 14
#: the predicted lower end of the gathered tail: the sample quantile at
#: ``1 - tail_fraction - max(_POT_MARGIN, 6 sd)`` (sd of a sample proportion)
_POT_MARGIN = 0.02


@njit(cache=True, parallel=True)
def _pot_gather_kernel(x, lo_p, sample_n, cap, nblocks):
    """One read of each long row: counts and the values at or above a predicted threshold.

    Per row: a strided sample of about ``sample_n`` values predicts ``lo`` (its quantile at
    ``lo_p``); the one read of the row then counts the valid (non-NaN) values, the negative
    and the infinite ones, takes the maximum and gathers every valid value ``>= lo``, in
    row order, into ``buf[i, :cap]`` (one more column, overwritten, serves the store of a
    rejected value). ``ngath[i]`` is the number gathered, -1 when more than ``cap`` were
    (the caller then reads the row again). Only the counts are needed for the result's
    exactness: the gathered values are the ``ngath`` largest of the row.
    """
    g = x.shape[0]
    n = x.shape[1]
    nvalid = np.zeros(g, np.int64)
    nneg = np.zeros(g, np.int64)
    ninf = np.zeros(g, np.int64)
    mx = np.zeros(g, np.float64)
    ngath = np.zeros(g, np.int64)
    buf = np.empty((g, cap + 1), np.float64)
    step = max(1, n // sample_n)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        samp = np.empty((n + step - 1) // step, np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            row = x[i]
            ns = 0
            for t in range(0, n, step):
                v = row[t]
                if v == v:
                    samp[ns] = v
                    ns += 1
            lo = -np.inf
            if ns >= 2 and lo_p > 0.0:
                lo = _fr_select(samp, 0, ns - 1, int(lo_p * (ns - 1)))
            b = buf[i]
            m = 0
            neg = 0
            inf = 0
            big = 0.0
            c = 0
            over = False
            for t in range(n):  # without branches: counts by comparison, the gather by a store that a
                v = row[t]      # rejected value leaves to be overwritten (b has a spare slot)
                m += v == v
                neg += v < 0.0
                big = v if v > big else big
                inf += abs(v) == np.inf
                take = v >= lo
                b[c] = v
                room = c < cap
                c += take & room
                over |= take & (not room)
            nvalid[i] = m
            nneg[i] = neg
            ninf[i] = inf
            mx[i] = big
            ngath[i] = -1 if over else c
    return nvalid, nneg, ninf, mx, buf, ngath


@njit(cache=True, parallel=True)
def _pot_gathered_kernel(buf, ngath, nvalid, tail_fraction, min_exc, q, use_zs, nblocks):
    """The POT fit of each row from its gathered largest values (:func:`_pot_gather_kernel`).

    Same threshold ``u`` (the (m-k-1)-th smallest of the m valid values), exceedances
    (the values above ``u``, in row order), ``zeta`` and fallback quantile as
    :func:`_pot_groups_radix_kernel`. ``status[i] = 1`` where the gathered values do not
    hold them (fewer than ``k + 1``, or a fallback rank below them): the caller fits that
    row by the two-read kernel.
    """
    g = buf.shape[0]
    cap = buf.shape[1]
    out = np.full((g, 8), np.nan)
    status = np.zeros(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        tmp = np.empty(cap, np.float64)
        ybuf = np.empty(cap, np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            m = nvalid[i]
            c = ngath[i]
            if m < min_exc + 1:
                continue
            k = max(min_exc, int(math.ceil(tail_fraction * m)))
            if k > m - 1:
                k = m - 1
            if c < k + 1:
                status[i] = 1
                continue
            b = buf[i]
            for t in range(c):
                tmp[t] = b[t]
            u = _fr_select(tmp, 0, c - 1, c - k - 1)
            ne = 0
            for t in range(c):
                if b[t] > u:
                    ybuf[ne] = b[t] - u
                    ne += 1
            sigma, xi, ll = _gpd_mle_core(ybuf, ne, use_zs)
            o = out[i]
            if not _pack_pot(o, u, sigma, xi, ne / m, ne, ll, q):
                # inside the data: empirical (1 - q)-quantile, numpy 'higher'
                j = int(math.ceil((m - 1) * (1.0 - q))) - (m - c)
                if j < 0:
                    status[i] = 1
                    continue
                for t in range(c):
                    tmp[t] = b[t]
                o[7] = _fr_select(tmp, 0, c - 1, j)
    return out, status


def pot_one_read(a: np.ndarray, tail_fraction: float) -> tuple[np.ndarray, ...]:
    """Counts and gathered tails of the rows of ``a`` (groups, obs) in one read (:func:`_pot_gather_kernel`).

    Returns ``(nvalid, nneg, ninf, max, gathered, ngath)``; pass them to
    :func:`pot_fit_gathered` once the counts are validated.
    """
    n = a.shape[1]
    ns = max(2, min(n, _POT_SAMPLE))
    margin = max(_POT_MARGIN, 6.0 * math.sqrt(tail_fraction * (1.0 - tail_fraction) / ns))
    lo_p = 1.0 - tail_fraction - margin
    cap = n if lo_p <= 0.0 else min(n, int(math.ceil((1.0 - lo_p + margin) * n)) + 1024)
    return _pot_gather_kernel(a, lo_p, _POT_SAMPLE, cap, _nblocks(a.shape[0]))


def pot_fit_gathered(a: np.ndarray, gathered: tuple[np.ndarray, ...], q: float, tail_fraction: float,
                     min_exc: int, use_zs: int) -> np.ndarray:
    """POT fits (groups, 8) of the rows of ``a`` from :func:`pot_one_read`'s result.

    Rows whose gathered values do not hold the tail, or whose largest value needs the
    rescaling of :func:`_pot_groups_rescaled`, are fitted by it (a second read of those rows).
    Equal to :func:`_pot_groups_rescaled` in ``u``, ``zeta``, ``n_exceed`` and the fallback
    quantile; the MLE sums the same exceedances in row order.
    """
    nvalid, _, _, mx, buf, ngath = gathered
    out, status = _pot_gathered_kernel(buf, ngath, nvalid, float(tail_fraction), int(min_exc), float(q),
                                       bool(use_zs), _nblocks(a.shape[0]))
    expo = np.frexp(mx)[1].astype(np.int64)
    far = (mx > 0) & ((expo > _POT_RESCALE_EXP) | (expo < -_POT_RESCALE_EXP))
    redo = np.flatnonzero((status != 0) | far)
    if redo.size:
        out[redo] = _pot_groups_rescaled(np.ascontiguousarray(a[redo]), q, tail_fraction, min_exc, use_zs)[0]
    return out


# --------------------------------------------------------------------------- GEV core
@njit(cache=True, nogil=True)
def _gev_nll(x, n, mu, lsig, xi):
    sig = math.exp(lsig)
    s = 0.0
    if abs(xi) < _XI_ZERO:
        for i in range(n):
            z = (x[i] - mu) / sig
            s += z + math.exp(-z)
    else:
        for i in range(n):
            t = 1.0 + xi * (x[i] - mu) / sig
            if t <= 0.0:
                return np.inf
            lt = math.log(t)
            s += (1.0 + 1.0 / xi) * lt + math.exp(-lt / xi)
    return n * lsig + s


@njit(cache=True, nogil=True)
def _nelder_mead(x, n, p0, step, maxfev, ftol):
    d = 3
    simp = np.empty((d + 1, d))
    fv = np.empty(d + 1)
    for i in range(d + 1):
        for j in range(d):
            simp[i, j] = p0[j]
        if i > 0:
            simp[i, i - 1] += step[i - 1]
        fv[i] = _gev_nll(x, n, simp[i, 0], simp[i, 1], simp[i, 2])
    nfev = d + 1
    cen = np.empty(d)
    xr = np.empty(d)
    xe = np.empty(d)
    while nfev < maxfev:
        order = np.argsort(fv)
        simp = simp[order].copy()
        fv = fv[order].copy()
        if abs(fv[d] - fv[0]) <= ftol * (1.0 + abs(fv[0])):
            sz = 0.0
            for i in range(1, d + 1):
                for j in range(d):
                    sz = max(sz, abs(simp[i, j] - simp[0, j]))
            if sz < 1e-10 * (1.0 + abs(simp[0, 0])):
                break
            if abs(fv[d] - fv[0]) == 0.0 and sz < 1e-7:
                break
        for j in range(d):
            cen[j] = 0.0
            for i in range(d):
                cen[j] += simp[i, j] / d
        for j in range(d):
            xr[j] = cen[j] + (cen[j] - simp[d, j])
        fr = _gev_nll(x, n, xr[0], xr[1], xr[2])
        nfev += 1
        if fr < fv[0]:
            for j in range(d):
                xe[j] = cen[j] + 2.0 * (cen[j] - simp[d, j])
            fe = _gev_nll(x, n, xe[0], xe[1], xe[2])
            nfev += 1
            if fe < fr:
                simp[d] = xe
                fv[d] = fe
            else:
                simp[d] = xr
                fv[d] = fr
        elif fr < fv[d - 1]:
            simp[d] = xr
            fv[d] = fr
        else:
            if fr < fv[d]:
                for j in range(d):
                    xe[j] = cen[j] + 0.5 * (xr[j] - cen[j])
            else:
                for j in range(d):
                    xe[j] = cen[j] + 0.5 * (simp[d, j] - cen[j])
            fc = _gev_nll(x, n, xe[0], xe[1], xe[2])
            nfev += 1
            if fc < min(fr, fv[d]):
                simp[d] = xe
                fv[d] = fc
            else:
                for i in range(1, d + 1):
                    for j in range(d):
                        simp[i, j] = simp[0, j] + 0.5 * (simp[i, j] - simp[0, j])
                    fv[i] = _gev_nll(x, n, simp[i, 0], simp[i, 1], simp[i, 2])
                    nfev += 1
    best = np.argmin(fv)
    return simp[best].copy(), fv[best]


@njit(cache=True, nogil=True)
def _gev_lmom_start(buf, n):
    """Hosking's L-moment GEV estimate (sorts ``buf[:n]`` in place)."""
    xs = buf[:n]
    xs.sort()
    b0 = 0.0
    b1 = 0.0
    b2 = 0.0
    for i in range(n):
        v = xs[i]
        b0 += v
        b1 += v * i / (n - 1)
        if n > 2:
            b2 += v * i * (i - 1) / ((n - 1) * (n - 2))
    b0 /= n
    b1 /= n
    b2 /= n
    l1 = b0
    l2 = 2 * b1 - b0
    l3 = 6 * b2 - 6 * b1 + b0
    p = np.empty(3)
    if l2 <= 0:
        p[0] = l1
        p[1] = 0.0
        p[2] = 0.0
        return p
    t3 = l3 / l2
    c = 2.0 / (3.0 + t3) - math.log(2.0) / math.log(3.0)
    kk = 7.8590 * c + 2.9554 * c * c
    if abs(kk) < 1e-6:
        sig = l2 / math.log(2.0)
        mu = l1 - 0.5772156649015329 * sig
    else:
        g = math.gamma(1.0 + kk)
        sig = l2 * kk / ((1.0 - 2.0 ** (-kk)) * g)
        mu = l1 - sig * (1.0 - g) / kk
    p[0] = mu
    p[1] = math.log(sig)
    p[2] = -kk
    return p


@njit(cache=True, nogil=True)
def _gev_core(buf, m, q, out):
    """GEV MLE of ``buf[:m]`` into ``out`` (GEV_FIELDS)."""
    for j in range(out.shape[0]):
        out[j] = np.nan
    if m < 3:
        return
    p0 = _gev_lmom_start(buf, m)
    x = buf[:m]
    if x[m - 1] == x[0]:
        # all equal: a point mass (degenerate); return it, never NaN
        out[0] = x[0]
        out[1] = 0.0
        out[2] = -1.0
        out[3] = 0.0
        out[4] = x[0]
        out[5] = x[0]
        return
    if not np.isfinite(_gev_nll(x, m, p0[0], p0[1], p0[2])):
        # Gumbel moment start is always admissible
        mean = 0.0
        for i in range(m):
            mean += x[i]
        mean /= m
        var = 0.0
        for i in range(m):
            var += (x[i] - mean) ** 2
        var /= m - 1
        sig = math.sqrt(6.0 * var) / math.pi
        p0[0] = mean - 0.5772156649015329 * sig
        p0[1] = math.log(sig)
        p0[2] = 0.0
    step = np.empty(3)
    best = p0
    fbest = _gev_nll(x, m, p0[0], p0[1], p0[2])
    scale = math.exp(p0[1])
    for rnd in range(6):
        step[0] = 0.2 * scale / (1 + 4 * rnd)
        step[1] = 0.2 / (1 + 4 * rnd)
        step[2] = 0.1 / (1 + 4 * rnd)
        pb, fb = _nelder_mead(x, m, best, step, 3000, 1e-13)
        improvement = fbest - fb
        if fb < fbest:
            best = pb
            fbest = fb
        if rnd >= 1 and improvement < 1e-10:
            break
    mu = best[0]
    sig = math.exp(best[1])
    xi = best[2]
    out[0] = mu
    out[1] = sig
    out[2] = xi
    out[3] = -fbest
    out[4] = mu - sig / xi if xi < 0 else np.inf
    out[5] = _gev_rl(mu, sig, xi, q)


@njit(cache=True, nogil=True)
def _gev_rl(mu, sig, xi, q):
    y = -math.log1p(-q)  # -log(1 - q)
    ly = math.log(y)
    if abs(xi) < _XI_ZERO:
        return mu - sig * ly
    return mu + sig * math.expm1(-xi * ly) / xi


@njit(cache=True, parallel=True)
def _gev_groups_kernel(x, q, nblocks):
    g = x.shape[0]
    out = np.empty((g, 6), np.float64)
    nvalid = np.empty(g, np.int64)
    per = (g + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        buf = np.empty(x.shape[1], np.float64)
        for i in range(blk * per, min(g, (blk + 1) * per)):
            m = _copy_valid(x[i], buf)
            nvalid[i] = m
            _gev_core(buf, m, q, out[i])
    return out, nvalid


# --------------------------------------------------------------------------- wrappers
@dataclass(frozen=True)
class GPDFit:
    """A GPD fit of exceedances: ``sigma`` (scale), ``xi`` (shape), ``loglik``, ``method``."""

    sigma: float
    xi: float
    loglik: float
    method: str
    n: int


def _exceedances(y) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(y, dtype=np.float64).ravel())
    if a.size == 0:
        raise ValueError("no exceedances to fit")
    lo, hi = a.min(), a.max()  # two reductions without temporaries; NaN propagates into both
    if lo >= 0 and hi < np.inf:
        return a
    if np.isnan(a).any():
        raise ValueError("exceedances contain NaN")
    if not np.all(np.isfinite(a)):
        raise ValueError("exceedances contain inf; a GPD cannot be fitted to infinite errors")
    raise ValueError("exceedances must be >= 0 (values above the threshold minus it)")


def gpd_loglik(y, sigma: float, xi: float) -> float:
    """GPD log-likelihood of exceedances ``y`` (equals ``genpareto.logpdf(y, xi, 0, sigma).sum()``)."""
    a = _exceedances(y)
    return float(_gpd_ll(a, a.size, float(sigma), float(xi)))


def gpd_fit_mle(y, *, zs_start: bool | None = None) -> GPDFit:
    """Maximum-likelihood GPD fit (location 0) of exceedances ``y``.

    Parameters
    ----------
    y : array_like
        Exceedances over the threshold (>= 0, finite).
    zs_start : bool, optional
        Also start Newton from the Zhang–Stephens estimate (default: when ``len(y) <= 2000``).

    Returns
    -------
    GPDFit
        ``xi >= -1`` always (see module notes); all-equal data give ``xi = -1,
        sigma = max(y)``.

    Examples
    --------
    >>> import numpy as np
    >>> y = np.random.default_rng(0).exponential(2.0, 5000)
    >>> fit = gpd_fit_mle(y)
    >>> round(fit.sigma, 1), abs(fit.xi) < 0.05
    (2.0, True)
    """
    a = _exceedances(y)
    use_zs = a.size <= 2000 if zs_start is None else bool(zs_start)
    s, xi, ll = _gpd_mle_core(a, a.size, use_zs)
    return GPDFit(float(s), float(xi), float(ll), "mle", int(a.size))


def gpd_fit_zhang_stephens(y) -> GPDFit:
    """Zhang & Stephens (2009) empirical-Bayes GPD estimate (no optimiser).

    References
    ----------
    Zhang, J. and Stephens, M. A. (2009). A new and efficient estimation method for the
    generalized Pareto distribution. Technometrics 51(3), 316-325.
    """
    a = _exceedances(y)
    n = a.size
    if n < 2 or np.all(a == a[0]):
        s, xi, ll = _gpd_mle_core(a, n, False)
        return GPDFit(float(s), float(xi), float(ll), "zhang_stephens", n)
    ymax = float(a.max())
    yq = float(np.partition(a, max(0, int(n / 4 + 0.5) - 1))[max(0, int(n / 4 + 0.5) - 1)])
    if yq <= 0:
        yq = float(a.mean())
    theta = _zs_theta(a, n, ymax, yq)
    xi = float(np.mean(np.log1p(theta * a)))
    sigma = xi / theta if theta != 0 else float(a.mean())
    return GPDFit(sigma, xi, float(_gpd_ll(a, n, sigma, xi)), "zhang_stephens", n)


def gpd_fit_pwm(y) -> GPDFit:
    """Hosking & Wallis (1987) probability-weighted-moment GPD estimate (valid for xi < 1)."""
    a = np.sort(_exceedances(y))
    n = a.size
    if n < 2 or a[0] == a[-1]:
        s, xi, ll = _gpd_mle_core(a, n, False)
        return GPDFit(float(s), float(xi), float(ll), "pwm", n)
    p = (np.arange(1, n + 1) - 0.35) / n
    a0 = a.mean()
    a1 = np.mean((1 - p) * a)
    k = a0 / (a0 - 2 * a1) - 2.0  # Hosking's k = -xi
    sigma = 2 * a0 * a1 / (a0 - 2 * a1)
    xi = -k
    return GPDFit(float(sigma), float(xi), float(_gpd_ll(a, n, sigma, xi)), "pwm", n)


def gpd_return_level(u, sigma, xi, zeta, q):
    """Return level ``u + sigma/xi*((zeta/q)**xi - 1)`` for exceedance probability ``q``.

    Vectorised over its arguments. ``xi -> 0`` gives ``u + sigma*log(zeta/q)``; for
    ``xi < 0`` the level is capped at the endpoint ``u - sigma/xi``. ``q`` must be in
    ``(0, zeta]``.
    """
    u, sigma, xi, zeta, q = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (u, sigma, xi, zeta, q)))
    if np.any((q <= 0) | (q > zeta)):
        raise ValueError("the exceedance probability q must lie in (0, zeta_u]")
    lr = np.log(zeta / q)
    small = np.abs(xi) < _XI_ZERO
    with np.errstate(divide="ignore", invalid="ignore"):
        rl = np.where(small, u + sigma * lr, u + sigma * np.expm1(xi * lr) / np.where(small, 1.0, xi))
        ep = np.where(xi < 0, u - sigma / np.where(xi < 0, xi, -1.0), np.inf)
    rl = np.where(sigma <= 0, u, np.minimum(rl, ep))
    return rl[()] if rl.ndim == 0 else rl


def _groups(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError("expected a 1-D or 2-D (groups x obs) array")
    return np.ascontiguousarray(a)


def _nblocks(g: int) -> int:
    return max(1, min(g, 4 * numba.get_num_threads()))


def pot_fit_groups(
    x,
    q: float,
    *,
    tail_fraction: float = 0.1,
    min_exceedances: int = 30,
    zs_start: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Peaks-over-threshold GPD fit and return level per group.

    Parameters
    ----------
    x : array_like, shape (groups, obs) or (obs,)
        Nonnegative values, NaN padded.
    q : float
        Target exceedance probability per observation, in (0, 1).
    tail_fraction, min_exceedances :
        Threshold rule (module docstring): the tail is the
        ``max(min_exceedances, ceil(tail_fraction*n))`` largest values.
    zs_start : bool, optional
        Passed to the MLE (default: Zhang–Stephens start for <= 2000 exceedances).

    Returns
    -------
    params : ndarray, shape (groups, 8)
        Columns :data:`POT_FIELDS`; NaN rows for groups with fewer than
        ``min_exceedances + 1`` values.
    n : ndarray of int64
        Valid values per group.
    """
    q = float(q)
    _check_pot_args(q, tail_fraction, min_exceedances)
    a = _groups(x)
    if np.any(np.isinf(a)):
        raise ValueError("values contain inf (non-finite kernel output); a GPD tail cannot be fitted")
    if np.any(a < 0):
        raise ValueError("values must be nonnegative for a POT fit of an error metric")
    use_zs = -1 if zs_start is None else int(bool(zs_start))
    return _pot_groups_rescaled(a, q, float(tail_fraction), int(min_exceedances), use_zs)


def _check_pot_args(q, tail_fraction, min_exceedances) -> None:
    _unit("q", q)
    _unit("tail_fraction", tail_fraction)
    if int(min_exceedances) < 2:
        raise ValueError("min_exceedances must be >= 2")


#: groups whose largest value lies outside [2**-_POT_RESCALE_EXP, 2**_POT_RESCALE_EXP] are
#: fitted on values scaled by a power of two (:func:`_pot_groups_rescaled`)
_POT_RESCALE_EXP = 128


def _pot_groups_rescaled(a, q, tail_fraction, min_exc, use_zs):
    """The POT kernels (:func:`_pot_groups_dispatch`) on ``a`` (groups, obs), with
    far-from-unit groups rescaled.

    The fit is scale-equivariant: for data multiplied by ``c``, ``u``, ``sigma``, the
    endpoint and the return level are multiplied by ``c``, ``xi``, ``zeta`` and the
    exceedance count are unchanged and the log-likelihood shifts by ``-n_exceed log c``.
    The kernels' moment and likelihood sums overflow or underflow for values beyond about
    1e+-150, so a group whose largest value is outside ``2**+-128`` is fitted on its values
    times a power of two (exact) that brings the largest into [0.5, 1), and its fit is
    scaled back. Other groups are fitted as given.
    """
    with np.errstate(invalid="ignore"):
        mx = np.nanmax(a, axis=1, initial=0.0) if a.size else np.zeros(a.shape[0])
    expo = np.frexp(mx)[1].astype(np.int64)
    far = (mx > 0) & ((expo > _POT_RESCALE_EXP) | (expo < -_POT_RESCALE_EXP))
    if not far.any():
        return _pot_groups_dispatch(a, q, tail_fraction, min_exc, use_zs)
    shift = np.where(far, -expo, 0)
    params, n = _pot_groups_dispatch(np.ldexp(a, shift[:, None]), q, tail_fraction, min_exc, use_zs)
    params = params.copy()
    for f in ("u", "sigma", "endpoint", "return_level"):
        j = POT_FIELDS.index(f)
        params[:, j] = np.ldexp(params[:, j], -shift)
    # the data were multiplied by 2**shift: loglik_original = loglik_scaled + n_exceed * shift * log 2
    params[:, POT_FIELDS.index("loglik")] += params[:, POT_FIELDS.index("n_exceed")] * shift * math.log(2.0)
    return params, n


def _pot_groups_dispatch(a, q, tail_fraction, min_exc, use_zs):
    if use_zs < 0:
        # default: ZS start when the tail is small (decided per call on the largest group)
        n_max = int(np.max(np.sum(~np.isnan(a), axis=1))) if a.size else 0
        use_zs = int(max(min_exc, math.ceil(tail_fraction * n_max)) <= 2000)
    if a.shape[1] >= _POT_RADIX_MIN_N:
        return _pot_groups_radix_kernel(a, a.view(np.int64), tail_fraction, min_exc, q, bool(use_zs),
                                        _nblocks(a.shape[0]), _q._RADIX_SMALL)
    return _pot_groups_kernel(a, tail_fraction, min_exc, q, bool(use_zs), _nblocks(a.shape[0]))


def pot_fit(x, q: float, **kwargs) -> dict:
    """POT fit of one sample; a dict of :data:`POT_FIELDS` plus ``n``.

    Raises ``ValueError`` when the sample is smaller than ``min_exceedances + 1`` (named).
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError("pot_fit expects a 1-D sample; use pot_fit_groups")
    a = a[~np.isnan(a)]
    min_exc = int(kwargs.get("min_exceedances", 30))
    if a.size < min_exc + 1:
        raise ValueError(f"POT fit needs n >= {min_exc + 1} values (min_exceedances + 1), got {a.size}")
    params, n = pot_fit_groups(a, q, **kwargs)
    out = dict(zip(POT_FIELDS, map(float, params[0])))
    out["n_exceed"] = int(out["n_exceed"])
    out["n"] = int(n[0])
    return out


def gev_loglik(x, mu: float, sigma: float, xi: float) -> float:
    """GEV log-likelihood (equals ``genextreme.logpdf(x, -xi, mu, sigma).sum()``)."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float64).ravel())
    return float(-_gev_nll(a, a.size, float(mu), math.log(sigma), float(xi)))


def gev_fit_groups(x, q: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """GEV MLE per group (rows of block maxima, NaN padded) and the level whose block
    exceedance probability is ``q``.

    Returns ``(params, n)`` with columns :data:`GEV_FIELDS`; NaN rows for groups with
    fewer than 3 values; all-equal groups give the point mass (``sigma = 0``).
    """
    q = _unit("q", q)
    a = _groups(x)
    if np.any(np.isinf(a)):
        raise ValueError("values contain inf; a GEV cannot be fitted to infinite maxima")
    return _gev_groups_kernel(a, q, _nblocks(a.shape[0]))


def gev_fit_mle(x, q: float = 0.01) -> dict:
    """GEV maximum likelihood for one sample of block maxima; dict of :data:`GEV_FIELDS`."""
    a = np.asarray(x, dtype=np.float64).ravel()
    a = a[~np.isnan(a)]
    if a.size < 3:
        raise ValueError(f"GEV fit needs at least 3 block maxima, got {a.size}")
    params, n = gev_fit_groups(a, q)
    out = dict(zip(GEV_FIELDS, map(float, params[0])))
    out["n"] = int(n[0])
    return out


def gev_return_level(mu, sigma, xi, q):
    """Level exceeded by a block maximum with probability ``q``:
    ``mu + sigma/xi*((-log(1-q))**(-xi) - 1)`` (``mu - sigma*log(-log(1-q))`` at xi = 0)."""
    mu, sigma, xi, q = (np.asarray(v, dtype=np.float64) for v in (mu, sigma, xi, q))
    ly = np.log(-np.log1p(-q))
    small = np.abs(xi) < _XI_ZERO
    with np.errstate(divide="ignore", invalid="ignore"):
        rl = np.where(small, mu - sigma * ly, mu + sigma * np.expm1(-xi * ly) / np.where(small, 1.0, xi))
    return rl[()] if rl.ndim == 0 else rl
