"""``fit``: apply the estimator kernels per (op, dtype, hardware) group of an error dataset."""

from __future__ import annotations

import json
import math
from typing import Any

import numba
import numpy as np
import xarray as xr
from numba import njit, prange

from .._version import __version__
from ..dataset import GROUP_DIMS
from . import bootstrap as _bs
from . import evt as _evt
from . import orderstat as _os
from . import quantile as _q

__all__ = ["fit", "group_values", "METHODS", "STATISTICS"]

RUN_STATISTICS = ("max_abs", "max_ulp", "max_rel", "mean_abs")
SAMPLE_STATISTICS = ("sample_abs", "sample_ulp", "sample_rel")
STATISTICS = RUN_STATISTICS + SAMPLE_STATISTICS
METHODS = ("empirical", "order_statistic", "conformal", "gpd", "gev", "bootstrap")


@njit(cache=True, parallel=True)
def _count_valid(a):
    out = np.empty(a.shape[0], np.int64)
    for g in prange(a.shape[0]):
        c = 0
        for j in range(a.shape[1]):
            if not np.isnan(a[g, j]):
                c += 1
        out[g] = c
    return out


def _n_valid(arr: np.ndarray) -> np.ndarray:
    a2 = np.ascontiguousarray(arr.reshape(-1, arr.shape[-1]))
    return _count_valid(a2).reshape(arr.shape[:-1])


@njit(cache=True, parallel=True)
def _count_negative(a):
    c = 0
    for i in prange(a.shape[0]):
        if a[i] < 0.0:
            c += 1
    return c


@njit(cache=True, parallel=True)
def _any_inf(a):
    c = 0
    for i in prange(a.shape[0]):
        if np.isinf(a[i]):
            c += 1
    return c > 0


@njit(cache=True, parallel=True)
def _gather_groups(vals, order, starts, grid):
    """grid[g] = the rows ``order[starts[g]:starts[g+1]]`` of ``vals`` back to back, NaN padded."""
    width = vals.shape[1]
    for g in prange(grid.shape[0]):
        n = starts[g + 1] - starts[g]
        row = grid[g]
        for r in range(n):
            src = vals[order[starts[g] + r]]
            off = r * width
            for j in range(width):
                row[off + j] = src[j]
        for j in range(n * width, row.shape[0]):
            row[j] = np.nan


def group_values(errors: xr.Dataset, statistic: str = "max_abs") -> tuple[xr.DataArray, xr.DataArray]:
    """The chosen statistic as a NaN-padded DataArray (op, dtype, hardware, obs).

    Parameters
    ----------
    errors : xarray.Dataset
        An error dataset (docs/schema.md).
    statistic : str
        Run-level (``max_abs``, ``max_ulp``, ``max_rel``, ``mean_abs``: one value per
        run) or element-wise (``sample_abs``, ``sample_ulp``, ``sample_rel`` =
        ``sample_abs / max(sample_ref, rel_floor)``: the run's samples, flattened).

    Returns
    -------
    values : DataArray (op, dtype, hardware, obs)
        float64, NaN padded. Runs of a group that are contiguous and of equal size in
        the dataset are viewed, not copied, when all groups are present.
    present : DataArray of bool (op, dtype, hardware)
        Whether the group has runs in the dataset (absent groups are all NaN).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    for d in GROUP_DIMS:
        if d not in errors.coords and d not in errors:
            raise ValueError(f"error dataset has no {d!r} label along 'run'")
    if "run" not in errors.dims:
        raise ValueError("error dataset has no 'run' dimension")
    if statistic in RUN_STATISTICS:
        if statistic not in errors:
            raise ValueError(f"error dataset has no variable {statistic!r}")
        vals = np.asarray(errors[statistic].values, dtype=np.float64)[:, None]
    else:
        need = ["sample_abs", "sample_ref"] if statistic == "sample_rel" else [statistic]
        for v in need:
            if v not in errors:
                raise ValueError(f"error dataset has no variable {v!r}")
        if statistic == "sample_rel":
            ref = np.asarray(errors["sample_ref"].values, dtype=np.float64)
            if "rel_floor" in errors:
                floor = np.asarray(errors["rel_floor"].values, dtype=np.float64)[:, None]
            else:
                floor = np.float64(np.finfo(np.float64).tiny)
            vals = np.asarray(errors["sample_abs"].values, dtype=np.float64) / np.maximum(ref, floor)
        else:
            vals = np.asarray(errors[statistic].transpose("run", "sample").values, dtype=np.float64)
    if vals.shape[0] and _count_negative(vals.reshape(-1)) > 0:
        raise ValueError(f"{statistic} has negative values; error metrics must be nonnegative")

    labels = [np.asarray(errors[d].values).astype(str) for d in GROUP_DIMS]
    uniq, codes = zip(*(np.unique(lab, return_inverse=True) for lab in labels))
    shape = tuple(len(u) for u in uniq)
    gid = np.ravel_multi_index(codes, shape) if vals.shape[0] else np.zeros(0, np.int64)
    G = int(np.prod(shape))
    counts = np.bincount(gid, minlength=G)
    present = counts > 0
    width = vals.shape[1]
    nobs = int(counts.max()) * width if G else 0
    contiguous = np.all(np.diff(gid) >= 0)
    if present.all() and contiguous and np.all(counts == counts[0]) and vals.flags.c_contiguous:
        grid = vals.reshape(shape + (nobs,))  # a view: no copy
    else:
        grid = np.empty((G, nobs))
        order = np.argsort(gid, kind="stable").astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        _gather_groups(np.ascontiguousarray(vals), order, starts, grid)
        grid = grid.reshape(shape + (nobs,))
    coords = {d: u for d, u in zip(GROUP_DIMS, uniq)}
    da = xr.DataArray(grid, dims=GROUP_DIMS + ("obs",), coords=coords, name=statistic)
    pr = xr.DataArray(present.reshape(shape), dims=GROUP_DIMS, coords=coords, name="present")
    return da, pr


def _flat(fn):
    """Wrap a (groups, obs) kernel for apply_ufunc's (..., obs) blocks."""

    def wrapped(a, *args, **kwargs):
        lead = a.shape[:-1]
        outs = fn(np.ascontiguousarray(a.reshape(-1, a.shape[-1])), *args, **kwargs)
        return tuple(o.reshape(lead + o.shape[1:]) for o in outs)

    return wrapped


