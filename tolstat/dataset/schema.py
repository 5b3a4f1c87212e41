"""The error dataset: measured error of correct kernel runs as an ``xarray.Dataset``.

Second step of the data flow (metrics -> **error dataset** -> fits -> tables -> checks).
The schema is documented in ``docs/schema.md``; :func:`validate` enforces it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numba
import numpy as np
import xarray as xr

from tolstat._base import validate as _validate
from tolstat._base.util import GROUP_DIMS
from tolstat._version import __version__
from tolstat.measure.metrics import ErrorMetrics
from tolstat.measure.metrics import metric_covariates

__all__ = [
    "SCHEMA_VERSION",
    "QUANTILES",
    "DEFAULT_SAMPLE_SIZE",
    "RunRecord",
    "summarize_run",
    "build_dataset",
    "validate",
    "concat",
    "indexed",
    "label_names",
    "covariate_names",
    "GROUP_DIMS",
    "DuplicateRunsWarning",
    "duplicate_runs",
    "drop_duplicate_runs",
    "FINGERPRINT",
    "reference_fingerprint",
    "run_units",
    "RunUnits",
]

SCHEMA_VERSION = 1
QUANTILES = (0.5, 0.9, 0.99, 0.999)
DEFAULT_SAMPLE_SIZE = 4096

#: labels every dataset has, in this order
SYSTEM_LABELS = ("op", "dtype", "hardware", "platform", "shape", "seed", "run_index")
#: run-level statistics: name -> (dtype, long name, units)
RUN_STATS: dict[str, tuple[str, str, str]] = {
    "n_elements": ("int64", "elements compared", "1"),
    "n_nonfinite": ("int64", "elements with non-finite actual where reference is finite", "1"),
    "n_frontier": ("int64", "elements on the (max |d|, min |expected|) Pareto front", "1"),
    "max_abs": ("float64", "max |actual - expected|", "output units"),
    "max_rel": ("float64", "max |d| / max(|expected|, rel_floor)", "1"),
    "max_ulp": ("float64", "max ULP distance in the target dtype", "ulp"),
    "mean_abs": ("float64", "mean |actual - expected|", "output units"),
    "mean_signed": ("float64", "mean (actual - expected) over finite elements", "output units"),
    "rel_floor": ("float64", "floor of |expected| in the relative error", "output units"),
    "ref_max_abs": ("float64", "max |expected|", "output units"),
    "ref_rms": ("float64", "root mean square of expected", "output units"),
}
BUILTIN_COVARIATES = ("ref_max_abs", "ref_rms", "n_elements")
SAMPLE_VARS: dict[str, tuple[str, str]] = {
    "sample_abs": ("|d| of sampled elements (inf: non-finite actual; NaN: padding)", "output units"),
    "sample_signed": ("d = actual - expected of sampled elements", "output units"),
    "sample_ulp": ("ULP distance of sampled elements", "ulp"),
    "sample_ref": ("|expected| of sampled elements", "output units"),
}
#: optional run variable: a fingerprint of the run's float64 reference (equal references,
#: equal fingerprints: runs of the same inputs), see :func:`reference_fingerprint`
FINGERPRINT = "ref_fingerprint"
RESERVED = set(SYSTEM_LABELS) | set(RUN_STATS) | set(SAMPLE_VARS) | {
    "n_sample", "abs_quantile", "quantile", "run", "sample", FINGERPRINT,
}

METRIC_DEFINITIONS = (
    "signed error d = actual - expected (float64); abs error |d|; "
    "relative error |d| / max(|expected|, rel_floor), rel_floor default = smallest normal "
    "of the target dtype; ULP distance = distance on the ordered integer line of the "
    "target dtype after rounding expected to it (nearest even; a finite reference that overflows the format is at infinite distance), "
    "-0 == +0; NaN/Inf actual where expected is finite = infinite error (n_nonfinite)."
)
from tolstat._base import numba_cache as _numba_cache

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
    #: :func:`reference_fingerprint` of the run's reference; optional
    ref_fingerprint: int | None = None


def _fmt_shape(shape: Sequence[int]) -> str:
    return "x".join(str(int(s)) for s in shape) if len(shape) else "scalar"


def _run_stats(metrics: ErrorMetrics) -> tuple[dict[str, Any], np.ndarray]:
    """The run-level statistics of one run and its error quantiles (:data:`QUANTILES`)."""
    abs_e = metrics.abs
    nf = metrics.n_nonfinite
    finite = ~metrics.nonfinite
    with np.errstate(invalid="ignore", over="ignore"):
        mean_abs = float(abs_e.mean()) if nf == 0 else float("inf")
        sig = metrics.signed[finite & np.isfinite(metrics.signed)]
        mean_signed = float(sig.mean()) if sig.size else 0.0
        cov = metric_covariates(metrics)
        q = _quantile_linear(abs_e, _QUANTILES) if nf == 0 else np.quantile(
            np.where(metrics.nonfinite, np.inf, abs_e), QUANTILES, method="higher"
        )
    stats = {
        "n_elements": metrics.n_elements,
        "n_frontier": 0,
        "n_nonfinite": nf,
        "max_abs": float(abs_e.max()),
        "max_rel": float(metrics.rel.max()),
        "max_ulp": float(metrics.ulp.max()),
        "mean_abs": mean_abs,
        "mean_signed": mean_signed,
        "rel_floor": metrics.rel_floor,
        "ref_max_abs": cov["ref_max_abs"],
        "ref_rms": cov["ref_rms"],
    }
    return stats, q


_QUANTILES = np.asarray(QUANTILES, dtype=np.float64)


def _quantile_linear(a: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """``np.quantile(a, qs)`` (method "linear") for a 1-D float64 ``a``: numpy's own steps
    (the same partition, indices and interpolation) without its per-call overhead."""
    n = a.size
    if n == 0 or a.dtype != np.float64 or a.ndim != 1:
        return np.quantile(a, qs)
    prev, nxt, kth, t, upper = _linear_positions(n, tuple(float(q) for q in qs))
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
    out = (prev, nxt, np.unique(np.hstack((prev, nxt))), t, t >= 0.5)
    for x in out:
        x.flags.writeable = False
    return out


def _sample_indices(metrics: ErrorMetrics, sample_size: int,
                    rng: np.random.Generator | None) -> tuple[np.ndarray, int]:
    """Indices of the element sample (front or hull first, then uniform) and the front length."""
    n = metrics.n_elements
    abs_e = metrics.abs
    if n <= sample_size:
        return np.arange(n), int(pareto_frontier(abs_e, metrics.ref_abs).size)
    rng = np.random.default_rng() if rng is None else rng
    front = pareto_frontier(abs_e, metrics.ref_abs)
    keep = front
    if front.size > sample_size // 2:
        # a long front (error ~ proportional to |ref|): keep its upper convex hull,
        # which holds the run maximum of every score |d| / (a + b*|ref|), then the
        # largest-|d| rest of the front
        hull = upper_hull(front, abs_e, metrics.ref_abs)
        # a hull longer than the sample is cut: largest errors first, so the sample
        # always holds the run's largest error (the run's max_abs)
        hull = hull[np.argsort(-abs_e[hull], kind="stable")]
        rest = np.setdiff1d(front, hull, assume_unique=True)
        rest = rest[np.argsort(-abs_e[rest], kind="stable")]
        keep = np.concatenate([hull, rest])[: max(sample_size // 2, min(hull.size, sample_size))]
    rest = rng.choice(n - keep.size, size=sample_size - keep.size, replace=False)
    # map draws from the complement of `keep` back to element indices
    ks = np.sort(keep)
    rest = rest + np.searchsorted(ks - np.arange(ks.size), rest, side="right")
    return np.sort(np.concatenate([keep, rest])), int(front.size)


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

    The element sample is a uniform random sample without replacement of
    ``sample_size`` elements (all of them when the run is smaller) that always contains
    the element with the largest absolute error.
    """
    if sample_size < 1:
        raise ValueError(f"sample_size must be >= 1, got {sample_size}")
    stats, q = _run_stats(metrics)
    idx, n_front = _sample_indices(metrics, sample_size, rng)
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
    )


