"""Run records: one run summarised, and records assembled into an error dataset.

:func:`summarize_run` reduces the element-wise metrics of one run to a :class:`RunRecord`
(run statistics, error quantiles and an element sample that holds the run's Pareto front,
:func:`pareto_frontier`, or its upper convex hull, :func:`upper_hull`);
:func:`build_dataset` assembles records into an error dataset of the schema of
:mod:`tolstat.dataset.schema`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numba
import numpy as np
import xarray as xr

from tolstat._base import numba_cache as _numba_cache
from tolstat._base import validate as _validate
from tolstat._version import __version__
from tolstat.dataset.schema import (
    BUILTIN_COVARIATES,
    DEFAULT_SAMPLE_SIZE,
    FINGERPRINT,
    FINGERPRINT_ATTRS,
    FIT_SAMPLE,
    FIT_SAMPLE_ATTRS,
    FIT_SAMPLE_SIZE,
    METRIC_DEFINITIONS,
    QUANTILES,
    RESERVED,
    RUN_STATS,
    SAMPLE_VARS,
    SCHEMA_VERSION,
)
from tolstat.measure.metrics import ErrorMetrics, metric_covariates

__all__ = [
    "RunRecord",
    "summarize_run",
    "pareto_frontier",
    "upper_hull",
    "build_dataset",
]

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package


@dataclass
class RunRecord:
    """Everything kept about one run (one kernel call compared with its reference)."""

    op: str
    dtype: str
    hardware: str
    platform: str
    shape: str
    seed: int
    run_index: int
    labels: dict[str, str]
    covariates: dict[str, float]
    stats: dict[str, float]
    quantiles: np.ndarray
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    #: whole-output statistics of the operator noise model (``tolstat.measure.noise``); optional
    op_stats: dict[str, float] = field(default_factory=dict)
    #: :func:`~tolstat.dataset.schema.reference_fingerprint` of the run's reference; optional
    ref_fingerprint: int | None = None
    #: whether ``op_stats`` include the per-row statistics (row-wise op); None without ``op_stats``
    op_rowwise: bool | None = None
    #: how the magnitude of ``op_stats`` was obtained (:data:`MAGNITUDE_SOURCES`); None without ``op_stats``
    op_magnitude: str | None = None
    #: the first ``n_fit`` entries of ``samples`` are the run's fit sample
    #: (:data:`~tolstat.dataset.schema.FIT_SAMPLE_SIZE`); None: unknown (the whole sample)
    n_fit: int | None = None


def _fmt_shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(s)) for s in shape) if len(shape) else "scalar"


def _run_stats(metrics: ErrorMetrics) -> tuple[dict[str, Any], np.ndarray]:
    """The run-level statistics of one run and its error quantiles (:data:`~tolstat.dataset.schema.QUANTILES`)."""
    abs_e = metrics.abs
    nf = metrics.n_nonfinite
    with np.errstate(invalid="ignore", over="ignore"):
        mean_abs = float(abs_e.mean()) if nf == 0 else float("inf")
        sig = metrics.signed
        total = sig.sum()
        if np.isfinite(total):  # every signed error finite: the mean without a masked copy
            mean_signed = float(total / sig.size)
        else:
            sig = sig[~metrics.nonfinite & np.isfinite(sig)]
            mean_signed = float(sig.mean()) if sig.size else 0.0
        cov = metric_covariates(metrics)
        q = _quantile_linear(abs_e, _QUANTILES) if nf == 0 else np.quantile(
            np.where(metrics.nonfinite, np.inf, abs_e), QUANTILES, method="higher"
        )
    stats = {
        "n_elements": metrics.n_elements,
        "n_frontier": 0,
        "n_nonfinite": nf,
        "max_abs": float(abs_e.max()) if metrics.scalars is None else metrics.scalars["max_abs"],
        "max_rel": float(metrics.rel.max()) if metrics.scalars is None else metrics.scalars["max_rel"],
        "max_ulp": float(metrics.ulp.max()),
        "mean_abs": mean_abs,
        "mean_signed": mean_signed,
        "rel_floor": metrics.rel_floor,
        "ref_max_abs": cov["ref_max_abs"],
        "ref_rms": cov["ref_rms"],
    }
    return stats, q


_QUANTILES = np.asarray(QUANTILES, dtype=np.float64)
#: from this many values on, :func:`_quantile_linear` selects with :func:`_order_statistics`
_SELECT_FROM = 1024


def _quantile_linear(a: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """``np.quantile(a, qs)`` (method "linear") for a 1-D float64 ``a``: numpy's own steps
    (the same partition, indices and interpolation) without its per-call overhead."""
    n = a.size
    if n == 0 or a.dtype != np.float64 or a.ndim != 1:
        return np.quantile(a, qs)
    prev, nxt, kth, t, upper, ranks, at_prev, at_nxt = _linear_positions(n, tuple(float(q) for q in qs))
    vals = np.empty(ranks.size)
    # the values np.partition puts at those ranks; faster than it from about a thousand values
    if n >= _SELECT_FROM and _order_statistics(a, ranks, vals):
        lo, hi = vals[at_prev], vals[at_nxt]
    else:
        part = np.partition(a, kth)
        if np.isnan(part[-1]):
            return np.quantile(a, qs)
        lo, hi = part[prev], part[nxt]
    d = hi - lo
    out = lo + d * t
    np.subtract(hi, d * (1 - t), out=out, where=upper)
    return out


@functools.lru_cache(maxsize=512)
def _linear_positions(n: int, qs: tuple[float, ...]) -> tuple[np.ndarray, ...]:
    """numpy's "linear" indices, partition points and weights for ``n`` values (cached:
    runs of a collection share a few sizes; the arrays are only read)."""
    v = (n - 1) * np.asarray(qs, dtype=np.float64)
    prev = np.floor(v).astype(np.intp)
    nxt = prev + 1
    above = v >= n - 1
    prev[above] = -1
    nxt[above] = -1
    t = v - prev
    kth = np.unique(np.hstack((prev, nxt)))
    ranks = np.unique(kth % n)  # as non-negative ranks, for _order_statistics
    out = (prev, nxt, kth, t, t >= 0.5, ranks, np.searchsorted(ranks, prev % n), np.searchsorted(ranks, nxt % n))
    for x in out:
        x.flags.writeable = False
    return out


@numba.njit(cache=True, nogil=True)
def _order_statistics(a: np.ndarray, ranks: np.ndarray, out: np.ndarray) -> bool:  # pragma: no cover - numba
    """``out[j] = numpy.sort(a)[ranks[j]]`` for sorted distinct ``ranks``, where every value
    of ``a`` is +0.0 or positive and none is NaN (absolute errors); False (``out`` unset)
    where a value is not, for the caller's fallback.

    A bucket selection: the bit patterns of such values are ordered like the values, so a
    histogram of their top bits (up to 2,048 buckets over the observed range) names the
    bucket of each rank; only the elements of those buckets are gathered and sorted
    (skipped where a bucket holds one value). The values are those ``numpy.partition``
    places at the ranks: order statistics do not depend on the algorithm.
    """
    n = a.size
    bits = a.view(np.int64)
    inf_bits = np.int64(0x7FF0000000000000)
    kmin = bits[0]
    kmax = bits[0]
    for i in range(n):
        b = bits[i]
        if b < 0 or b > inf_bits:  # a negative value (-0.0 too) or NaN
            return False
        if b < kmin:
            kmin = b
        elif b > kmax:
            kmax = b
    nb = 1
    while nb < n and nb < 2048:
        nb *= 2
    shift = 0
    while ((kmax - kmin) >> shift) >= nb:
        shift += 1
    counts = np.zeros(nb, dtype=np.int64)
    for i in range(n):
        counts[(bits[i] - kmin) >> shift] += 1
    # the bucket of each rank, and where its elements go in one gather buffer
    slot = np.full(nb, -1, dtype=np.int64)  # bucket -> index among the needed buckets
    need_start = np.empty(ranks.size, dtype=np.int64)  # buffer offset of each needed bucket
    need_first = np.empty(ranks.size, dtype=np.int64)  # rank of its first (smallest) element
    need_count = np.empty(ranks.size, dtype=np.int64)
    rank_slot = np.empty(ranks.size, dtype=np.int64)
    n_need = 0
    total = 0
    before = 0
    j = 0
    for bk in range(nb):
        c = counts[bk]
        while j < ranks.size and ranks[j] < before + c:
            if slot[bk] < 0:
                slot[bk] = n_need
                need_start[n_need] = total
                need_first[n_need] = before
                need_count[n_need] = c
                total += c
                n_need += 1
            rank_slot[j] = slot[bk]
            j += 1
        before += c
        if j == ranks.size:
            break
    buf = np.empty(total)
    fill = need_start[:n_need].copy()
    lo = np.full(n_need, np.inf)
    hi = np.full(n_need, -np.inf)
    for i in range(n):
        sl = slot[(bits[i] - kmin) >> shift]
        if sl >= 0:
            v = a[i]
            buf[fill[sl]] = v
            fill[sl] += 1
            if v < lo[sl]:
                lo[sl] = v
            if v > hi[sl]:
                hi[sl] = v
    for k in range(n_need):
        if lo[k] < hi[k]:
            seg = buf[need_start[k]:need_start[k] + need_count[k]]
            seg.sort()
    for j in range(ranks.size):
        sl = rank_slot[j]
        if lo[sl] == hi[sl]:
            out[j] = lo[sl]
        else:
            out[j] = buf[need_start[sl] + ranks[j] - need_first[sl]]
    return True


def _fit_share(sample_size: int) -> int:
    """The most slots of a sample of ``sample_size`` the fit sample takes in a longer run:
    4/5 of it (rounded up), so that at least one slot, and a fifth, holds the front or its hull."""
    return sample_size - max(1, sample_size // 5)


def _sample_indices(metrics: ErrorMetrics, sample_size: int,
                    rng: np.random.Generator | None) -> tuple[np.ndarray, int, int]:
    """Indices of the element sample, the front length and the fit sample's length.

    The fit sample comes first: :data:`~tolstat.dataset.schema.FIT_SAMPLE_SIZE` elements drawn
    uniformly without replacement (every element of a shorter run), drawn before anything
    else from ``rng`` and so the same whatever ``sample_size`` is; in a run longer than its
    sample it is cut to :func:`_fit_share` (the first elements of the draw: still uniform).
    Then, in index order, the rest: every other element of a run of at most ``sample_size``,
    else the front or its hull and a uniform draw from the remaining elements.
    """
    n = metrics.n_elements
    abs_e = metrics.abs
    if n > FIT_SAMPLE_SIZE:
        rng = np.random.default_rng() if rng is None else rng
        draw = rng.choice(n, size=FIT_SAMPLE_SIZE, replace=False)
    else:
        draw = np.arange(n)
    n_front = int(pareto_frontier(abs_e, metrics.ref_abs).size) if n <= sample_size else 0
    if n <= sample_size and n <= FIT_SAMPLE_SIZE:
        return draw, n_front, n
    if n <= sample_size:
        fit = np.sort(draw)
        rest = np.ones(n, dtype=bool)
        rest[fit] = False
        return np.concatenate([fit, np.flatnonzero(rest)]), n_front, int(fit.size)
    rng = np.random.default_rng() if rng is None else rng
    fit = np.sort(draw[: min(draw.size, _fit_share(sample_size))])
    room = sample_size - fit.size
    front = pareto_frontier(abs_e, metrics.ref_abs)
    keep = _not_in_sorted(front, fit)  # the front outside the fit sample (both sorted)
    if keep.size > room:
        in_fit = np.zeros(n, dtype=bool)
        in_fit[fit] = True
        # a long front (error ~ proportional to |ref|): keep its upper convex hull,
        # which holds the run maximum of every score |d| / (a + b*|ref|), then the
        # largest-|d| rest of the front
        hull = upper_hull(front, abs_e, metrics.ref_abs)
        if hull.size > room:
            # exact run scores come before the fit sample's length: the fit sample gives
            # way to the hull, down to half the sample (its first elements: still uniform)
            fit = np.sort(draw[: min(fit.size, max(sample_size // 2, sample_size - hull.size))])
            room = sample_size - fit.size
            in_fit[:] = False
            in_fit[fit] = True
        # a hull longer than the room is cut: largest errors first, so the sample
        # always holds the run's largest error (the run's max_abs)
        hull = hull[np.argsort(-abs_e[hull], kind="stable")]
        on_hull = np.zeros(n, dtype=bool)
        on_hull[hull] = True
        rest = front[~on_hull[front]]  # np.setdiff1d(front, hull): front's order, without its overhead
        rest = rest[np.argsort(-abs_e[rest], kind="stable")]
        order = np.concatenate([hull, rest])
        keep = order[~in_fit[order]][:room]
    extra = rng.choice(n - fit.size - keep.size, size=room - keep.size, replace=False)
    return _assemble_sample(fit, keep, extra), int(front.size), int(fit.size)


@numba.njit(cache=True, nogil=True)
def _not_in_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """The values of sorted ``a`` that are not in sorted ``b``, in ``a``'s order."""
    out = np.empty(a.size, dtype=np.int64)
    m = 0
    j = 0
    for i in range(a.size):
        v = a[i]
        while j < b.size and b[j] < v:
            j += 1
        if j < b.size and b[j] == v:
            continue
        out[m] = v
        m += 1
    return out[:m].copy()