def _group_name(present: xr.DataArray, flat_index: int) -> str:
    idx = np.unravel_index(flat_index, present.shape)
    return ", ".join(f"{d}={str(present[d].values[i])!r}" for d, i in zip(GROUP_DIMS, idx))


def fit(errors: xr.Dataset, *, method: str, statistic: str = "max_abs", chunks: dict | None = None,
        **options: Any) -> xr.Dataset:
    """Fit a tolerance estimator per (op, dtype, hardware) group of an error dataset.

    Parameters
    ----------
    errors : xarray.Dataset
        Error dataset (docs/schema.md).
    method : {"empirical", "order_statistic", "conformal", "gpd", "gev", "bootstrap"}
        * ``empirical``: exact quantiles at ``p`` (float or list; ``quantile_method``
          = numpy method, default ``"linear"``).
        * ``order_statistic``: distribution-free upper bound of the ``p``-quantile with
          ``confidence`` (defaults 0.99, 0.95).
        * ``conformal``: split-conformal bound at miscoverage ``alpha`` (default 0.01).
        * ``gpd``: peaks over threshold; return level at exceedance probability ``q``
          (default 1e-6) with ``tail_fraction`` (0.1) and ``min_exceedances`` (30).
        * ``gev``: GEV MLE of the run-level maxima (each observation is a block
          maximum; ``block_size`` > 1 first takes maxima of consecutive blocks); return
          level at block exceedance probability ``q`` (default 0.01).
        * ``bootstrap``: upper bound (``interval`` = ``"bca"`` or ``"percentile"``,
          ``confidence`` 0.95, ``n_resamples`` 1000, ``seed`` 0) of the ``p``-quantile
          (``target="quantile"``, default) or of the GPD return level at ``q``
          (``target="return_level"``, ``resampling`` = ``"parametric"`` or
          ``"nonparametric"``).
    statistic : str
        Which error values to model (see :func:`group_values`).
    chunks : dict, optional
        Chunk sizes along op / dtype / hardware: run the kernels through dask
        (``apply_ufunc(dask="parallelized")``; ``obs`` is always one chunk). The result
        is then lazy (call ``.compute()``). Only for the kernel methods (not bootstrap).
    **options
        Method settings as above.

    Returns
    -------
    xarray.Dataset
        dims op, dtype, hardware (+ ``p`` for ``empirical``); ``threshold`` (the bound),
        method parameters, ``n`` (values per group; 0 for absent groups, whose results
        are NaN). ``attrs``: method, statistic, settings (JSON), tolstat_version.

    Raises
    ------
    ValueError
        Unknown method/option, negative values, a present group with no valid value, a
        group too small for the requested bound (the minimum n is named).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    da, present = group_values(errors, statistic)
    opts = dict(options)
    known = {
        "empirical": {"p": 0.99, "quantile_method": "linear"},
        "order_statistic": {"p": 0.99, "confidence": 0.95},
        "conformal": {"alpha": 0.01},
        "gpd": {"q": 1e-6, "tail_fraction": 0.1, "min_exceedances": 30},
        "gev": {"q": 0.01, "block_size": 1},
        "bootstrap": {"target": "quantile", "p": 0.99, "q": 1e-6, "confidence": 0.95, "n_resamples": 1000,
                      "interval": "bca", "seed": 0, "resampling": "parametric", "tail_fraction": 0.1,
                      "min_exceedances": 30, "quantile_method": "linear"},
    }[method]
    unknown = set(opts) - set(known)
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for method {method!r}; known: {sorted(known)}")
    settings = {**known, **opts}

    if chunks is not None:
        bad = set(chunks) - set(GROUP_DIMS)
        if bad:
            raise ValueError(f"chunk only along {GROUP_DIMS} (never along obs), got {sorted(bad)}")
        da = da.chunk({**chunks, "obs": -1})

    # counts are cheap and needed for validation
    n = _n_valid(np.asarray(da.data if chunks is None else da.values))
    n_da = xr.DataArray(n.astype(np.int64), dims=GROUP_DIMS, coords=present.coords)
    empty = present.values & (n == 0)
    if empty.any():
        raise ValueError(f"group ({_group_name(present, int(np.flatnonzero(empty.ravel())[0]))}) exists "
                         f"but has no valid {statistic} values (empty or all NaN)")

    def apply(fn, out_core, sizes=None, args=()):
        return xr.apply_ufunc(
            _flat(fn), da, *args,
            input_core_dims=[["obs"]] + [[] for _ in args],
            output_core_dims=out_core,
            dask="parallelized",
            output_dtypes=[np.float64] * len(out_core),
            dask_gufunc_kwargs={"output_sizes": sizes or {}},
        )

    data_vars: dict[str, Any] = {}
    coords: dict[str, Any] = {}
    if method == "empirical":
        p, scalar = _q._check_probs(settings["p"])
        qm = settings["quantile_method"]
        out, _ = apply(lambda a: _q.quantile_groups(a, p, method=qm), [["p"], []], {"p": p.size})
        coords["p"] = p
        data_vars["threshold"] = out.assign_coords(p=p)
    elif method in ("order_statistic", "conformal"):
        if method == "order_statistic":
            nmin = _os.order_statistic_min_n(settings["p"], settings["confidence"])
        else:
            nmin = _os.conformal_min_n(settings["alpha"])
        small = present.values & (n < nmin)
        if small.any():
            i = int(np.flatnonzero(small.ravel())[0])
            raise ValueError(f"group ({_group_name(present, i)}) has n = {int(n.ravel()[i])} values, too few for "
                             f"method {method!r} with {json.dumps({k: settings[k] for k in known})}: need n >= {nmin}")
        ranks = np.zeros(n.shape, np.int64)
        pos = n > 0
        if method == "order_statistic":
            ranks[pos] = _os.order_statistic_rank(n[pos], settings["p"], settings["confidence"])
        else:
            ranks[pos] = _os.conformal_rank(n[pos], settings["alpha"])
        r_da = xr.DataArray(ranks, dims=GROUP_DIMS, coords=present.coords)
        if chunks is not None:
            r_da = r_da.chunk(chunks)
        out, _ = apply(lambda a, r: _q.kth_smallest_groups(a, r.reshape(-1)), [[], []], args=(r_da,))
        data_vars["threshold"] = out
        data_vars["rank"] = r_da.where(pos, 0)
    elif method == "gpd":
        mexc = int(settings["min_exceedances"])
        small = present.values & (n < mexc + 1)
        if small.any():
            i = int(np.flatnonzero(small.ravel())[0])
            raise ValueError(f"group ({_group_name(present, i)}) has n = {int(n.ravel()[i])} values, too few for a "
                             f"POT/GPD fit with min_exceedances={mexc}: need n >= {mexc + 1}")
        if _any_inf(np.asarray(da.values).reshape(-1)):
            raise ValueError(f"{statistic} has infinite values (non-finite kernel output); a GPD tail cannot be "
                             "fitted — use 'empirical' or 'order_statistic'")
        q = float(settings["q"])
        tf = float(settings["tail_fraction"])
        use_zs = int(max(mexc, math.ceil(tf * max(int(n.max()), 1))) <= 2000)
        _evt._check_pot_args(q, tf, mexc)
        # values are checked above (finite) and in group_values (nonnegative): no re-scan
        params, _ = apply(lambda a: _evt._pot_groups_dispatch(a, q, tf, mexc, int(bool(use_zs))),
                          [["param"], []], {"param": len(_evt.POT_FIELDS)})
        for j, name in enumerate(_evt.POT_FIELDS):
            key = "threshold" if name == "return_level" else name
            data_vars[key] = params.isel(param=j, drop=True)
        data_vars["n_exceed"] = data_vars["n_exceed"].fillna(0).astype(np.int64)
    elif method == "gev":
        bs = int(settings["block_size"])
        if bs < 1:
            raise ValueError("block_size must be >= 1")
        src = da
        if bs > 1:
            src = da.coarsen(obs=bs, boundary="trim").max(skipna=True)
            da = src
        nb = _n_valid(np.asarray(da.values))
        small = present.values & (nb < 3)
        if small.any():
            i = int(np.flatnonzero(small.ravel())[0])
            raise ValueError(f"group ({_group_name(present, i)}) has {int(nb.ravel()[i])} block maxima; a GEV fit "
                             "needs n >= 3")
        q = float(settings["q"])
        params, _ = apply(lambda a: _evt.gev_fit_groups(a, q), [["param"], []], {"param": len(_evt.GEV_FIELDS)})
        for j, name in enumerate(_evt.GEV_FIELDS):
            key = "threshold" if name == "return_level" else name
            data_vars[key] = params.isel(param=j, drop=True)
    else:  # bootstrap
        if chunks is not None:
            raise ValueError("bootstrap runs its own parallel kernels; do not pass chunks")
        arr = np.asarray(da.values).reshape(-1, da.sizes["obs"])
        bound = np.full(arr.shape[0], np.nan)
        est = np.full(arr.shape[0], np.nan)
        level = np.full(arr.shape[0], np.nan)
        for g in np.flatnonzero(present.values.ravel()):
            x = arr[g]
            x = x[~np.isnan(x)]
            try:
                if settings["target"] == "quantile":
                    r = _bs.bootstrap_quantile_bound(
                        x, float(settings["p"]), confidence=float(settings["confidence"]),
                        n_resamples=int(settings["n_resamples"]), method=settings["interval"],
                        seed=int(settings["seed"]), quantile_method=settings["quantile_method"])
                elif settings["target"] == "return_level":
                    r = _bs.bootstrap_return_level_bound(
                        x, float(settings["q"]), confidence=float(settings["confidence"]),
                        n_resamples=int(settings["n_resamples"]), method=settings["interval"],
                        resampling=settings["resampling"], seed=int(settings["seed"]),
                        tail_fraction=float(settings["tail_fraction"]),
                        min_exceedances=int(settings["min_exceedances"]))
                else:
                    raise ValueError(f"target must be 'quantile' or 'return_level', got {settings['target']!r}")
            except ValueError as e:
                raise ValueError(f"group ({_group_name(present, int(g))}): {e}") from None
            bound[g], est[g], level[g] = r.bound, r.estimate, r.level
        shp = present.shape
        data_vars["threshold"] = xr.DataArray(bound.reshape(shp), dims=GROUP_DIMS, coords=present.coords)
        data_vars["estimate"] = xr.DataArray(est.reshape(shp), dims=GROUP_DIMS, coords=present.coords)
        data_vars["level"] = xr.DataArray(level.reshape(shp), dims=GROUP_DIMS, coords=present.coords)

    data_vars["n"] = n_da
    data_vars["present"] = present
    ds = xr.Dataset(data_vars, coords=coords)
    ds["threshold"].attrs["long_name"] = f"{method} tolerance for {statistic}"
    ds.attrs.update(
        method=method,
        statistic=statistic,
        settings=json.dumps(settings, sort_keys=True, default=str),
        tolstat_version=__version__,
        threads=numba.get_num_threads(),
    )
    return ds