def pareto_frontier(abs_err: np.ndarray, ref_abs: np.ndarray) -> np.ndarray:
    """Indices of the elements on the (largest |d|, smallest |expected|) Pareto front.

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
    r = np.asarray(ref_abs, dtype=np.float64).ravel()
    r = np.where(np.isnan(r), np.inf, r) + 0.0  # + 0.0: -0.0 becomes +0.0 (they tie)
    return _front_kernel(np.asarray(abs_err, dtype=np.float64).ravel(), r)


@numba.njit(cache=True)
def _front_kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """Sorted indices of the Pareto front (see :func:`pareto_frontier`); ``r`` has no NaN
    and no -0.0.

    The elements are bucketed by ``r`` (buckets ordered like ``r``); an element whose
    ``d`` is at most the largest ``d`` of an earlier bucket follows an element with a
    larger-or-equal ``d`` and is not on the front. The remaining candidates (and every
    NaN ``d``) are sorted by ``r``; among elements of equal ``r`` only the first in the
    order (largest ``d``, then smallest index) can exceed the running maximum, which
    equals the running maximum over all elements, and a NaN ``d`` (sorted last among
    equal ``r``) makes it NaN: no later element is on the front.
    """
    n = r.size
    keys = np.empty(n, dtype=np.int64)
    kmin = np.int64(0)
    kmax = np.int64(0)
    for i in range(n):
        b = np.int64(r.view(np.int64)[i])
        k = b ^ ((b >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))  # ordered like the floats
        keys[i] = k
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
    bucket = np.empty(n, dtype=np.int64)
    bmax = np.full(nb, -np.inf)
    for i in range(n):
        bb = np.int64(np.uint64(keys[i] - kmin) >> shift)
        bucket[i] = bb
        if d[i] > bmax[bb]:
            bmax[bb] = d[i]
    before = np.empty(nb)  # largest d of the earlier buckets
    run = -np.inf
    for bb in range(nb):
        before[bb] = run
        if bmax[bb] > run:
            run = bmax[bb]
    cand = np.empty(n, dtype=np.int64)
    nc = 0
    for i in range(n):
        di = d[i]
        if di != di or di > before[bucket[i]]:
            cand[nc] = i
            nc += 1
    cand = cand[:nc]
    rc = np.empty(nc)
    for t in range(nc):
        rc[t] = r[cand[t]]
    order = cand[np.argsort(rc)]
    keep = np.empty(nc, dtype=np.int64)
    m = 0
    prev = -np.inf
    stopped = False
    i = 0
    while i < nc:
        ri = r[order[i]]
        best = -1
        bestd = 0.0
        has_nan = False
        j = i
        while j < nc and r[order[j]] == ri:
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


@numba.njit(cache=True)
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
    """Elements of a Pareto front on the upper convex hull of its (|ref|, |d|) points.

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
    n_sample = np.array([len(r.samples["sample_abs"]) for r in records], dtype=np.int64)
    if (n_sample > k).any():
        raise ValueError(f"a run has more samples ({n_sample.max()}) than sample_size={k}")
    data["n_sample"] = xr.Variable("run", n_sample, {"long_name": "valid samples in the row"})
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