@numba.njit(cache=True, nogil=True)
def _assemble_sample(fit: np.ndarray, keep: np.ndarray, extra: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """The element sample's indices: the fit sample, then, sorted, the kept front elements
    and the uniform draws ``extra`` from the elements in neither (draw ``j`` is the
    ``j``-th of those, counted from 0, mapped back to its element index)."""
    taken = np.sort(np.concatenate((fit, keep)))
    adj = taken - np.arange(taken.size)  # taken[t] has adj[t] untaken elements before it
    mapped = np.empty(extra.size, dtype=np.int64)
    for t in range(extra.size):
        mapped[t] = extra[t] + np.searchsorted(adj, extra[t], side="right")
    return np.concatenate((fit, np.sort(np.concatenate((keep, mapped)))))


def summarize_run(
    metrics: ErrorMetrics,
    *,
    op: str,
    hardware: str,
    platform: str = "",
    seed: int = -1,
    run_index: int = 0,
    labels: Mapping[str, Any] | None = None,
    covariates: Mapping[str, float] | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    rng: np.random.Generator | None = None,
) -> RunRecord:
    """Reduce the element-wise metrics of one run to a :class:`RunRecord`.

    The element sample holds every element of a run of at most ``sample_size`` elements;
    of a longer run, ``sample_size`` elements: the fit sample (a uniform draw, below), the
    run's Pareto front (or its upper convex hull, which holds every affine score's
    maximum, then the largest errors of the front) and a uniform draw from the remaining
    elements. It always contains the element with the largest absolute error. Its first
    ``n_fit`` entries are the *fit sample* the scale fits read: a uniform draw without
    replacement of :data:`~tolstat.dataset.schema.FIT_SAMPLE_SIZE` elements (every element of
    a shorter run), made first from ``rng`` and so the same for every ``sample_size`` (in a
    run longer than its sample, at most 4/5 of the sample: the draw's first elements).
    """
    if sample_size < 1:
        raise ValueError(f"sample_size must be >= 1, got {sample_size}")
    stats, q = _run_stats(metrics)
    idx, n_front, n_fit = _sample_indices(metrics, sample_size, rng)
    stats["n_frontier"] = n_front
    abs_e = metrics.abs
    samples = {
        "sample_abs": abs_e[idx],
        "sample_signed": metrics.signed[idx],
        "sample_ulp": metrics.ulp[idx],
        "sample_ref": metrics.ref_abs[idx],
    }
    if labels is not None and not isinstance(labels, Mapping):
        raise TypeError(f"labels must be a mapping {{name: value}}, got {type(labels).__name__}")
    labels = {_validate.label_name("label", k): _validate.label_value(f"label {k!r}", _label_value(k, v))
              for k, v in (labels or {}).items()}
    covs = _validate.covariates(covariates, computed=BUILTIN_COVARIATES)
    op = _validate.label_value("op", op)
    hardware = _validate.label_value("hardware", hardware)
    platform = _validate.label_value("platform", platform)
    for name in list(labels) + list(covs):
        if name in RESERVED:
            raise ValueError(f"label/covariate name {name!r} is reserved by the schema")
    overlap = set(labels) & set(covs)
    if overlap:
        raise ValueError(f"names used both as label and covariate: {sorted(overlap)}")
    return RunRecord(
        op=str(op),
        dtype=metrics.dtype,
        hardware=str(hardware),
        platform=str(platform),
        shape=_fmt_shape(metrics.shape),
        seed=int(seed),
        run_index=int(run_index),
        labels=labels,
        covariates=covs,
        stats=stats,
        quantiles=np.asarray(q, dtype=np.float64),
        samples=samples,
        n_fit=n_fit,
    )


def pareto_frontier(abs_err: np.ndarray, ref_abs: np.ndarray) -> np.ndarray:
    """Indices of the elements on the (largest ``|d|``, smallest ``|expected|``) Pareto front.

    An element is on the front when no other element has a larger-or-equal error at a
    smaller-or-equal reference magnitude (ties broken by position). For any score that
    increases with ``|d|`` and does not increase with ``|expected|`` -- max abs error,
    relative error, ``|d| / (atol + rtol*|expected|)``, ``|d| / s(K, |expected|)`` -- the
    run's maximum score is attained on the front. Keeping the front in the element sample
    therefore makes every such normalised run statistic *exact* from the sample.
    """
    # numba, O(n) plus a sort of the few candidates: the same set as walking the
    # lexicographic order (|expected|, -|d|, position) and keeping each element whose |d|
    # exceeds every earlier one (a NaN |d| stops the front, as a running max would)
    return _front_kernel(np.asarray(abs_err, dtype=np.float64).ravel(),
                         np.asarray(ref_abs, dtype=np.float64).ravel())


@numba.njit(cache=True, inline="always")
def _front_r(v: float) -> float:  # pragma: no cover - numba
    """The front's ``r`` of an ``|expected|`` value: NaN counts as +inf, -0.0 as +0.0."""
    return (np.inf if v != v else v) + 0.0  # + 0.0: -0.0 becomes +0.0


@numba.njit(cache=True, inline="always")
def _front_key(r: float, buf: np.ndarray, bits: np.ndarray) -> np.int64:  # pragma: no cover - numba
    """An int64 ordered like the float ``r`` (``bits`` a view of the one-slot ``buf``)."""
    buf[0] = r
    b = bits[0]
    return b ^ ((b >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


@numba.njit(cache=True, nogil=True)
def _front_kernel(d: np.ndarray, r_in: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """Sorted indices of the Pareto front (see :func:`pareto_frontier`).

    A NaN ``|expected|`` counts as +inf, and -0.0 as +0.0 (they tie).

    The elements are bucketed by ``r`` (buckets ordered like ``r``); an element whose
    ``d`` is at most the largest ``d`` of an earlier bucket follows an element with a
    larger-or-equal ``d`` and is not on the front. The remaining candidates (and every
    NaN ``d``) are sorted by ``r``; among elements of equal ``r`` only the first in the
    order (largest ``d``, then smallest index) can exceed the running maximum, which
    equals the running maximum over all elements, and a NaN ``d`` (sorted last among
    equal ``r``) makes it NaN: no later element is on the front.

    ``r``, its ordered key and its bucket are recomputed where they are read instead of
    held in arrays of the run's size: a large run's record then holds three arrays fewer
    at its peak (memory the allocator faults in again on every run).
    """
    n = r_in.size
    one = np.empty(1)
    one_bits = one.view(np.int64)
    kmin = np.int64(0)
    kmax = np.int64(0)
    for i in range(n):
        k = _front_key(_front_r(r_in[i]), one, one_bits)
        if i == 0 or k < kmin:
            kmin = k
        if i == 0 or k > kmax:
            kmax = k
    nb = 1
    while nb < n and nb < 4096:
        nb *= 2
    span = np.uint64(kmax - kmin)
    shift = np.uint64(0)
    while (span >> shift) >= np.uint64(nb):
        shift += np.uint64(1)
    bmax = np.full(nb, -np.inf)
    for i in range(n):
        bb = np.int64(np.uint64(_front_key(_front_r(r_in[i]), one, one_bits) - kmin) >> shift)
        if d[i] > bmax[bb]:
            bmax[bb] = d[i]
    before = np.empty(nb)  # largest d of the earlier buckets
    run = -np.inf
    for bb in range(nb):
        before[bb] = run
        if bmax[bb] > run:
            run = bmax[bb]
    cand = np.empty(n, dtype=np.int64)  # only the first nc slots are written (and their pages touched)
    cbk = np.empty(n, dtype=np.int64)  # each candidate's bucket
    nc = 0
    for i in range(n):
        di = d[i]
        bb = np.int64(np.uint64(_front_key(_front_r(r_in[i]), one, one_bits) - kmin) >> shift)
        if di != di or di > before[bb]:
            cand[nc] = i
            cbk[nc] = bb
            nc += 1
    cand = cand[:nc]
    if nc <= 256:
        rc = np.empty(nc)
        for t in range(nc):
            rc[t] = _front_r(r_in[cand[t]])
        order = cand[np.argsort(rc)]
    else:  # a long front: the candidates by bucket (buckets are ordered like r), each bucket sorted
        start = np.zeros(nb + 1, dtype=np.int64)
        for t in range(nc):
            start[cbk[t] + 1] += 1
        for bb in range(nb):
            start[bb + 1] += start[bb]
        fill = start[:nb].copy()
        order = np.empty(nc, dtype=np.int64)
        for t in range(nc):
            bb = cbk[t]
            order[fill[bb]] = cand[t]
            fill[bb] += 1
        for bb in range(nb):
            lo = start[bb]
            hi = start[bb + 1]
            if hi - lo > 16:
                seg = order[lo:hi].copy()
                rs = np.empty(hi - lo)
                for t in range(hi - lo):
                    rs[t] = _front_r(r_in[seg[t]])
                srt = np.argsort(rs)
                for t in range(hi - lo):
                    order[lo + t] = seg[srt[t]]
            else:  # insertion sort by r
                for t in range(lo + 1, hi):
                    k = order[t]
                    rk = _front_r(r_in[k])
                    u = t - 1
                    while u >= lo and _front_r(r_in[order[u]]) > rk:
                        order[u + 1] = order[u]
                        u -= 1
                    order[u + 1] = k
    keep = np.empty(nc, dtype=np.int64)
    m = 0
    prev = -np.inf
    stopped = False
    i = 0
    while i < nc:
        ri = _front_r(r_in[order[i]])
        best = -1
        bestd = 0.0
        has_nan = False
        j = i
        while j < nc and _front_r(r_in[order[j]]) == ri:
            k = order[j]
            dk = d[k]
            if dk != dk:
                has_nan = True
            elif best < 0 or dk > bestd or (dk == bestd and k < best):
                best = k
                bestd = dk
            j += 1
        if best >= 0 and not stopped and bestd > prev:
            keep[m] = best
            m += 1
            prev = bestd
        if has_nan:
            stopped = True
        i = j
    out = keep[:m].copy()
    out.sort()
    return out


@numba.njit(cache=True, nogil=True)
def _hull_chain(r: np.ndarray, d: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """Monotone-chain upper hull of points sorted by r (ties: larger d first)."""
    n = r.size
    out = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        while m >= 2:
            a = out[m - 2]
            b = out[m - 1]
            cross = (r[b] - r[a]) * (d[i] - d[a]) - (d[b] - d[a]) * (r[i] - r[a])
            if cross >= 0.0:  # b is not strictly above the chord a-i: drop it
                m -= 1
            else:
                break
        out[m] = i
        m += 1
    return out[:m]


def upper_hull(front: np.ndarray, abs_err: np.ndarray, ref_abs: np.ndarray) -> np.ndarray:
    """Elements of a Pareto front on the upper convex hull of its ``(|ref|, |d|)`` points.

    For ``lam >= 0`` the maximum of ``|d| / (lam + |ref|)`` over the run -- the score of
    every scale model affine in ``|ref|`` within a run (allclose, size-aware, normalised
    with run-level covariates) -- is attained at a tangent point from ``(-lam, 0)``,
    which is a vertex of this hull. Non-finite points are always kept.
    """
    r = ref_abs[front]
    d = abs_err[front]
    finite = np.isfinite(r) & np.isfinite(d)
    fr = front[finite]
    order = np.lexsort((-d[finite], r[finite]))
    fr = fr[order]
    chain = _hull_chain(ref_abs[fr].astype(np.float64), abs_err[fr].astype(np.float64))
    return np.sort(np.concatenate([fr[chain], front[~finite]]))


def _label_value(name: Any, v: Any) -> str:
    if isinstance(v, (str, int, float, bool, np.generic)):
        return str(v)
    if isinstance(v, (tuple, list)):
        return "x".join(str(x) for x in v)
    raise TypeError(f"label {name!r} must be a string or number, got {type(v).__name__}")


def _sample_counts(records: Sequence[RunRecord], k: int) -> dict[str, xr.Variable]:
    """``n_sample`` and, where every record knows it, ``n_fit`` of the records."""
    n_sample = np.array([len(r.samples["sample_abs"]) for r in records], dtype=np.int64)
    if (n_sample > k).any():
        raise ValueError(f"a run has more samples ({n_sample.max()}) than sample_size={k}")
    out = {"n_sample": xr.Variable("run", n_sample, {"long_name": "valid samples in the row"})}
    if all(r.n_fit is not None for r in records):
        out[FIT_SAMPLE] = xr.Variable("run", np.array([r.n_fit for r in records], dtype=np.int64),
                                      dict(FIT_SAMPLE_ATTRS))
    return out


def build_dataset(
    records: Sequence[RunRecord],
    *,
    sample_size: int | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Assemble run records into an error dataset (see ``docs/schema.md``).

    Raises
    ------
    ValueError
        No records, or records whose label / covariate names differ.
    """
    if len(records) == 0:
        raise ValueError("no runs: an error dataset needs at least one run")
    label_keys = list(records[0].labels)
    cov_keys = list(records[0].covariates)
    for i, r in enumerate(records):
        if set(r.labels) != set(label_keys):
            raise ValueError(
                f"run {i} has labels {sorted(r.labels)} but run 0 has {sorted(label_keys)}: "
                "every run of a dataset needs the same label names"
            )
        if set(r.covariates) != set(cov_keys):
            raise ValueError(
                f"run {i} has covariates {sorted(r.covariates)} but run 0 has "
                f"{sorted(cov_keys)}: every run needs the same covariates"
            )
    longest = max(max(len(r.samples["sample_abs"]) for r in records), 1)
    k = longest if sample_size is None else min(int(sample_size), longest)
    nrun = len(records)
    coords: dict[str, Any] = {
        "op": ("run", np.array([r.op for r in records], dtype=str)),
        "dtype": ("run", np.array([r.dtype for r in records], dtype=str)),
        "hardware": ("run", np.array([r.hardware for r in records], dtype=str)),
        "platform": ("run", np.array([r.platform for r in records], dtype=str)),
        "shape": ("run", np.array([r.shape for r in records], dtype=str)),
        "seed": ("run", np.array([r.seed for r in records], dtype=np.int64)),
        "run_index": ("run", np.array([r.run_index for r in records], dtype=np.int64)),
        "quantile": ("quantile", np.array(QUANTILES)),
    }
    for key in label_keys:
        coords[key] = ("run", np.array([r.labels[key] for r in records], dtype=str))
    data: dict[str, Any] = {}
    for name, (dt, long_name, units) in RUN_STATS.items():
        data[name] = xr.Variable(
            "run",
            np.array([r.stats[name] for r in records], dtype=dt),
            {"long_name": long_name, "units": units},
        )
    data["abs_quantile"] = xr.Variable(
        ("run", "quantile"),
        np.stack([r.quantiles for r in records]),
        {"long_name": "abs-error quantiles of the run (numpy 'linear')", "units": "output units"},
    )
    data.update(_covariate_vars(records, cov_keys))
    data.update(_op_stat_vars(records))
    if all(r.ref_fingerprint is not None for r in records):
        data[FINGERPRINT] = xr.Variable("run", np.array([r.ref_fingerprint for r in records], dtype=np.int64),
                                        FINGERPRINT_ATTRS)
    data.update(_sample_counts(records, k))
    for name, (long_name, units) in SAMPLE_VARS.items():
        arr = np.full((nrun, k), np.nan)
        for i, r in enumerate(records):
            v = r.samples[name]
            arr[i, : len(v)] = v
        data[name] = xr.Variable(("run", "sample"), arr, {"long_name": long_name, "units": units})
    prov = {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tolstat_version": __version__,
    }
    prov.update(dict(provenance or {}))
    attrs = {
        "tolstat_schema": SCHEMA_VERSION,
        "tolstat_version": __version__,
        "reference_dtype": "float64",
        "labels": ",".join(label_keys),
        "covariates": ",".join(list(BUILTIN_COVARIATES) + cov_keys),
        "sample_size": int(sample_size or k),
        "metrics": METRIC_DEFINITIONS,
        "provenance": json.dumps([prov]),
    }
    return xr.Dataset(data, coords=coords, attrs=attrs)


def _covariate_vars(records: Sequence[RunRecord], cov_keys: Sequence[str]) -> dict[str, xr.Variable]:
    """The user covariates of the runs as per-run variables."""
    return {
        key: xr.Variable("run", np.array([r.covariates[key] for r in records], dtype=np.float64),
                         {"long_name": f"user covariate {key}", "role": "covariate"})
        for key in cov_keys
    }


#: how a run's operator magnitude was obtained: derived by :mod:`tolstat.ops` from the op's
#: arguments, given by the caller (an array or a callable), or ``|expected|`` (``"ref"``)
MAGNITUDE_SOURCES = ("ops", "given", "ref")


def magnitude_convention(sources: Sequence[str | None]) -> str:
    """The convention of a set of runs' magnitudes, as stored in the ``magnitude`` attribute
    of the operator statistics: the sorted distinct sources joined by ``+`` (``"given+ops"``),
    ``"unknown"`` for runs recorded before it was stored."""
    got = sorted({s if s in MAGNITUDE_SOURCES else "unknown" for s in sources})
    return "+".join(got) if got else "unknown"


def _op_stat_vars(records: Sequence[RunRecord]) -> dict[str, xr.Variable]:
    """The optional per-run operator-noise statistics (all runs or none)."""
    keys = list(records[0].op_stats)
    rows = records[0].op_rowwise
    for i, r in enumerate(records):
        if list(r.op_stats) != keys:
            raise ValueError(
                f"run {i} has operator statistics {sorted(r.op_stats)} but run 0 has "
                f"{sorted(keys)}: give a magnitude for every run or for none (inputs give one)"
            )
        if r.op_rowwise is not None and rows is not None and r.op_rowwise != rows:
            raise ValueError(f"run {i} has row-wise operator statistics rowwise={r.op_rowwise} but run 0 has "
                             f"rowwise={rows}: every run of a dataset must agree")
    from tolstat.measure.noise import MID_SUFFIX, STATISTICS

    convention = magnitude_convention([r.op_magnitude for r in records])

    def long_name(k: str) -> str:
        base = k.removesuffix(MID_SUFFIX)
        text = STATISTICS.get(base, f"operator invariant {base}")
        return text + (" (noise model with the intermediate-store term)" if base != k else "")

    return {
        k: xr.Variable("run", np.array([r.op_stats[k] for r in records], dtype=np.float64),
                       {"long_name": long_name(k),
                        "units": "rounding-noise units", "role": "op_statistic", "magnitude": convention})
        for k in keys
    }
