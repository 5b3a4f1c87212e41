"""Bootstrap upper confidence bounds (percentile and BCa) for a quantile or a GPD return level.

Design
------
* **Seeded, thread-count independent.** Resample ``b`` draws from its own splitmix64
  stream derived from ``(seed, b)``; the result is the same for a seed whatever the
  number of threads or how resamples are split between them.
* **Parallel, memory bounded.** ``prange`` over blocks of resamples, each block owning
  one scratch buffer (O(n) per thread); no ``n x B`` matrix is ever built.
* **Quantile of a resample by counting selection.** The sample is sorted once; a resample
  is a vector of multiplicities (counts) over the sorted values, and the needed order
  statistics of the resample are found by walking the counts from the nearer end, so the
  resample's quantile (numpy 'linear' interpolation, bit for bit) costs O(n) without
  materialising or sorting the resample.
* **BCa** (Efron 1987; as ``scipy.stats.bootstrap``): bias correction
  ``z0 = Phi^-1((#{theta* < theta} + #{theta* <= theta}) / (2B))`` (the proportion is
  clipped to ``[1/(2B), 1 - 1/(2B)]`` so lattice data with many ties give a finite
  correction instead of scipy's NaN), acceleration from the jackknife. For a quantile the
  jackknife is exact and O(n): removing the j-th order statistic shifts the two order
  statistics the quantile interpolates in one of only three ways, so the n leave-one-out
  values take three distinct values with known multiplicities. For a return level the
  jackknife leaves out one exceedance at a time with the threshold and exceedance rate
  held fixed (an approximation; k refits in parallel).
* One-sided **upper** bound at level ``confidence``: percentile = the ``confidence``
  quantile of the bootstrap distribution; BCa = its
  ``Phi(z0 + (z0 + z_c)/(1 - a (z0 + z_c)))`` quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
from numba import njit, prange
from scipy import special

from tolstat._base.validate import unit_interval as _unit
from tolstat.models.estimators.evt import _gpd_mle_core, _pot_core, _return_level
from tolstat.models.estimators.quantiles import QUANTILE_METHODS, quantile as _quantile
from tolstat._base import numba_cache as _numba_cache

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

__all__ = [
    "BootstrapResult",
    "bootstrap_quantile_distribution",
    "bootstrap_quantile_bound",
    "bootstrap_return_level_bound",
    "jackknife_quantile",
    "bca_level",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0


@njit(cache=True, nogil=True, inline="always")
def _mix(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, nogil=True, inline="always")
def _stream(seed, b):
    """Initial state of resample b's splitmix64 stream."""
    return _mix(_mix(np.uint64(seed) + _GOLDEN) ^ (np.uint64(b) * _M2 + _GOLDEN))


@njit(cache=True, nogil=True, inline="always")
def _next_uniform(state):
    state = state + _GOLDEN
    return state, float(_mix(state) >> _S11) * _INV53


@njit(cache=True, nogil=True)
def _qpos(m, p, method):
    """numpy's (lo, hi, gamma) for a sample of size m."""
    v = (m - 1) * p
    if method == 0:
        prev = math.floor(v)
        if v >= m - 1:
            return m - 1, m - 1, v + 1.0
        return int(prev), int(prev) + 1, v - prev
    if method == 1:
        i = int(math.floor(v))
    elif method == 2:
        i = int(math.ceil(v))
    else:
        i = int(np.rint(v))
    return i, i, 0.0


@njit(cache=True, nogil=True, inline="always")
def _lerp(a, b, t):
    d = b - a
    if t >= 0.5:
        return b - d * (1.0 - t)
    return a + d * t


