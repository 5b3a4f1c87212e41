"""Small error datasets (docs/schema.md layout) for the estimator tests."""

from __future__ import annotations

import numpy as np
import xarray as xr


def make_errors(groups: dict, *, sample_size: int = 8, seed: int = 0) -> xr.Dataset:
    """Build an error dataset from ``{(op, dtype, hardware): max_abs values per run}``.

    Element samples are drawn below each run's max (the max itself is sample 0), with a
    few NaN-padded slots so rows are unequal. ``max_ulp = max_abs * 1e3``,
    ``max_rel = max_abs * 10``, ``mean_abs = max_abs / 4``.
    """
    rng = np.random.default_rng(seed)
    ops, dts, hws, vals = [], [], [], []
    for (op, dt, hw), v in groups.items():
        v = np.asarray(v, dtype=np.float64)
        ops += [op] * v.size
        dts += [dt] * v.size
        hws += [hw] * v.size
        vals.append(v)
    mx = np.concatenate(vals) if vals else np.zeros(0)
    nrun = mx.size
    samp = rng.random((nrun, sample_size)) * mx[:, None]
    samp[:, 0] = mx
    n_sample = np.full(nrun, sample_size, np.int64)
    if sample_size > 2:
        pad = rng.integers(0, 2, nrun).astype(bool)
        samp[pad, -1] = np.nan
        n_sample[pad] -= 1
    ref = np.where(np.isnan(samp), np.nan, rng.random((nrun, sample_size)) + 0.5)
    floor = np.full(nrun, np.finfo(np.float32).tiny)
    ds = xr.Dataset(
        {
            "max_abs": ("run", mx),
            "max_ulp": ("run", mx * 1e3),
            "max_rel": ("run", mx * 10),
            "mean_abs": ("run", mx / 4),
            "rel_floor": ("run", floor),
            "n_sample": ("run", n_sample),
            "sample_abs": (("run", "sample"), samp),
            "sample_ulp": (("run", "sample"), np.floor(samp * 1e3)),
            "sample_ref": (("run", "sample"), ref),
        },
        coords={
            "op": ("run", np.array(ops, dtype=str)),
            "dtype": ("run", np.array(dts, dtype=str)),
            "hardware": ("run", np.array(hws, dtype=str)),
            "run_index": ("run", np.arange(nrun, dtype=np.int64)),
        },
        attrs={"tolstat_schema": 1},
    )
    return ds
