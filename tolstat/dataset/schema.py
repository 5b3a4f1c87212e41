"""The error dataset: measured error of correct kernel runs as an ``xarray.Dataset``.

Second step of the data flow (metrics -> **error dataset** -> fits -> tables -> checks).
The schema is documented in ``docs/schema.md``: this module holds its constants (labels,
run statistics, sample variables), :func:`validate` that enforces it, the names of a
dataset's labels and covariates, the reference fingerprint and the independent units of
the runs (:func:`run_units`), exact duplicate runs, and :func:`concat` and
:func:`indexed`. Run records and the dataset built from them are in
:mod:`tolstat.dataset.records`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import xarray as xr

from tolstat._base import validate as _validate
from tolstat._base.util import GROUP_DIMS, factorize

__all__ = [
    "SCHEMA_VERSION",
    "QUANTILES",
    "DEFAULT_SAMPLE_SIZE",
    "FIT_SAMPLE_SIZE",
    "FIT_SAMPLE",
    "fit_counts",
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
    "STRING_ENCODING_KEYS",
    "normalize_labels",
]

SCHEMA_VERSION = 1
QUANTILES = (0.5, 0.9, 0.99, 0.999)
#: element-wise errors kept per run by default (every element of a run at most this long)
DEFAULT_SAMPLE_SIZE = 320
#: elements per run of the *fit sample*: a uniform draw without replacement from all of the
#: run's elements (all of them in a run of at most this many), drawn before anything else from
#: the run's generator and stored in the first slots of the element sample. The scale fits of
#: :mod:`tolstat.models.scale` read these slots only, so a dataset keeping every element and
#: one keeping a bounded sample give the same fit, and the fit sees each element at its own
#: rate (never the front over-represented). At most 4/5 of ``sample_size`` when the run is
#: longer than its sample.
FIT_SAMPLE_SIZE = 256

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
#: optional run variable: the first ``n_fit`` slots of the element sample are the run's fit
#: sample (:data:`FIT_SAMPLE_SIZE`); absent in files written before it (read as ``n_sample``:
#: the whole sample, as those files were fitted)
FIT_SAMPLE = "n_fit"
FIT_SAMPLE_ATTRS = {"long_name": "the first n_fit sample slots are a uniform sample of the run's elements "
                                 "(the scale fit's)", "units": "1"}
RESERVED = set(SYSTEM_LABELS) | set(RUN_STATS) | set(SAMPLE_VARS) | {
    "n_sample", "abs_quantile", "quantile", "run", "sample", FINGERPRINT, FIT_SAMPLE,
}

METRIC_DEFINITIONS = (
    "signed error d = actual - expected (float64); abs error |d|; "
    "relative error |d| / max(|expected|, rel_floor), rel_floor default = smallest normal "
    "of the target dtype; ULP distance = distance on the ordered integer line of the "
    "target dtype after rounding expected to it (nearest even; a finite reference that overflows the format is at infinite distance), "
    "-0 == +0; NaN/Inf actual where expected is finite = infinite error (n_nonfinite)."
)

FINGERPRINT_ATTRS = {"long_name": "fingerprint of the float64 reference (shape and bytes; equal: same inputs)",
                     "role": "fingerprint"}


def fit_counts(ds: xr.Dataset) -> np.ndarray:
    """Per run, how many of the first sample slots are the fit sample (:data:`FIT_SAMPLE`):
    ``n_fit``, or ``n_sample`` for a dataset written before it (its fits read the whole sample)."""
    name = FIT_SAMPLE if FIT_SAMPLE in ds else "n_sample"
    return np.asarray(ds[name].values, dtype=np.int64)


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
    e = np.asarray(expected, dtype=np.float64)
    if e.ndim == 0:
        e = e.reshape(1)  # a scalar is hashed as one value of shape (1,)
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(tuple(int(x) for x in e.shape)).encode())
    flat = e.reshape(-1)  # C order (a copy only where e is not C-contiguous)
    # the float64 bytes with -0.0 as 0.0, hashed a block at a time: the digest of their
    # concatenation, without a copy of a large reference
    for start in range(0, flat.size, _FINGERPRINT_BLOCK):
        h.update(flat[start:start + _FINGERPRINT_BLOCK] + 0.0)
    return int.from_bytes(h.digest(), "little", signed=True)


#: values per block of :func:`reference_fingerprint` (64 kB: below the allocator's mmap threshold)
_FINGERPRINT_BLOCK = 8192


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

    Parameters
    ----------
    ds : xarray.Dataset
        An error dataset.
    cluster : str, optional
        A run label of ``ds``: one of :data:`SYSTEM_LABELS` or of the free-form labels
        listed in ``ds.attrs["labels"]`` (:func:`label_names`). Run statistics,
        covariates and other variables are not labels.
    groups : numpy.ndarray of int, optional
        Group code per run; runs of different groups are never one unit.

    Raises
    ------
    ValueError
        ``cluster`` is not a run label of ``ds`` (the message names the value, what it is
        and the labels there are).
    """
    n = int(ds.sizes["run"])
    keys, by = [], []
    if cluster is not None:
        _check_label(ds, cluster, "cluster")
        keys.append(np.asarray(ds[cluster].values).astype(str))
        by.append(f"cluster {cluster!r}")
    if FINGERPRINT in ds:
        keys.append(np.asarray(ds[FINGERPRINT].values, dtype=np.int64))
        by.append("reference fingerprint")
    if not keys or n < 2:
        return RunUnits(np.arange(n, dtype=np.int64), n, n, "none")
    if len(keys) == 1 and keys[0].dtype == np.int64 and n >= 4096:
        from tolstat._base.label_kernels import shared_hashes

        if not shared_hashes(np.ascontiguousarray(keys[0]).view(np.uint64)).any():
            # every fingerprint distinct (a bitmap pass, no table of a million values)
            return RunUnits(np.arange(n, dtype=np.int64), n, n, " and ".join(by))
    coded = [factorize(k, sort=False)[1] for k in keys]  # grouping only: any numbering
    if len(coded) == 1 and int(coded[0].max()) + 1 == n:  # every key distinct: every run its own unit
        return RunUnits(np.arange(n, dtype=np.int64), n, n, " and ".join(by))
    g = np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    # one code per distinct (group, key): the key's code within the grid of both (a unit's id
    # below is its first run, so the numbering of the codes does not matter)
    codes = [factorize(g * (int(kc.max()) + 1) + kc, sort=False)[1].ravel() for kc in coded]
    if len(codes) == 1:  # one relation: a unit is a code (codes 0 .. m-1, no components to join)
        comp, n_units = codes[0], int(codes[0].max()) + 1
    else:  # runs joined by any relation: connected components of runs and (group, key) nodes
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        offs = n + np.cumsum([0] + [int(c.max()) + 1 for c in codes])
        r = np.tile(np.arange(n), len(codes))
        c = np.concatenate([off + code for off, code in zip(offs, codes)])
        adj = coo_matrix((np.ones(r.size, dtype=np.int8), (r, c)), shape=(offs[-1], offs[-1]))
        comp, n_units = connected_components(adj, directed=False)[1][:n], 0
    first = np.full(int(comp.max()) + 1, n, dtype=np.int64)
    np.minimum.at(first, comp, np.arange(n, dtype=np.int64))
    ids = first[comp]
    return RunUnits(ids, n, n_units or int(factorize(ids, sort=False)[0].size), " and ".join(by))


