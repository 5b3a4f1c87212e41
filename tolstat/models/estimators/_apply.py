"""``fit``: apply the estimator kernels per (op, dtype, hardware) group of an error dataset."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import xarray as xr
from numba import njit, prange

from tolstat._version import __version__
from tolstat._base.util import group_rows
from tolstat.dataset.schema import GROUP_DIMS
from tolstat.models.estimators import bootstrap as _bs
from tolstat.models.estimators import evt as _evt
from tolstat.models.estimators import orderstat as _os
from tolstat.models.estimators import quantiles as _q
from tolstat._base import numba_cache as _numba_cache

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

__all__ = ["fit", "group_values", "METHODS", "FIT_STATISTICS"]

RUN_STATISTICS = ("max_abs", "max_ulp", "max_rel", "mean_abs")
SAMPLE_STATISTICS = ("sample_abs", "sample_ulp", "sample_rel")
#: error values :func:`fit` can model (run-level and element samples); the check
#: statistics of a tolerance table are :data:`tolstat.models.statistics.STATISTICS`
FIT_STATISTICS = RUN_STATISTICS + SAMPLE_STATISTICS
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


def group_values(errors: xr.Dataset, statistic: str = "max_abs", *,
                 sort: bool = True) -> tuple[xr.DataArray, xr.DataArray]:
    """The chosen statistic as a NaN-padded DataArray (op, dtype, hardware, obs).

    Parameters
    ----------
    errors : xarray.Dataset
        An error dataset (docs/schema.md).
    statistic : str
        Run-level (``max_abs``, ``max_ulp``, ``max_rel``, ``mean_abs``: one value per
        run) or element-wise (``sample_abs``, ``sample_ulp``, ``sample_rel`` =
        ``sample_abs / max(sample_ref, rel_floor)``: the run's samples, flattened).
    sort : bool, default True
        Group labels in sorted order. ``False``: in the order of their first appearance
        where the runs are grouped in that order (then the values are a view of the
        dataset's, not a copy), sorted otherwise.

    Returns
    -------
    values : DataArray (op, dtype, hardware, obs)
        float64, NaN padded. Runs of a group that are contiguous and of equal size in
        the dataset are viewed, not copied, when all groups are present.
    present : DataArray of bool (op, dtype, hardware)
        Whether the group has runs in the dataset (absent groups are all NaN).
    """
    return _grouped(errors, _values(errors, statistic), statistic, sort=sort, negatives=True)


def _values(errors: xr.Dataset, statistic: str) -> np.ndarray:
    """The (runs, width) float64 values of ``statistic`` (a view where the dataset holds them so)."""
    if statistic not in FIT_STATISTICS:
        raise ValueError(f"statistic must be one of {FIT_STATISTICS}, got {statistic!r}")
    for d in GROUP_DIMS:
        if d not in errors.coords and d not in errors:
            raise ValueError(f"error dataset has no {d!r} label along 'run'")
    if "run" not in errors.dims:
        raise ValueError("error dataset has no 'run' dimension")
    if errors.sizes["run"] == 0:
        raise ValueError("error dataset has no runs (run dimension of size 0)")
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
    return vals


def _negative_error(statistic: str) -> ValueError:
    return ValueError(f"{statistic} has negative values; error metrics must be nonnegative")


def _appearance_order(uniq: list, shape: tuple, gid: np.ndarray) -> tuple[list, np.ndarray]:
    """Each label's levels in the order of first appearance, and the group ids in that order."""
    codes = np.unravel_index(gid, shape)
    levels, recoded = [], []
    for lev, c in zip(uniq, codes):
        _, first = np.unique(c, return_index=True)
        order = c[np.sort(first)]
        rank = np.empty(len(lev), np.int64)
        rank[order] = np.arange(order.size)
        levels.append(lev[order])
        recoded.append(rank[c])
    return levels, np.ravel_multi_index(recoded, shape)


def _grouped(errors: xr.Dataset, vals: np.ndarray, statistic: str, *, sort: bool,
             negatives: bool) -> tuple[xr.DataArray, xr.DataArray]:
    """:func:`group_values` of the values ``vals`` (runs, width); ``negatives=False``
    leaves the check for negative values to the caller."""
    if negatives and vals.shape[0] and _count_negative(vals.reshape(-1)) > 0:
        raise _negative_error(statistic)

    groups = group_rows([np.asarray(errors[d].values).astype(str) for d in GROUP_DIMS])
    uniq, shape, gid = groups.levels, groups.shape, groups.flat
    G = int(np.prod(shape))
    counts = np.bincount(gid, minlength=G)
    present = counts > 0
    width = vals.shape[1]
    nobs = int(counts.max()) * width if G else 0
    contiguous = bool(np.all(np.diff(gid) >= 0))
    viewable = present.all() and np.all(counts == counts[0]) and vals.flags.c_contiguous
    if viewable and not contiguous and not sort:
        levels, gid2 = _appearance_order(uniq, shape, gid)
        if np.all(np.diff(gid2) >= 0):
            uniq, contiguous = levels, True
    if viewable and contiguous:
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
    vals = _values(errors, statistic)
    known = _DEFAULTS[method]
    unknown = set(options) - set(known)
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)} for method {method!r}; known: {sorted(known)}")
    settings = {**known, **options}
    one_read = method == "gpd" and chunks is None and _pot_args_ok(settings)
    # the kernels fit each group on its own: group labels in dataset order keep the values a
    # view (the result is sorted below); bootstrap and the error messages of the others keep
    # the sorted order
    sort = method not in ("empirical", "gpd")
    da, present = _grouped(errors, vals, statistic, sort=sort, negatives=not one_read)
    if chunks is not None:
        bad = set(chunks) - set(GROUP_DIMS)
        if bad:
            raise ValueError(f"chunk only along {GROUP_DIMS} (never along obs), got {sorted(bad)}")
        da = da.chunk({**chunks, "obs": -1})
    gathered = None
    if one_read:
        # long groups: the counts, the checks and the tail in one read (_evt.pot_one_read)
        grid = np.asarray(da.values).reshape(-1, da.sizes["obs"])
        if grid.shape[1] >= _evt._POT_RADIX_MIN_N:
            gathered = _evt.pot_one_read(np.ascontiguousarray(grid), float(settings["tail_fraction"]))
            if gathered[1].any():
                raise _negative_error(statistic)
        elif grid.size and _count_negative(grid.reshape(-1)) > 0:
            raise _negative_error(statistic)
    # counts are cheap and needed for validation
    if gathered is not None:
        n = gathered[0].reshape(present.shape)
    else:
        n = _n_valid(np.asarray(da.data if chunks is None else da.values))
    empty = present.values & (n == 0)
    if empty.any():
        raise ValueError(f"group ({_group_name(present, int(np.flatnonzero(empty.ravel())[0]))}) exists "
                         f"but has no valid {statistic} values (empty or all NaN)")
    ctx = _FitContext(da, present, n, chunks, settings, statistic, method, gathered)
    data_vars, coords = _FITTERS[method](ctx)
    data_vars["n"] = xr.DataArray(n.astype(np.int64), dims=GROUP_DIMS, coords=present.coords)
    data_vars["present"] = present
    ds = xr.Dataset(data_vars, coords=coords)
    if not sort:
        ds = ds.sortby(list(GROUP_DIMS))
    ds["threshold"].attrs["long_name"] = f"{method} tolerance for {statistic}"
    ds.attrs.update(
        method=method,
        statistic=statistic,
        settings=json.dumps(settings, sort_keys=True, default=str),
        tolstat_version=__version__,
        threads=numba.get_num_threads(),
    )
    return ds