def _op_stat_vars(records: Sequence[RunRecord]) -> dict[str, xr.Variable]:
    """The optional per-run operator-noise statistics (all runs or none)."""
    keys = list(records[0].op_stats)
    for i, r in enumerate(records):
        if list(r.op_stats) != keys:
            raise ValueError(
                f"run {i} has operator statistics {sorted(r.op_stats)} but run 0 has "
                f"{sorted(keys)}: give a magnitude for every run or for none"
            )
    from tolstat.measure.noise import MID_SUFFIX, STATISTICS

    def long_name(k: str) -> str:
        base = k.removesuffix(MID_SUFFIX)
        text = STATISTICS.get(base, f"operator invariant {base}")
        return text + (" (noise model with the intermediate-store term)" if base != k else "")

    return {
        k: xr.Variable("run", np.array([r.op_stats[k] for r in records], dtype=np.float64),
                       {"long_name": long_name(k),
                        "units": "rounding-noise units", "role": "op_statistic"})
        for k in keys
    }


FINGERPRINT_ATTRS = {"long_name": "fingerprint of the float64 reference (shape and bytes; equal: same inputs)",
                     "role": "fingerprint"}


def _unknown_fingerprints(part: int, n: int) -> np.ndarray:
    """Distinct fingerprints for ``n`` runs whose reference was not fingerprinted (one unit each)."""
    out = np.empty(n, dtype=np.int64)
    for j in range(n):
        h = hashlib.blake2b(f"no reference fingerprint: part {part}, run {j}".encode(), digest_size=8)
        out[j] = int.from_bytes(h.digest(), "little", signed=True)
    return out