def label_names(ds: xr.Dataset) -> list[str]:
    """Free-form label names of a dataset (besides op, dtype, hardware, ...)."""
    s = ds.attrs.get("labels", "")
    return [x for x in str(s).split(",") if x]


def _check_label(ds: xr.Dataset, name: Any, argument: str) -> None:
    """Raise a ``ValueError`` unless ``name`` is a run label of ``ds`` (system or listed label)."""
    labels = [*SYSTEM_LABELS, *label_names(ds)]
    if isinstance(name, str) and name in labels and name in ds.variables and ds[name].dims == ("run",):
        return
    if not isinstance(name, str) or name not in ds.variables:
        what = "not a variable"
    elif name in covariate_names(ds):
        what = "a covariate"
    elif name in RUN_STATS:
        what = "a run statistic"
    elif name in labels:
        what = f"a label with dims {ds[name].dims}, not ('run',)"
    else:
        what = "a variable"
    raise ValueError(f"{argument}={name!r} is not a run label of the error dataset ({what}); labels are "
                     f"{labels}")


def covariate_names(ds: xr.Dataset) -> list[str]:
    """Covariate names of a dataset, built-in ones first."""
    s = ds.attrs.get("covariates", "")
    return [x for x in str(s).split(",") if x]


#: encoding keys that fix how a string is stored (its width, its type, a fill value): a
#: reader records them (``<U7`` from a file whose longest label had 7 characters, the
#: character dimension of a netCDF char array, a zarr fixed-length dtype); kept, they would
#: cut longer labels on the next write. :func:`normalize_labels` drops them.
STRING_ENCODING_KEYS = ("dtype", "char_dim_name", "_Encoding", "_FillValue", "missing_value",
                        "fill_value", "object_codec", "original_shape")


def _as_text(var: xr.Variable) -> np.ndarray | None:
    """The values of ``var`` as a numpy unicode array wide enough for each, or None for non-text."""
    kind = var.dtype.kind
    if kind == "U":
        return None  # already unicode, as wide as its longest value (dask too: concat promotes)
    if kind not in "SO":
        return None
    v = np.asarray(var.values)
    if kind == "S":
        return np.char.decode(v, "utf-8")
    flat = v.ravel().tolist()
    if not flat or not all(isinstance(x, (str, bytes)) for x in flat):
        return None
    return np.array([x.decode("utf-8") if isinstance(x, bytes) else x for x in flat], dtype=str).reshape(v.shape)


