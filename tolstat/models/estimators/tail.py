"""Exact upper tails of large error tables: mergeable group top-k, in memory or on dask.

The tail of a group's error distribution is all that an upper quantile or an
order-statistic bound needs. :func:`group_topk` keeps, per (op, dtype, hardware) group,
the ``k`` largest values of a statistic -- a run-level statistic (``max_abs``,
``max_ulp``, ...) or the element samples (``sample_abs``, ``sample_ulp``) -- together
with the group count ``n``. It works chunk by chunk: every chunk of runs is reduced to
``(groups, k)`` values and the partial results are merged by selection in a tree, so the
memory is bounded by the chunk size and ``groups * k`` whatever the size of the table.
The result is *exact* and does not depend on the chunking: in-memory and dask-backed
datasets (``tolstat.open_errors(path, chunks={"run": N})``) give identical arrays.

From the top-k and ``n``:

* :func:`upper_quantile` gives the empirical p-quantile, bit for bit equal to
  ``np.quantile`` on the full group data, for every ``p`` whose order statistics lie in
  the top-k: ``p >= 1 - k/n`` for "higher", ``p >= (n - k)/(n - 1)`` for "linear"
  (which interpolates between two order statistics, so it needs one more);
* :func:`topk_order_statistic_bound` gives the distribution-free upper confidence bound of the
  p-quantile (the binomial rule, as in :mod:`tolstat.models.estimators.orderstat`).

NaN is "missing" (the padding of the element samples) and is never counted; ``+inf``
(non-finite kernel output) is a value like any other and sorts above everything.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np
import xarray as xr

from tolstat._base.util import group_rows
from tolstat.dataset.schema import GROUP_DIMS
from tolstat.models.estimators.orderstat import order_statistic_min_n
from tolstat.models.estimators.orderstat import order_statistic_rank as _os_rank

__all__ = [
    "group_topk",
    "upper_quantile",
    "topk_order_statistic_rank",
    "topk_order_statistic_bound",
]

#: fan-in of the merge tree
SPLIT_EVERY = 8


# --------------------------------------------------------------------------- kernels
def _block_topk(vals: Any, codes: Any, ngroups: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (unsorted, NaN padded) and non-NaN counts of one block of runs, per group.

    ``vals`` has shape (runs,) or (runs, ...); ``codes`` (runs,) holds the group code of
    each run (0 <= code < ngroups).
    """
    v = np.asarray(vals)
    if v.dtype.kind != "f":
        v = v.astype(np.float64)
    v = v.reshape(v.shape[0], -1)
    c = np.asarray(codes, dtype=np.int64).ravel()
    top = np.full((ngroups, k), np.nan, dtype=v.dtype)
    cnt = np.zeros(ngroups, dtype=np.int64)
    if c.size == 0:
        return top, cnt
    order = np.argsort(c, kind="stable")
    sc = c[order]
    starts = np.flatnonzero(np.concatenate(([True], sc[1:] != sc[:-1])))
    ends = np.concatenate((starts[1:], [sc.size]))
    for s, e in zip(starts, ends):
        g = int(sc[s])
        rows = order[s:e]
        if rows[-1] - rows[0] + 1 == rows.size:  # contiguous (always for sorted tables)
            x = v[rows[0] : rows[-1] + 1].ravel()
        else:
            x = v[rows].ravel()
        x = x[~np.isnan(x)]
        cnt[g] = x.size
        if x.size > k:
            x = np.partition(x, x.size - k)[x.size - k :]
        top[g, : x.size] = x
    return top, cnt


