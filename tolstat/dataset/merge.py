"""Merge error datasets from different sources: calibration data and CI records.

:func:`tolstat.concat` joins datasets with the same label and covariate names. Records
written by the pytest plugin (``--tolstat-record``) carry a ``test`` label and the
covariates each check passed, while calibration data from :func:`tolstat.collect`
carries the labels and covariates of its input generator. :func:`merge_records`
reconciles them:

* **labels**: the union; a run without a label gets :data:`LABEL_FILL` (the empty
  string ``""``), so grouping by that label puts such runs together;
* **covariates**: the union; a run without a covariate gets ``NaN``. A noise-scale form
  that uses a covariate (``size_aware``'s size covariate, ``normalised``'s linear and
  power covariates, ``baseline``'s baseline) can only be calibrated on runs where it is
  known: :func:`tolstat.select` raises a ``ValueError`` otherwise (a power covariate
  must be > 0 in every run; a NaN linear covariate gives NaN calibration scores, which
  are refused); :func:`runs_with` keeps the runs that have given covariates. Forms that use no user
  covariate (``None``, ``"allclose"``, and ``normalised`` with only the built-in
  ``ref_rms``/``n_elements``) use every run;
* **repeated runs**: a CI suite with fixed seeds records the same errors on every run.
  Each run gets a content hash (:func:`run_hashes`: op, dtype, hardware, shape, seed,
  labels, covariates, run statistics, quantiles and the element sample; not the
  platform string or the run index) and, with ``dedupe=True``, only the first run of
  each hash is kept, so a repeated record is not counted as a new calibration run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable, Sequence

import numpy as np
import xarray as xr

from tolstat.dataset.schema import BUILTIN_COVARIATES, RUN_STATS, SAMPLE_VARS, concat, covariate_names, label_names, validate

__all__ = ["LABEL_FILL", "merge_records", "run_hashes", "runs_with"]

#: value of a label a run does not have (after :func:`merge_records`)
LABEL_FILL = ""


def run_hashes(ds: xr.Dataset) -> np.ndarray:
    """A content hash (hex string) per run; equal for repeated identical records.

    Covers op, dtype, hardware, shape, seed, the labels and covariates (by name), the
    run statistics, the quantiles and the valid part of the element sample; not
    ``platform`` (library versions) or ``run_index`` (order in a session).
    """
    ds = validate(ds)
    n = ds.sizes["run"]
    labels = ["op", "dtype", "hardware", "shape", *sorted(label_names(ds))]
    covs = sorted(set(covariate_names(ds)) - set(BUILTIN_COVARIATES))
    lab = {k: np.asarray(ds[k].values).astype(str) for k in labels}
    seed = np.asarray(ds["seed"].values, dtype=np.int64)
    num = np.column_stack([np.asarray(ds[k].values, dtype=np.float64) for k in (*RUN_STATS, *covs)]
                          + [np.asarray(ds["abs_quantile"].values, dtype=np.float64)])
    ns = np.asarray(ds["n_sample"].values, dtype=np.int64)
    samples = [np.asarray(ds[k].values, dtype=np.float64) for k in SAMPLE_VARS]
    out = np.empty(n, dtype=object)
    for i in range(n):
        h = hashlib.blake2b(digest_size=16)
        h.update(json.dumps([[k, lab[k][i]] for k in labels] + [covs, int(seed[i])]).encode())
        h.update(np.ascontiguousarray(num[i]).tobytes())
        for s in samples:
            h.update(np.ascontiguousarray(s[i, : ns[i]]).tobytes())
        out[i] = h.hexdigest()
    return out.astype(str)


def _reconcile(ds: xr.Dataset, labels: Sequence[str], covs: Sequence[str], fill: str) -> xr.Dataset:
    n = ds.sizes["run"]
    have_l, have_c = set(label_names(ds)), set(covariate_names(ds))
    new = {}
    for k in labels:
        if k not in have_l:
            if k in ds.variables:
                raise ValueError(f"{k!r} is a label of one dataset and a variable of another")
            new[k] = ("run", np.full(n, fill, dtype=str))
    ds = ds.assign_coords(new) if new else ds
    for k in covs:
        if k not in have_c:
            if k in ds.variables:
                raise ValueError(f"{k!r} is a covariate of one dataset and a label/variable of another")
            ds = ds.assign({k: xr.Variable("run", np.full(n, np.nan),
                                           {"long_name": f"user covariate {k}", "role": "covariate"})})
    ds = ds.copy()
    ds.attrs["labels"] = ",".join(labels)
    ds.attrs["covariates"] = ",".join(list(BUILTIN_COVARIATES) + list(covs))
    return ds


def merge_records(datasets: Iterable[xr.Dataset], *, label_fill: str = LABEL_FILL,
                  dedupe: bool = True) -> xr.Dataset:
    """Concatenate error datasets whose labels and covariates differ (module docstring).

    Parameters
    ----------
    datasets : iterable of xarray.Dataset
        Error datasets (calibration data, CI records, ...), in order of preference
        (the first run of a repeated record is kept).
    label_fill : str, default ""
        Value of a label a run does not have.
    dedupe : bool, default True
        Drop runs whose content hash (:func:`run_hashes`) was already seen.

    Returns
    -------
    xarray.Dataset
        A valid error dataset; its provenance gains an entry
        ``{"created_by": "tolstat.dataset.merge_records", "runs_in": ..., "duplicates_dropped": ...}``.

    Raises
    ------
    ValueError
        No dataset, an invalid dataset, or a name that is a label in one dataset and a
        covariate in another.
    """
    if not isinstance(label_fill, str):
        raise TypeError(f"label_fill must be a string, got {type(label_fill).__name__}")
    dss = [validate(d) for d in datasets]
    if not dss:
        raise ValueError("merge_records needs at least one dataset")
    labels = list(dict.fromkeys(k for d in dss for k in label_names(d)))
    covs = list(dict.fromkeys(k for d in dss for k in covariate_names(d) if k not in BUILTIN_COVARIATES))
    clash = set(labels) & set(covs)
    if clash:
        raise ValueError(f"names used as a label in one dataset and a covariate in another: {sorted(clash)}")
    out = concat([_reconcile(d, labels, covs, label_fill) for d in dss])
    n_in = out.sizes["run"]
    dropped = 0
    if dedupe:
        h = run_hashes(out)
        _, first = np.unique(h, return_index=True)
        keep = np.sort(first)
        dropped = n_in - keep.size
        if dropped:
            out = out.isel(run=keep)
    prov = json.loads(out.attrs.get("provenance", "[]"))
    prov.append({"created_by": "tolstat.dataset.merge_records", "runs_in": int(n_in), "duplicates_dropped": int(dropped),
                 "label_fill": label_fill})
    out.attrs["provenance"] = json.dumps(prov)
    return validate(out)


def runs_with(ds: xr.Dataset, *covariates: str) -> xr.Dataset:
    """The runs of ``ds`` where every named covariate is known (not NaN).

    Raises
    ------
    ValueError
        A name that is not a covariate of ``ds``, or no run has them all.
    """
    names = covariate_names(ds)
    ok = np.ones(ds.sizes["run"], dtype=bool)
    for k in covariates:
        if k not in names:
            raise ValueError(f"{k!r} is not a covariate of the dataset (have {names})")
        ok &= np.isfinite(np.asarray(ds[k].values, dtype=np.float64))
    if not ok.any():
        raise ValueError(f"no run has all of the covariates {list(covariates)}")
    return ds.isel(run=np.flatnonzero(ok))
