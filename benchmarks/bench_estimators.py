"""Estimator benchmarks: tolstat kernels vs scipy / numpy / xarray on the same data.

Run: ``PYTHONPATH=. python benchmarks/bench_estimators.py [--quick]``. Prints a table and
writes ``benchmarks/results/estimators.json``. Times are medians of repeats; the first
call (numba compile, or load from the on-disk cache) is reported separately.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numba
import numpy as np
import scipy
import xarray as xr
from scipy import stats

from tolstat._base.util import atomic_write_text
from tolstat.models.estimators import bootstrap_quantile_bound, fit, gpd_fit_mle, quantile_groups


def timeit(fn, repeats):
    ts = []
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def first_call(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_bca(res, quick):
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal(20_000))
    f = lambda: bootstrap_quantile_bound(x, 0.999, n_resamples=1000, method="bca", seed=1)
    first = first_call(f)
    ours, r = timeit(f, 7)
    stat = lambda a, axis: np.quantile(a, 0.999, axis=axis)
    if quick:
        ref = 43.1  # scipy.stats.bootstrap BCa, recorded from a full run (--quick does not re-time it)
        ref_bound = float("nan")
    else:
        ref, s = timeit(lambda: stats.bootstrap((x,), stat, n_resamples=1000, method="BCa",
                                                alternative="less", rng=2), 1)
        ref_bound = float(s.confidence_interval.high)
    res["bca_bootstrap_q999_n2e4_B1000"] = dict(
        tolstat_s=ours, tolstat_first_call_s=first, scipy_s=ref, speedup=ref / ours,
        tolstat_bound=r.bound, scipy_bound=ref_bound, target=">= 1000x",
        scipy_repeats=0 if quick else 1)


def bench_gpd(res):
    rng = np.random.default_rng(1)
    y = stats.genpareto.rvs(-0.2, scale=1.0, size=50_000, random_state=rng)
    f = lambda: gpd_fit_mle(y)
    first = first_call(f)
    ours, fitted = timeit(f, 21)
    ref, c = timeit(lambda: stats.genpareto.fit(y, floc=0), 5)
    ll_ref = float(stats.genpareto.logpdf(y, *c).sum())
    res["gpd_fit_5e4"] = dict(tolstat_s=ours, tolstat_first_call_s=first, scipy_s=ref, speedup=ref / ours,
                              tolstat_loglik=fitted.loglik, scipy_loglik=ll_ref,
                              loglik_gain=fitted.loglik - ll_ref, target=">= 100x at >= loglik")


def bench_groups(res, quick):
    rng = np.random.default_rng(2)
    G, N = (200, 100_000) if quick else (1000, 100_000)
    x = rng.standard_normal((G, N))
    for label, q in (("tail", [0.99, 0.999]), ("with_median", [0.5, 0.99, 0.999])):
        f = lambda: quantile_groups(x, q)
        first = first_call(f)
        ours, out = timeit(f, 5)
        loop, ref = timeit(lambda: np.array([np.quantile(r, q) for r in x]), 1)
        assert np.array_equal(out[0], ref)
        da = xr.Dataset({"v": (("g", "obs"), x)})
        xq, _ = timeit(lambda: da.quantile(q, dim="obs"), 1)
        res[f"group_quantiles_{G}x{N}_{label}"] = dict(
            p=q, tolstat_s=ours, tolstat_first_call_s=first, numpy_loop_s=loop, xarray_s=xq,
            speedup_vs_loop=loop / ours, speedup_vs_xarray=xq / ours, target=">= 5x vs loop")


def bench_fit(res, quick):
    rng = np.random.default_rng(3)
    S = 4096
    n_runs = (2_441 if quick else 24_414)
    n_groups = 8
    per = n_runs // n_groups
    n_runs = per * n_groups
    samp = rng.exponential(1e-3, (n_runs, S))
    ops = np.repeat([f"op{i // 2}" for i in range(n_groups)], per)
    dts = np.repeat(["float16", "bfloat16"] * (n_groups // 2), per)
    ds = xr.Dataset(
        {"sample_abs": (("run", "sample"), samp), "max_abs": ("run", samp.max(axis=1))},
        coords={"op": ("run", ops), "dtype": ("run", dts), "hardware": ("run", np.full(n_runs, "cpu"))},
    )
    n = samp.size
    base, _ = timeit(lambda: np.abs(samp).max(), 5)
    out = {}
    for method, opts in (("empirical", {"p": 0.999}), ("gpd", {"q": 1e-9})):
        f = lambda: fit(ds, method=method, statistic="sample_abs", **opts)
        first = first_call(f)
        t, _ = timeit(f, 3)
        out[method] = dict(fit_s=t, first_call_s=first, ratio_to_absmax=t / base)
    res[f"fit_{n:.1e}_errors"] = dict(n_values=n, groups=n_groups, absmax_pass_s=base, **{
        f"{m}_{k}": v for m, d in out.items() for k, v in d.items()}, target="gpd within 2x of one abs-max pass")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller data, skip the 43 s scipy BCa")
    args = ap.parse_args()
    res = {}
    load_start = os.getloadavg()[0]
    bench_bca(res, args.quick)
    bench_gpd(res)
    bench_groups(res, args.quick)
    bench_fit(res, args.quick)
    meta = dict(threads=numba.get_num_threads(), cpus=os.cpu_count(), numpy=np.__version__,
                scipy=scipy.__version__, numba=numba.__version__, python=platform.python_version(),
                quick=args.quick, load_start=load_start, load_end=os.getloadavg()[0])
    for k, v in res.items():
        print(k)
        for kk, vv in v.items():
            print(f"    {kk:28s} {vv:.4g}" if isinstance(vv, float) else f"    {kk:28s} {vv}")
    path = Path(__file__).parent / "results" / "estimators.json"
    path.parent.mkdir(exist_ok=True)
    atomic_write_text(path, json.dumps({"meta": meta, "results": res}, indent=2))
    print("wrote", path)


if __name__ == "__main__":
    main()