def normalize_labels(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with its string labels stored by the one label encoding rule (``docs/schema.md``).

    Every variable along ``run`` that holds text (the labels ``op``, ``dtype``,
    ``hardware``, ``platform``, ``shape``, the free-form labels and any other string
    variable) becomes a numpy unicode array as wide as its longest value (UTF-8 bytes
    and Python strings are decoded) and loses the encoding keys
    :data:`STRING_ENCODING_KEYS`, so that a writer derives the stored width from the
    values. :func:`concat` (and so :func:`~tolstat.dataset.merge.merge_records`) and
    :func:`tolstat.save` apply it: labels of several files of different widths
    round-trip exactly. Other encodings (chunks, compression) and all other variables
    are kept; ``ds`` itself is not modified.

    Parameters
    ----------
    ds : xarray.Dataset
        An error dataset (or any dataset with a ``run`` dimension).

    Returns
    -------
    xarray.Dataset
    """
    coords: dict[Any, xr.Variable] = {}
    data: dict[Any, xr.Variable] = {}
    for name, var in ds.variables.items():
        if var.dims != ("run",) or name in ds.xindexes:
            continue
        text = _as_text(var)
        if text is None and (var.dtype.kind != "U" or not set(var.encoding) & set(STRING_ENCODING_KEYS)):
            continue  # not text, or unicode with nothing stale
        new = var.copy(deep=False, data=text) if text is not None else var.copy(deep=False)
        new.encoding = {k: v for k, v in var.encoding.items() if k not in STRING_ENCODING_KEYS}
        (coords if name in ds.coords else data)[name] = new
    if coords:
        ds = ds.assign_coords(coords)
    if data:
        ds = ds.assign(data)
    return ds


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
    if "n_sample" not in ds or ds["n_sample"].dims != ("run",) or (FIT_SAMPLE in ds and ds[FIT_SAMPLE].dims != ("run",)):
        _fail(f"missing or misshaped 'n_sample' or {FIT_SAMPLE!r}: dims must be ('run',)", source)
    for name in SAMPLE_VARS:
        if name not in ds.data_vars:
            _fail(f"missing sample variable {name!r}", source)
        if ds[name].dims != ("run", "sample"):
            _fail(f"{name!r} must have dims ('run', 'sample'), has {ds[name].dims}", source)
    for name in ("op", "dtype", "hardware"):
        if ds[name].dtype.kind not in "UO":
            _fail(f"label {name!r} must hold strings, holds {ds[name].dtype}", source)
    from tolstat._base.dtypes import SUPPORTED_DTYPES

    bad = sorted(set(factorize(np.asarray(ds["dtype"].values))[0].tolist()) - set(SUPPORTED_DTYPES))
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
        nf = fit_counts(ds)
        if ((nf < 0) | (nf > ns)).any():
            _fail(f"{FIT_SAMPLE!r} out of range [0, n_sample]", source)
        from tolstat.dataset.sample_kernels import sample_checks

        # one numba pass over the sample: no temporaries the size of the sample
        neg, nan_inside, smax = sample_checks(np.asarray(ds["sample_abs"].values), np.asarray(ns, dtype=np.int64))
        if neg:
            _fail("'sample_abs' has negative values", source)
        if nan_inside:
            _fail("'sample_abs' has NaN inside the valid samples", source)
        _check_consistent(ds, smax, ns, source)
    return ds


def _check_consistent(ds: xr.Dataset, smax: np.ndarray, ns: np.ndarray, source: str | None) -> None:
    """Cheap tamper checks: the element sample always holds the run's largest error, so
    its maximum (``smax``, per run, NaN ignored) must equal ``max_abs`` (and may never
    exceed it)."""
    mx = np.asarray(ds["max_abs"].values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
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

    String labels follow the label encoding rule (:func:`normalize_labels`): each is as
    wide as its longest value in any input, with no stored width kept from the first.

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
    some_fit = any(FIT_SAMPLE in d for d in dss)
    for i, d in enumerate(dss):
        if some_fit and FIT_SAMPLE not in d:
            # runs of a file written before the fit sample: their fits read the whole sample
            d = d.assign({FIT_SAMPLE: xr.Variable("run", np.asarray(d["n_sample"].values, dtype=np.int64),
                                                  FIT_SAMPLE_ATTRS)})
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
    # the first dataset's string encodings (a reader's <U7) would cut longer labels of the others
    out = normalize_labels(out)
    for name in out.data_vars:  # attrs from the first dataset that has the variable
        first = next((d for d in dss if name in d.data_vars), None)
        if first is not None:
            out[name].attrs = dict(first[name].attrs)
            if "magnitude" in first[name].attrs:  # the union of the magnitude conventions (records.py)
                srcs = {x for d in dss if name in d.data_vars
                        for x in str(d[name].attrs.get("magnitude", "unknown")).split("+")}
                out[name].attrs["magnitude"] = "+".join(sorted(srcs))
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