#: the options of each method and their defaults
_DEFAULTS: dict[str, dict[str, Any]] = {
    "empirical": {"p": 0.99, "quantile_method": "linear"},
    "order_statistic": {"p": 0.99, "confidence": 0.95},
    "conformal": {"alpha": 0.01},
    "gpd": {"q": 1e-6, "tail_fraction": 0.1, "min_exceedances": 30},
    "gev": {"q": 0.01, "block_size": 1},
    "bootstrap": {"target": "quantile", "p": 0.99, "q": 1e-6, "confidence": 0.95, "n_resamples": 1000,
                  "interval": "bca", "seed": 0, "resampling": "parametric", "tail_fraction": 0.1,
                  "min_exceedances": 30, "quantile_method": "linear"},
}


@dataclass(frozen=True)
class _FitContext:
    """What every method of :func:`fit` works on."""

    da: xr.DataArray
    present: xr.DataArray
    n: np.ndarray
    chunks: dict | None
    settings: dict[str, Any]
    statistic: str
    method: str
    #: the one-read result of :func:`tolstat.models.estimators.evt.pot_one_read` (gpd, long groups)
    gathered: tuple | None = None

    def apply(self, fn: Any, out_core: list, sizes: dict | None = None, args: tuple = (),
              da: xr.DataArray | None = None) -> Any:
        """Run a groups x obs kernel over the (possibly dask-backed) values."""
        return xr.apply_ufunc(
            _flat(fn), self.da if da is None else da, *args,
            input_core_dims=[["obs"]] + [[] for _ in args],
            output_core_dims=out_core,
            dask="parallelized",
            output_dtypes=[np.float64] * len(out_core),
            dask_gufunc_kwargs={"output_sizes": sizes or {}},
        )

    def require(self, counts: np.ndarray, nmin: int, what: str) -> None:
        """``ValueError`` naming the first present group with fewer than ``nmin``."""
        small = self.present.values & (counts < nmin)
        if small.any():
            i = int(np.flatnonzero(small.ravel())[0])
            raise ValueError(f"group ({_group_name(self.present, i)}) has {what(int(counts.ravel()[i]))}: "
                             f"need n >= {nmin}")