def _merge(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge partial ``(top, count)`` results by selection."""
    if len(parts) == 1:
        return parts[0]
    tops = np.concatenate([p[0] for p in parts], axis=1)
    cnt = np.sum([p[1] for p in parts], axis=0).astype(np.int64)
    ngroups, k = parts[0][0].shape
    out = np.full((ngroups, k), np.nan, dtype=tops.dtype)
    for g in range(ngroups):
        x = tops[g]
        x = x[~np.isnan(x)]
        if x.size > k:
            x = np.partition(x, x.size - k)[x.size - k :]
        out[g, : x.size] = x
    return out, cnt


def _finish(top: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Sort each group's top-k in descending order (NaN padding last), ``-0`` -> ``+0``."""
    # ascending sort puts NaN last; flip only the valid part
    out = np.full_like(top, np.nan)
    for g in range(top.shape[0]):
        m = int(min(cnt[g], top.shape[1]))
        x = np.sort(top[g][~np.isnan(top[g])])[::-1]
        out[g, :m] = x[:m]
    return out + 0.0  # canonical zero: the sign of a zero error must not depend on chunking


# --------------------------------------------------------------------------- grouping
def _labels(ds: xr.Dataset, by: Sequence[str]) -> list[np.ndarray]:
    out = []
    for name in by:
        if name not in ds.variables:
            raise ValueError(f"group label {name!r} is not in the dataset")
        if ds[name].dims != ("run",):
            raise ValueError(f"group label {name!r} must have dims ('run',), has {ds[name].dims}")
        out.append(np.asarray(ds[name].values))
    return out


def _group_codes(ds: xr.Dataset, by: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Compact group code per run, the unique values per label, and the grid position
    (flat index into the dense label grid) of every compact group."""
    g = group_rows(_labels(ds, by), ds.sizes["run"])
    return g.codes, g.levels, g.present


def _statistic(ds: xr.Dataset, statistic: str | xr.DataArray) -> xr.DataArray:
    da = ds[statistic] if isinstance(statistic, str) else statistic
    if not isinstance(da, xr.DataArray):
        raise TypeError(f"statistic must be a variable name or a DataArray, got {type(statistic).__name__}")
    if "run" not in da.dims:
        raise ValueError(f"statistic {da.name!r} has no 'run' dimension (dims {da.dims})")
    if da.dims[0] != "run":
        da = da.transpose("run", ...)
    if da.dtype.kind not in "fiub":
        raise TypeError(f"statistic {da.name!r} is not numeric ({da.dtype})")
    return da


def group_topk(
    ds: xr.Dataset,
    statistic: str | xr.DataArray,
    k: int,
    *,
    by: Sequence[str] = GROUP_DIMS,
    split_every: int = SPLIT_EVERY,
) -> xr.DataArray:
    """The ``k`` largest values of a statistic per group, exactly, with the group counts.

    Parameters
    ----------
    ds : xarray.Dataset
        An error dataset, in memory or dask-backed (chunked along ``run`` only).
    statistic : str or xarray.DataArray
        A variable with a ``run`` dimension: a run-level statistic (``"max_abs"``,
        ``"max_ulp"``, ...) or an element sample (``"sample_abs"``, ``"sample_ulp"``),
        in which case all of a group's (non-padding) elements are pooled. Any other
        dimensions are pooled too.
    k : int
        Number of values kept per group (>= 1).
    by : sequence of str, default ("op", "dtype", "hardware")
        Labels along ``run`` that define the groups.
    split_every : int, default 8
        Fan-in of the merge tree on dask-backed data.

    Returns
    -------
    xarray.DataArray
        Dims ``(*by, "rank")``: ``rank = 1`` is the group maximum, ``rank = j`` the j-th
        largest value; NaN where the group has fewer than ``j`` values or the label
        combination does not occur. Coordinate ``n`` (dims ``by``, int64) holds the
        number of non-NaN values of each group (0 for absent combinations); attributes
        ``statistic`` and ``k``. The dtype is that of the statistic (integers become
        float64).

    Raises
    ------
    ValueError
        ``k < 1``, unknown group labels, or a statistic without a ``run`` dimension.

    Notes
    -----
    Memory: each task holds one chunk of runs plus ``groups * k`` values per merged
    part; the dask graph is a tree reduction, so it runs on any scheduler, including
    ``dask.distributed``. Results are identical for every chunking because selection of
    the top-k multiset is exact and the output is sorted.
    """
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    k = int(k)
    by = tuple(by)
    da = _statistic(ds, statistic)
    codes, uniq, present = _group_codes(ds, by)
    ngroups = int(present.size)
    data = da.data
    if _is_dask(data):
        top, cnt = _dask_topk(data, codes, ngroups, k, int(split_every))
    else:
        top, cnt = _block_topk(data, codes, ngroups, k)
    top = _finish(top, cnt)
    shape = tuple(len(u) for u in uniq)
    grid = np.full((int(np.prod(shape, dtype=np.int64)), k), np.nan, dtype=top.dtype)
    grid[present] = top
    ngrid = np.zeros(grid.shape[0], dtype=np.int64)
    ngrid[present] = cnt
    coords: dict[Hashable, Any] = {name: u for name, u in zip(by, uniq)}
    coords["rank"] = np.arange(1, k + 1, dtype=np.int64)
    coords["n"] = (by, ngrid.reshape(shape))
    name = da.name if da.name is not None else "statistic"
    return xr.DataArray(
        grid.reshape(shape + (k,)),
        dims=by + ("rank",),
        coords=coords,
        name=name,
        attrs={"statistic": str(name), "k": k, "long_name": f"top-{k} of {name} per group"},
    )


def _is_dask(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "dask"


def _dask_topk(data: Any, codes: np.ndarray, ngroups: int, k: int, split_every: int) -> tuple[np.ndarray, np.ndarray]:
    import dask
    import dask.array as da

    if split_every < 2:
        raise ValueError(f"split_every must be >= 2, got {split_every}")
    if any(len(c) > 1 for c in data.chunks[1:]):
        data = data.rechunk({i: -1 for i in range(1, data.ndim)})
    carr = da.from_array(codes, chunks=(data.chunks[0],))
    vblocks = data.to_delayed().reshape(-1)
    cblocks = carr.to_delayed().reshape(-1)
    block = dask.delayed(_block_topk, pure=True)
    merge = dask.delayed(_merge, pure=True)
    parts = [block(v, c, ngroups, k) for v, c in zip(vblocks, cblocks)]
    while len(parts) > 1:
        parts = [merge(*parts[i : i + split_every]) for i in range(0, len(parts), split_every)]
    (top, cnt), = dask.compute(parts[0])
    return top, cnt


# --------------------------------------------------------------------------- exact tails
def _unpack(topk: Any, n: Any) -> tuple[np.ndarray, np.ndarray, Any]:
    """(top values (..., k), counts (...), template DataArray or None)."""
    if isinstance(topk, xr.DataArray):
        if "rank" not in topk.dims:
            raise ValueError("topk must have a 'rank' dimension (the output of group_topk)")
        t = topk.transpose(..., "rank")
        if n is None:
            if "n" not in t.coords:
                raise ValueError("n not given and topk has no coordinate 'n'")
            n = t.coords["n"]
        nn = np.broadcast_to(np.asarray(n.values if isinstance(n, xr.DataArray) else n, dtype=np.int64),
                             t.shape[:-1])
        return np.asarray(t.values), nn, t.isel(rank=0, drop=True).drop_vars("n", errors="ignore")
    if n is None:
        raise ValueError("n is required when topk is a plain array")
    t = np.asarray(topk)
    nn = np.broadcast_to(np.asarray(n, dtype=np.int64), t.shape[:-1])
    return t, nn, None


def _wrap(values: np.ndarray, template: Any, name: str, extra: dict[str, Any]) -> Any:
    if template is None:
        return values
    out = template.copy(data=values)
    out.name = name
    for key, val in extra.items():
        out.coords[key] = (template.dims, val)
    return out


def _need_k(k_needed: np.ndarray, k: int, what: str) -> None:
    bad = k_needed > k
    if np.any(bad):
        raise ValueError(
            f"{what} needs the top {int(k_needed.max())} values of some group but topk keeps "
            f"only k = {k}: call group_topk with k >= {int(k_needed.max())}"
        )


def upper_quantile(topk: Any, n: Any = None, p: float = 0.99, method: str = "linear") -> Any:
    """Empirical p-quantile per group from the top-k, equal bit for bit to ``np.quantile``.

    Parameters
    ----------
    topk : xarray.DataArray or ndarray
        Output of :func:`group_topk` (or an array ``(..., k)`` sorted in descending
        order, NaN padded).
    n : int or array_like, optional
        Group sizes; taken from ``topk.n`` when omitted.
    p : float
        Quantile level in [0, 1]. It must be an *upper* quantile: the order statistics
        that ``np.quantile`` uses must lie in the top-k, i.e. ``p >= 1 - k/n`` for
        "higher" and ``p >= (n - k)/(n - 1)`` for "linear" (a ValueError names the k
        needed otherwise).
    method : {"linear", "higher"}
        As in ``np.quantile``. Note that, as with numpy, "linear" gives NaN when it
        interpolates next to ``+inf``; "higher" is the robust choice for errors that can
        be infinite.

    Returns
    -------
    xarray.DataArray or ndarray
        Quantile per group (NaN for empty groups), with coordinate ``n``.

    Raises
    ------
    ValueError
        Unknown method, ``p`` outside [0, 1], or ``p`` too low for the kept ``k``.
    """
    if method not in ("linear", "higher"):
        raise ValueError(f"method must be 'linear' or 'higher', got {method!r}")
    weak = type(p) in (int, float)
    pf = float(p)
    if not (0.0 <= pf <= 1.0):
        raise ValueError(f"p must lie in [0, 1], got {p}")
    top, nn, template = _unpack(topk, n)
    k = top.shape[-1]
    valid = nn > 0
    nv = np.where(valid, nn, 1)
    dt = top.dtype if top.dtype.kind == "f" else np.dtype(np.float64)
    out = np.full(nn.shape, np.nan, dtype=dt)
    if method == "higher":
        idx = np.ceil((nv - 1) * pf).astype(np.intp)  # ascending index, as numpy
        pos = nv - 1 - idx  # position in the descending top-k
        _need_k(np.where(valid, pos + 1, 0), k, f"the {pf}-quantile")
        vals = np.take_along_axis(top, pos[..., None], axis=-1)[..., 0]
        out[valid] = vals[valid]
    else:
        vi = (nv - 1) * pf  # numpy's virtual index for 'linear'
        prev = np.floor(vi)
        nxt = prev + 1
        above = vi >= nv - 1
        prev = np.where(above, -1.0, prev)
        nxt = np.where(above, -1.0, nxt)
        gamma = vi - prev  # numpy computes gamma after clipping, keep it identical
        prev_i = np.where(prev < 0, nv - 1, prev).astype(np.intp)
        next_i = np.where(nxt < 0, nv - 1, nxt).astype(np.intp)
        next_i = np.minimum(next_i, nv - 1)
        pos_a = nv - 1 - prev_i
        pos_b = nv - 1 - next_i
        _need_k(np.where(valid, np.maximum(pos_a, pos_b) + 1, 0), k, f"the {pf}-quantile")
        a = np.take_along_axis(top, np.minimum(pos_a, k - 1)[..., None], axis=-1)[..., 0]
        b = np.take_along_axis(top, np.minimum(pos_b, k - 1)[..., None], axis=-1)[..., 0]
        with np.errstate(invalid="ignore", over="ignore"):
            res = _lerp_like_numpy(a, b, gamma, weak, dt)
        out = np.where(valid, res, np.nan).astype(res.dtype)
    return _wrap(out, template, "quantile", {"n": nn})


def _lerp_like_numpy(a: np.ndarray, b: np.ndarray, t: np.ndarray, weak: bool, dt: np.dtype) -> np.ndarray:
    """numpy's ``_lerp`` element-wise, with the same type promotion as ``np.quantile``."""
    a = a.astype(dt, copy=False)
    b = b.astype(dt, copy=False)
    diff = b - a
    if weak and dt != np.float64:
        # python-float q: numpy multiplies by the python float, i.e. in the data dtype
        t_mul = t.astype(dt)
        one_minus = (1 - t).astype(dt)
    else:
        t_mul = t
        one_minus = 1 - t
    res = np.asarray(a + diff * t_mul)
    alt = np.asarray(b - diff * one_minus)
    res = np.where(t >= 0.5, alt.astype(res.dtype), res)
    if weak:
        res = res.astype(dt)
    return res


def topk_order_statistic_rank(n: Any, p: float, confidence: float) -> np.ndarray:
    """1-based rank ``r`` (r-th smallest) of the order-statistic upper bound of the p-quantile.

    :func:`tolstat.models.estimators.order_statistic_rank` for arrays of group sizes that may
    contain empty groups (``n == 0`` gives rank 0); same errors.
    """
    n = np.asarray(n, dtype=np.int64)
    out = np.zeros(n.shape, dtype=np.int64)
    pos = n > 0
    if np.any(pos):
        out[pos] = _os_rank(n[pos], p, confidence)
    else:
        order_statistic_min_n(p, confidence)  # validate p and confidence
    return out


def topk_order_statistic_bound(topk: Any, n: Any = None, p: float = 0.99, confidence: float = 0.95) -> Any:
    """Distribution-free upper confidence bound of the p-quantile per group, from the top-k.

    The bound is the order statistic ``X_(r)`` with the smallest ``r`` such that
    ``binom.cdf(r - 1, n, p) >= confidence``; it is exact (identical to selecting
    ``X_(r)`` from the full data) whenever ``n - r < k``.

    Parameters
    ----------
    topk : xarray.DataArray or ndarray
        Output of :func:`group_topk` (or a descending, NaN-padded array ``(..., k)``).
    n : int or array_like, optional
        Group sizes; default ``topk.n``.
    p, confidence : float
        Quantile level and confidence, both in (0, 1).

    Returns
    -------
    xarray.DataArray or ndarray
        The bound per group (NaN for absent groups, ``n = 0``); a DataArray carries the
        coordinates ``n`` and ``order_rank`` (the 1-based ascending rank ``r`` used).

    Raises
    ------
    ValueError
        A group with ``0 < n`` below the minimum n (named), or ``k`` too small for a
        group (the message says which ``k`` is needed).
    """
    top, nn, template = _unpack(topk, n)
    k = top.shape[-1]
    r = topk_order_statistic_rank(nn, p, confidence)
    valid = nn > 0
    pos = np.where(valid, nn - r, 0)  # position in the descending top-k
    _need_k(np.where(valid, pos + 1, 0), k, f"the order-statistic bound of the {p}-quantile")
    vals = np.take_along_axis(top, np.minimum(pos, k - 1)[..., None], axis=-1)[..., 0]
    out = np.where(valid, vals, np.nan)
    return _wrap(out, template, "bound", {"n": nn, "order_rank": r})