@njit(cache=True, parallel=True)
def _boot_quantile_kernel(xs, p, method, n_res, seed, nblocks):
    m = xs.shape[0]
    out = np.empty(n_res, np.float64)
    lo, hi, t = _qpos(m, p, method)
    from_top = lo > m // 2
    per = (n_res + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        counts = np.empty(m, np.int32)
        for b in range(blk * per, min(n_res, (blk + 1) * per)):
            counts[:] = 0
            st = _stream(seed, b)
            for i in range(m):
                st, u = _next_uniform(st)
                j = int(u * m)
                if j >= m:
                    j = m - 1
                counts[j] += 1
            vlo = np.nan
            vhi = np.nan
            if from_top:
                end = m
                j = m - 1
                while j >= 0:
                    start = end - counts[j]
                    if start <= hi < end:
                        vhi = xs[j]
                    if start <= lo < end:
                        vlo = xs[j]
                        break
                    end = start
                    j -= 1
            else:
                start = 0
                j = 0
                while j < m:
                    end = start + counts[j]
                    if start <= lo < end:
                        vlo = xs[j]
                    if start <= hi < end:
                        vhi = xs[j]
                        break
                    start = end
                    j += 1
            out[b] = vlo if method != 0 else _lerp(vlo, vhi, t)
    return out


@njit(cache=True, nogil=True)
def _jackknife_quantile_kernel(xs, p, method):
    """Jackknife (leave-one-out) quantile values in O(1) per distinct case.

    Returns (values[3], multiplicities[3]) for the n leave-one-out samples.
    """
    n = xs.shape[0]
    lo, hi, t = _qpos(n - 1, p, method)
    vals = np.empty(3)
    mult = np.empty(3)
    # removed order statistic j <= lo: both shift up
    vals[0] = _lerp(xs[lo + 1], xs[hi + 1], t) if method == 0 else xs[lo + 1]
    mult[0] = lo + 1
    # lo < j <= hi: lower stays, upper shifts
    vals[1] = _lerp(xs[lo], xs[hi + 1], t) if method == 0 else xs[lo]
    mult[1] = hi - lo
    # j > hi: none shifts
    vals[2] = _lerp(xs[lo], xs[hi], t) if method == 0 else xs[lo]
    mult[2] = n - 1 - hi
    return vals, mult


@njit(cache=True, parallel=True)
def _boot_gpd_parametric_kernel(u, sigma, xi, zeta, k, q, n_res, seed, use_zs, nblocks):
    out = np.empty(n_res, np.float64)
    per = (n_res + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        y = np.empty(k, np.float64)
        for b in range(blk * per, min(n_res, (blk + 1) * per)):
            st = _stream(seed, b)
            for i in range(k):
                st, uu = _next_uniform(st)
                e = -math.log1p(-uu)  # standard exponential
                if abs(xi) < 1e-12:
                    y[i] = sigma * e
                else:
                    y[i] = sigma * math.expm1(xi * e) / xi
            s, x, ll = _gpd_mle_core(y, k, use_zs)
            out[b] = _return_level(u, s, x, zeta, q)
    return out


@njit(cache=True, parallel=True)
def _boot_pot_nonparametric_kernel(xs, tail_fraction, min_exc, q, n_res, seed, use_zs, nblocks):
    m = xs.shape[0]
    out = np.empty(n_res, np.float64)
    per = (n_res + nblocks - 1) // nblocks
    for blk in prange(nblocks):
        buf = np.empty(m, np.float64)
        res = np.empty(8, np.float64)
        for b in range(blk * per, min(n_res, (blk + 1) * per)):
            st = _stream(seed, b)
            for i in range(m):
                st, uu = _next_uniform(st)
                j = int(uu * m)
                if j >= m:
                    j = m - 1
                buf[i] = xs[j]
            _pot_core(buf, m, tail_fraction, min_exc, q, use_zs, res)
            out[b] = res[7]
    return out


@njit(cache=True, parallel=True)
def _jackknife_gpd_kernel(y, u, zeta, q, use_zs):
    k = y.shape[0]
    out = np.empty(k, np.float64)
    for i in prange(k):
        z = np.empty(k - 1, np.float64)
        w = 0
        for j in range(k):
            if j != i:
                z[w] = y[j]
                w += 1
        s, x, ll = _gpd_mle_core(z, k - 1, use_zs)
        out[i] = _return_level(u, s, x, zeta, q)
    return out


# --------------------------------------------------------------------------- helpers
@dataclass(frozen=True)
class BootstrapResult:
    """An upper confidence bound and how it was obtained."""

    bound: float
    estimate: float
    method: str
    confidence: float
    n_resamples: int
    seed: int
    z0: float = float("nan")
    acceleration: float = float("nan")
    level: float = float("nan")  # the quantile of the bootstrap distribution used
    standard_error: float = float("nan")


def _nblocks(n_res: int) -> int:
    return max(1, min(n_res, 4 * numba.get_num_threads()))


def _sample(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    a = a[~np.isnan(a)]
    if a.size < 2:
        raise ValueError(f"bootstrap needs at least 2 non-NaN values, got {a.size}")
    return a


def _check(confidence: float, n_resamples: int, method: str) -> None:
    _unit("confidence", confidence)
    if int(n_resamples) < 2:
        raise ValueError("n_resamples must be >= 2")
    if method not in ("percentile", "bca"):
        raise ValueError(f"method must be 'percentile' or 'bca', got {method!r}")


def bca_level(theta_b: np.ndarray, theta_hat: float, jack: np.ndarray, confidence: float,
              weights: np.ndarray | None = None) -> tuple[float, float, float]:
    """BCa level for a one-sided upper bound: returns ``(level, z0, a)``.

    ``jack`` are jackknife values (optionally with multiplicities ``weights``).
    """
    B = theta_b.size
    prop = (np.count_nonzero(theta_b < theta_hat) + np.count_nonzero(theta_b <= theta_hat)) / (2.0 * B)
    prop = min(max(prop, 0.5 / B), 1 - 0.5 / B)
    z0 = float(special.ndtri(prop))
    w = np.ones_like(jack) if weights is None else np.asarray(weights, dtype=np.float64)
    nj = w.sum()
    mean = np.sum(w * jack) / nj
    d = mean - jack
    den = np.sum(w * d**2)
    a = float(np.sum(w * d**3) / (6.0 * den**1.5)) if den > 0 else 0.0
    zc = float(special.ndtri(confidence))
    num = z0 + zc
    level = float(special.ndtr(z0 + num / (1.0 - a * num)))
    return level, z0, a


def jackknife_quantile(x, p: float, *, method: str = "linear") -> tuple[np.ndarray, np.ndarray]:
    """Exact leave-one-out quantiles in O(n) after one sort.

    Returns ``(values, multiplicities)``: three distinct leave-one-out values and how many
    of the n jackknife samples give each (they sum to n).
    """
    xs = np.sort(_sample(x))
    return _jackknife_quantile_kernel(xs, float(p), QUANTILE_METHODS[method])


def bootstrap_quantile_distribution(x, p: float, *, n_resamples: int = 1000, seed: int = 0,
                                    method: str = "linear") -> np.ndarray:
    """Bootstrap distribution (``n_resamples`` values) of the p-quantile of ``x``."""
    if method not in QUANTILE_METHODS:
        raise ValueError(f"method must be one of {tuple(QUANTILE_METHODS)}")
    if not 0 <= p <= 1:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    xs = np.sort(_sample(x))
    return _boot_quantile_kernel(xs, float(p), QUANTILE_METHODS[method], int(n_resamples),
                                 int(seed) & 0xFFFFFFFFFFFFFFFF, _nblocks(int(n_resamples)))


def bootstrap_quantile_bound(
    x,
    p: float,
    *,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    method: str = "bca",
    seed: int = 0,
    quantile_method: str = "linear",
) -> BootstrapResult:
    """One-sided upper bootstrap confidence bound of the p-quantile (nonparametric).

    Parameters
    ----------
    x : array_like
        Sample (NaNs are dropped).
    p : float
        Quantile level.
    confidence : float
        One-sided confidence level of the upper bound.
    n_resamples : int
        Number of bootstrap resamples B.
    method : {"bca", "percentile"}
        Interval construction.
    seed : int
        Seed; resample b uses a stream derived from (seed, b).
    quantile_method : {"linear", "lower", "higher", "nearest"}
        The numpy quantile method of the statistic.

    Returns
    -------
    BootstrapResult

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).exponential(size=2000)
    >>> r = bootstrap_quantile_bound(x, 0.99, n_resamples=500)
    >>> r.bound > r.estimate
    True
    """
    _check(confidence, n_resamples, method)
    a = _sample(x)
    xs = np.sort(a)
    theta_hat = _quantile(xs, p, method=quantile_method)
    tb = bootstrap_quantile_distribution(xs, p, n_resamples=n_resamples, seed=seed, method=quantile_method)
    if method == "percentile":
        level, z0, acc = confidence, float("nan"), float("nan")
    else:
        vals, mult = _jackknife_quantile_kernel(xs, float(p), QUANTILE_METHODS[quantile_method])
        level, z0, acc = bca_level(tb, theta_hat, vals, confidence, mult)
    bound = float(np.quantile(tb, level))
    return BootstrapResult(bound, float(theta_hat), method, confidence, int(n_resamples), int(seed),
                           z0, acc, level, float(np.std(tb, ddof=1)))


def bootstrap_return_level_bound(
    x,
    q: float,
    *,
    confidence: float = 0.95,
    n_resamples: int = 1000,
    method: str = "percentile",
    resampling: str = "parametric",
    seed: int = 0,
    tail_fraction: float = 0.1,
    min_exceedances: int = 30,
) -> BootstrapResult:
    """Upper bootstrap confidence bound of a POT/GPD return level (exceedance prob ``q``).

    ``resampling="parametric"`` simulates the exceedances from the fitted GPD (threshold
    and exceedance rate fixed) and refits; ``"nonparametric"`` resamples the whole sample
    and redoes threshold choice and fit. ``method="bca"`` takes the acceleration from a
    jackknife over exceedances (threshold fixed).
    """
    from tolstat.models.estimators.evt import pot_fit

    _check(confidence, n_resamples, method)
    if resampling not in ("parametric", "nonparametric"):
        raise ValueError("resampling must be 'parametric' or 'nonparametric'")
    a = _sample(x)
    fit = pot_fit(a, q, tail_fraction=tail_fraction, min_exceedances=min_exceedances)
    k = fit["n_exceed"]
    use_zs = max(min_exceedances, math.ceil(tail_fraction * a.size)) <= 2000
    B = int(n_resamples)
    s64 = int(seed) & 0xFFFFFFFFFFFFFFFF
    if k < 2 or fit["sigma"] == 0 or q >= fit["zeta"]:
        # degenerate tail or a level inside the data: nothing to model, bound = estimate
        rl = fit["return_level"]
        return BootstrapResult(rl, rl, method, confidence, B, int(seed))
    if resampling == "parametric":
        tb = _boot_gpd_parametric_kernel(fit["u"], fit["sigma"], fit["xi"], fit["zeta"], k, float(q), B, s64,
                                         use_zs, _nblocks(B))
    else:
        tb = _boot_pot_nonparametric_kernel(np.sort(a), float(tail_fraction), int(min_exceedances), float(q), B,
                                            s64, use_zs, _nblocks(B))
    theta_hat = fit["return_level"]
    if method == "percentile":
        level, z0, acc = confidence, float("nan"), float("nan")
    else:
        y = np.sort(a)[-k:] - fit["u"]
        jack = _jackknife_gpd_kernel(np.ascontiguousarray(y), fit["u"], fit["zeta"], float(q), use_zs)
        level, z0, acc = bca_level(tb, theta_hat, jack, confidence)
    bound = float(np.quantile(tb, level))
    return BootstrapResult(bound, float(theta_hat), f"{method}/{resampling}", confidence, B, int(seed),
                           z0, acc, level, float(np.std(tb, ddof=1)))