_Fitted = tuple[dict[str, Any], dict[str, Any]]


def _fit_empirical(ctx: _FitContext) -> _Fitted:
    p, _ = _q._check_probs(ctx.settings["p"])
    qm = ctx.settings["quantile_method"]
    out, _ = ctx.apply(lambda a: _q.quantile_groups(a, p, method=qm), [["p"], []], {"p": p.size})
    return {"threshold": out.assign_coords(p=p)}, {"p": p}


def _fit_rank(ctx: _FitContext) -> _Fitted:
    """``order_statistic`` and ``conformal``: a rank per group, then selection."""
    st, n = ctx.settings, ctx.n
    if ctx.method == "order_statistic":
        nmin = _os.order_statistic_min_n(st["p"], st["confidence"])
    else:
        nmin = _os.conformal_min_n(st["alpha"])
    opts = json.dumps({k: st[k] for k in _DEFAULTS[ctx.method]})
    ctx.require(n, nmin, lambda k: f"n = {k} values, too few for method {ctx.method!r} with {opts}")
    ranks = np.zeros(n.shape, np.int64)
    pos = n > 0
    if ctx.method == "order_statistic":
        ranks[pos] = _os.order_statistic_rank(n[pos], st["p"], st["confidence"])
    else:
        ranks[pos] = _os.conformal_rank(n[pos], st["alpha"])
    r_da = xr.DataArray(ranks, dims=GROUP_DIMS, coords=ctx.present.coords)
    if ctx.chunks is not None:
        r_da = r_da.chunk(ctx.chunks)
    out, _ = ctx.apply(lambda a, r: _q.kth_smallest_groups(a, r.reshape(-1)), [[], []], args=(r_da,))
    return {"threshold": out, "rank": r_da.where(pos, 0)}, {}


def _pot_args_ok(settings: dict[str, Any]) -> bool:
    """Whether the gpd settings are valid (else :func:`_fit_gpd` raises their error in its turn)."""
    try:
        _evt._check_pot_args(float(settings["q"]), float(settings["tail_fraction"]),
                             int(settings["min_exceedances"]))
    except (ValueError, TypeError):
        return False
    return True


def _fit_gpd(ctx: _FitContext) -> _Fitted:
    mexc = int(ctx.settings["min_exceedances"])
    ctx.require(ctx.n, mexc + 1, lambda k: f"n = {k} values, too few for a POT/GPD fit with "
                                           f"min_exceedances={mexc}")
    has_inf = (bool(ctx.gathered[2].any()) if ctx.gathered is not None
               else _any_inf(np.asarray(ctx.da.values).reshape(-1)))
    if has_inf:
        raise ValueError(f"{ctx.statistic} has infinite values (non-finite kernel output); a GPD tail cannot be "
                         "fitted — use 'empirical' or 'order_statistic'")
    q = float(ctx.settings["q"])
    tf = float(ctx.settings["tail_fraction"])
    use_zs = int(max(mexc, math.ceil(tf * max(int(ctx.n.max()), 1))) <= 2000)
    _evt._check_pot_args(q, tf, mexc)
    # values are checked above (finite) and in group_values (nonnegative): no re-scan
    if ctx.gathered is not None:
        grid = np.ascontiguousarray(np.asarray(ctx.da.values).reshape(-1, ctx.da.sizes["obs"]))
        fitted = _evt.pot_fit_gathered(grid, ctx.gathered, q, tf, mexc, int(bool(use_zs)))
        params = xr.DataArray(fitted.reshape(ctx.present.shape + (len(_evt.POT_FIELDS),)),
                              dims=GROUP_DIMS + ("param",), coords=ctx.present.coords)
    else:
        params, _ = ctx.apply(lambda a: _evt._pot_groups_rescaled(a, q, tf, mexc, int(bool(use_zs))),
                              [["param"], []], {"param": len(_evt.POT_FIELDS)})
    data_vars = {("threshold" if name == "return_level" else name): params.isel(param=j, drop=True)
                 for j, name in enumerate(_evt.POT_FIELDS)}
    data_vars["n_exceed"] = data_vars["n_exceed"].fillna(0).astype(np.int64)
    return data_vars, {}