def reference_fingerprint(expected: Any) -> int:
    """A 64-bit fingerprint of a reference: its shape and its float64 bytes (blake2b).

    Two runs with the same fingerprint have (up to a 2**-64 collision) identical float64
    references: the same inputs, or inputs the reference cannot tell apart, which for a
    check is the same thing. ``-0.0`` and ``0.0`` are one value.
    """
    e = np.ascontiguousarray(np.asarray(expected, dtype=np.float64)) + 0.0
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(tuple(int(x) for x in e.shape)).encode())
    h.update(e.tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


@dataclass(frozen=True)
class RunUnits:
    """Independent units of the runs of an error dataset (:func:`run_units`).

    Attributes
    ----------
    ids : numpy.ndarray of int64
        Per run, the index of the first run of its unit (runs of one unit share it).
    n_runs, n_units : int
    by : str
        What joined runs into units (``"none"`` when every run is its own unit).
    """

    ids: np.ndarray
    n_runs: int
    n_units: int
    by: str

    @property
    def collapsed(self) -> bool:
        """True when some unit holds more than one run."""
        return self.n_units < self.n_runs


def run_units(ds: xr.Dataset, cluster: str | None = None, groups: np.ndarray | None = None) -> RunUnits:
    """The independent units of an error dataset's runs, defined once for every path.

    Runs are one unit when they share a declared ``cluster`` label, or a reference
    fingerprint (:data:`FINGERPRINT`, stored at collection): the same inputs through
    several correct variants, a parametrised test that reuses a seed, and exact duplicate
    runs are not independent draws. Both relations join (connected components), within
    each of ``groups`` (integer codes per run; default one group).

    Raises
    ------
    ValueError
        ``cluster`` is not a run label of ``ds``.
    """
    n = int(ds.sizes["run"])
    keys, by = [], []
    if cluster is not None:
        if cluster not in ds.variables or ds[cluster].dims != ("run",):
            raise ValueError(f"cluster={cluster!r} is not a run label of the error dataset; labels are "
                             f"{label_names(ds)}")
        keys.append(np.asarray(ds[cluster].values).astype(str))
        by.append(f"cluster {cluster!r}")
    if FINGERPRINT in ds:
        keys.append(np.asarray(ds[FINGERPRINT].values, dtype=np.int64))
        by.append("reference fingerprint")
    if not keys or n < 2:
        return RunUnits(np.arange(n, dtype=np.int64), n, n, "none")
    g = np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rows, cols, off = [], [], n
    for k in keys:
        _, code = np.unique(np.rec.fromarrays([g, k]), return_inverse=True)
        rows.append(np.arange(n))
        cols.append(off + code.ravel())
        off += int(code.max()) + 1
    r, c = np.concatenate(rows), np.concatenate(cols)
    adj = coo_matrix((np.ones(r.size, dtype=np.int8), (r, c)), shape=(off, off))
    _, comp = connected_components(adj, directed=False)
    first = np.full(int(comp.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, comp[:n], np.arange(n, dtype=np.int64))
    ids = first[comp[:n]]
    return RunUnits(ids, n, int(np.unique(ids).size), " and ".join(by))


def label_names(ds: xr.Dataset) -> list[str]:
    """Free-form label names of a dataset (besides op, dtype, hardware, ...)."""
    s = ds.attrs.get("labels", "")
    return [x for x in str(s).split(",") if x]


def covariate_names(ds: xr.Dataset) -> list[str]:
    """Covariate names of a dataset, built-in ones first."""
    s = ds.attrs.get("covariates", "")
    return [x for x in str(s).split(",") if x]


def _fail(msg: str, source: str | None) -> None:
    where = f" ({source})" if source else ""
    raise ValueError(f"invalid error dataset{where}: {msg}")


def validate(ds: Any, *, deep: bool | None = None, source: str | None = None) -> xr.Dataset:
    """Check that ``ds`` is a well-formed error dataset; return it unchanged.

    Parameters
    ----------
    ds : xarray.Dataset
        Candidate error dataset.
    deep : bool, optional
        Also check values (no NaN in statistics, nonnegative errors, sample counts).
        Defaults to True for in-memory data and False for dask-backed data (where the
        check would read everything).
    source : str, optional
        File name or other origin, included in error messages.

    Raises
    ------
    TypeError
        ``ds`` is not an ``xarray.Dataset``.
    ValueError
        Naming the first problem found.
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"expected an xarray.Dataset, got {type(ds).__name__}")
    schema = ds.attrs.get("tolstat_schema")
    if schema is None:
        _fail("missing attribute 'tolstat_schema' (not a tolstat error dataset?)", source)
    try:
        schema_ok = int(schema) == SCHEMA_VERSION and float(schema) == SCHEMA_VERSION
    except (TypeError, ValueError):
        schema_ok = False
    if not schema_ok:
        _fail(f"schema version {schema!r} is not supported (this tolstat reads {SCHEMA_VERSION})", source)
    for dim in ("run", "sample", "quantile"):
        if dim not in ds.dims:
            _fail(f"missing dimension {dim!r}", source)
    if ds.sizes["run"] == 0:
        _fail("no runs", source)
    for name in SYSTEM_LABELS:
        if name not in ds.coords and name not in ds.data_vars:
            _fail(f"missing label {name!r}", source)
        if ds[name].dims != ("run",):
            _fail(f"label {name!r} must have dims ('run',), has {ds[name].dims}", source)
    for name in label_names(ds):
        if name not in ds.variables or ds[name].dims != ("run",):
            _fail(f"label {name!r} listed in attrs['labels'] is missing or not along 'run'", source)
    for name in RUN_STATS:
        if name not in ds.data_vars:
            _fail(f"missing run statistic {name!r}", source)
        if ds[name].dims != ("run",):
            _fail(f"{name!r} must have dims ('run',), has {ds[name].dims}", source)
    for name in covariate_names(ds):
        if name not in ds.variables or ds[name].dims != ("run",):
            _fail(f"covariate {name!r} listed in attrs['covariates'] is missing or not along 'run'", source)
    if "abs_quantile" not in ds or ds["abs_quantile"].dims != ("run", "quantile"):
        _fail("missing or misshaped 'abs_quantile' (run, quantile)", source)
    if "n_sample" not in ds or ds["n_sample"].dims != ("run",):
        _fail("missing or misshaped 'n_sample' (run,)", source)
    for name in SAMPLE_VARS:
        if name not in ds.data_vars:
            _fail(f"missing sample variable {name!r}", source)
        if ds[name].dims != ("run", "sample"):
            _fail(f"{name!r} must have dims ('run', 'sample'), has {ds[name].dims}", source)
    for name in ("op", "dtype", "hardware"):
        if ds[name].dtype.kind not in "UO":
            _fail(f"label {name!r} must hold strings, holds {ds[name].dtype}", source)
    from tolstat._base.dtypes import SUPPORTED_DTYPES

    bad = sorted(set(np.unique(ds["dtype"].values).tolist()) - set(SUPPORTED_DTYPES))
    if bad:
        _fail(f"unknown dtype label(s) {bad}; supported: {list(SUPPORTED_DTYPES)}", source)
    if deep is None:
        deep = ds["sample_abs"].chunks is None
    if deep:
        for name in ("max_abs", "max_rel", "max_ulp", "mean_abs", "mean_signed", "ref_max_abs"):
            v = np.asarray(ds[name].values)
            if np.isnan(v).any():
                _fail(f"{name!r} contains NaN in {int(np.isnan(v).sum())} run(s)", source)
        for name in ("max_abs", "max_rel", "max_ulp", "mean_abs"):
            if (np.asarray(ds[name].values) < 0).any():
                _fail(f"{name!r} has negative values; errors are nonnegative", source)
        ns = np.asarray(ds["n_sample"].values)
        if (ns < 0).any() or (ns > ds.sizes["sample"]).any():
            _fail("'n_sample' out of range [0, sample]", source)
        if (ns > np.asarray(ds["n_elements"].values)).any():
            _fail("'n_sample' exceeds 'n_elements'", source)
        s = np.asarray(ds["sample_abs"].values)
        # in blocks of runs: the temporaries stay small next to the sample (same checks, same order)
        blocks = [slice(i, i + _CHECK_BLOCK) for i in range(0, s.shape[0], _CHECK_BLOCK)]
        if any((s[b] < 0).any() for b in blocks):
            _fail("'sample_abs' has negative values", source)
        cols = np.arange(s.shape[1])[None, :]
        if any(np.isnan(s[b][cols < ns[b, None]]).any() for b in blocks):
            _fail("'sample_abs' has NaN inside the valid samples", source)
        _check_consistent(ds, s, ns, source, blocks)
    return ds


#: rows per block of the deep checks of :func:`validate`
_CHECK_BLOCK = 2048


def _check_consistent(ds: xr.Dataset, s: np.ndarray, ns: np.ndarray, source: str | None,
                      blocks: Sequence[slice] = (slice(None),)) -> None:
    """Cheap tamper checks: the element sample always holds the run's largest error, so
    its maximum must equal ``max_abs`` (and may never exceed it)."""
    mx = np.asarray(ds["max_abs"].values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        if s.shape[1] and s.shape[0]:
            smax = np.concatenate([np.max(np.where(np.isnan(s[b]), -np.inf, s[b]), axis=1) for b in blocks])
        else:
            smax = np.full(mx.shape, -np.inf)
        has = ns > 0
        over = has & (smax > mx * (1 + 1e-12))
        under = has & (smax < mx * (1 - 1e-12)) & np.isfinite(mx)
    if over.any():
        i = int(np.flatnonzero(over)[0])
        _fail(f"run {i}: the largest sampled error {smax[i]!r} exceeds its 'max_abs' {mx[i]!r} "
              f"({int(over.sum())} run(s); edited or mixed-up data?)", source)
    if under.any():
        i = int(np.flatnonzero(under)[0])
        _fail(f"run {i}: 'max_abs' {mx[i]!r} is larger than every sampled error (largest {smax[i]!r}); "
              f"the sample always holds the largest error ({int(under.sum())} run(s); edited data?)", source)


class DuplicateRunsWarning(UserWarning):
    """Exact copies of runs were found in an error dataset and dropped."""


def duplicate_runs(ds: xr.Dataset) -> np.ndarray:
    """Indices of runs that are exact copies of an earlier run of ``ds``.

    A run's record is every run-level variable (labels incl. ``seed`` and
    ``run_index``, run statistics, quantiles, covariates); two distinct measurements
    practically never agree bit for bit in all of them, while a dataset concatenated
    with itself (or a file merged twice) does. The element sample is not compared (the
    record already identifies the run).
    """
    n = ds.sizes["run"]
    cols = {str(name): np.asarray(var.values) for name, var in ds.variables.items()
            if var.dims[:1] == ("run",) and "sample" not in var.dims and name != "run"}
    return _validate.duplicate_rows(cols, n)


def drop_duplicate_runs(ds: xr.Dataset, *, warn: bool = True) -> xr.Dataset:
    """``ds`` without exact duplicate runs (see :func:`duplicate_runs`).

    Calibration counts runs as independent draws: three copies of the same 100 runs
    are 100 runs, not 300 (a threshold "supported" by 300 would promise more than the
    data can). With ``warn`` a :class:`DuplicateRunsWarning` says how many were dropped.
    """
    dup = duplicate_runs(ds)
    if dup.size == 0:
        return ds
    if warn:
        import warnings

        warnings.warn(DuplicateRunsWarning(
            f"{dup.size} of {ds.sizes['run']} runs are exact copies of other runs (same labels, seed, "
            f"run_index and statistics; first: run {int(dup[0])}); they are dropped, calibrating on "
            f"{ds.sizes['run'] - dup.size} distinct runs"), stacklevel=3)
    keep = np.setdiff1d(np.arange(ds.sizes["run"]), dup)
    return ds.isel(run=keep)


def concat(datasets: Iterable[xr.Dataset]) -> xr.Dataset:
    """Concatenate error datasets from several collections along ``run``.

    Raises
    ------
    ValueError
        When the datasets have different label or covariate names, or none is given.
    """
    dss = [validate(d) for d in datasets]
    if not dss:
        raise ValueError("concat needs at least one dataset")
    labels0, covs0 = label_names(dss[0]), covariate_names(dss[0])
    for i, d in enumerate(dss[1:], start=1):
        if set(label_names(d)) != set(labels0):
            raise ValueError(
                f"dataset {i} has labels {label_names(d)} but dataset 0 has {labels0}: "
                "mismatched labels cannot be concatenated"
            )
        if set(covariate_names(d)) != set(covs0):
            raise ValueError(
                f"dataset {i} has covariates {covariate_names(d)} but dataset 0 has {covs0}"
            )
    k = max(d.sizes["sample"] for d in dss)
    padded = []
    prov: list[Any] = []
    some_fp = any(FINGERPRINT in d for d in dss)
    for i, d in enumerate(dss):
        if some_fp and FINGERPRINT not in d:
            # runs recorded without a fingerprint (older files): each its own unit, as before
            d = d.assign({FINGERPRINT: xr.Variable("run", _unknown_fingerprints(i, d.sizes["run"]),
                                                   FINGERPRINT_ATTRS)})
        if d.sizes["sample"] < k:
            d = d.pad(sample=(0, k - d.sizes["sample"]), constant_values=np.nan)
        padded.append(d.drop_attrs() if hasattr(d, "drop_attrs") else d.assign_attrs({}))
        prov.extend(json.loads(d.attrs.get("provenance", "[]")))
    out = xr.concat(padded, dim="run", data_vars="all", coords="different", compat="equals",
                    join="outer", combine_attrs="drop")
    for name in out.data_vars:  # attrs from the first dataset that has the variable
        first = next((d for d in dss if name in d.data_vars), None)
        if first is not None:
            out[name].attrs = dict(first[name].attrs)
    out.attrs = dict(dss[0].attrs)
    out.attrs["sample_size"] = int(k)
    out.attrs["provenance"] = json.dumps(prov)
    return out


def indexed(ds: xr.Dataset) -> xr.Dataset:
    """Return ``ds`` with a multi-index over (op, dtype, hardware) along ``run``.

    Lets ``indexed(ds).sel(op="matmul", dtype="float16")`` select runs by label; the
    index has a fourth level ``pos`` (position in the dataset) so that any selection
    keeps the ``run`` dimension. :func:`tolstat.save` drops the index again.
    """
    from xarray.indexes import PandasMultiIndex

    ds = ds.assign_coords(pos=("run", np.arange(ds.sizes["run"])))
    return ds.set_xindex([*GROUP_DIMS, "pos"], PandasMultiIndex)