def _block_maxima(values: xr.DataArray, bs: int) -> xr.DataArray:
    """Maxima of consecutive blocks of ``bs`` runs per group; an incomplete last block is dropped.

    A group shorter than the longest is NaN-padded in ``values``: its last, partial block
    (fewer than ``bs`` runs) is not a block maximum and becomes NaN like the padding.
    """
    # coarsen reductions skip NaN by default (newer xarray rejects skipna= there)
    out = values.coarsen(obs=bs, boundary="trim").max()
    valid = ~np.isnan(np.asarray(values.values))
    obs = valid.shape[-1]
    length = np.where(valid.any(axis=-1), obs - np.argmax(valid[..., ::-1], axis=-1), 0)
    complete = np.arange(out.sizes["obs"]) < (length // bs)[..., None]
    return out.where(xr.DataArray(complete, dims=out.dims))


def _fit_gev(ctx: _FitContext) -> _Fitted:
    bs = int(ctx.settings["block_size"])
    if bs < 1:
        raise ValueError("block_size must be >= 1")
    da = _block_maxima(ctx.da, bs) if bs > 1 else ctx.da
    nb = _n_valid(np.asarray(da.values))
    small = ctx.present.values & (nb < 3)
    if small.any():
        i = int(np.flatnonzero(small.ravel())[0])
        raise ValueError(f"group ({_group_name(ctx.present, i)}) has {int(nb.ravel()[i])} block maxima; a GEV fit "
                         "needs n >= 3")
    q = float(ctx.settings["q"])
    params, _ = ctx.apply(lambda a: _evt.gev_fit_groups(a, q), [["param"], []], {"param": len(_evt.GEV_FIELDS)},
                          da=da)
    return {("threshold" if name == "return_level" else name): params.isel(param=j, drop=True)
            for j, name in enumerate(_evt.GEV_FIELDS)}, {}


def _bootstrap_one(x: np.ndarray, st: dict[str, Any]) -> Any:
    if st["target"] == "quantile":
        return _bs.bootstrap_quantile_bound(
            x, float(st["p"]), confidence=float(st["confidence"]), n_resamples=int(st["n_resamples"]),
            method=st["interval"], seed=int(st["seed"]), quantile_method=st["quantile_method"])
    if st["target"] == "return_level":
        return _bs.bootstrap_return_level_bound(
            x, float(st["q"]), confidence=float(st["confidence"]), n_resamples=int(st["n_resamples"]),
            method=st["interval"], resampling=st["resampling"], seed=int(st["seed"]),
            tail_fraction=float(st["tail_fraction"]), min_exceedances=int(st["min_exceedances"]))
    raise ValueError(f"target must be 'quantile' or 'return_level', got {st['target']!r}")


def _fit_bootstrap(ctx: _FitContext) -> _Fitted:
    if ctx.chunks is not None:
        raise ValueError("bootstrap runs its own parallel kernels; do not pass chunks")
    present = ctx.present
    arr = np.asarray(ctx.da.values).reshape(-1, ctx.da.sizes["obs"])
    out = {k: np.full(arr.shape[0], np.nan) for k in ("threshold", "estimate", "level")}
    for g in np.flatnonzero(present.values.ravel()):
        x = arr[g]
        x = x[~np.isnan(x)]
        try:
            r = _bootstrap_one(x, ctx.settings)
        except ValueError as e:
            raise ValueError(f"group ({_group_name(present, int(g))}): {e}") from None
        out["threshold"][g], out["estimate"][g], out["level"][g] = r.bound, r.estimate, r.level
    return {k: xr.DataArray(v.reshape(present.shape), dims=GROUP_DIMS, coords=present.coords)
            for k, v in out.items()}, {}


_FITTERS = {
    "empirical": _fit_empirical,
    "order_statistic": _fit_rank,
    "conformal": _fit_rank,
    "gpd": _fit_gpd,
    "gev": _fit_gev,
    "bootstrap": _fit_bootstrap,
}
