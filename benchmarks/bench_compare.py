"""``tolstat.compare`` out of core on a 1e8-element error table, against one read pass (issue 16).

Generates a schema-valid error dataset on disk (zarr, ``--runs`` runs x ``--sample``
element samples; default 100,000 x 1,000 = 1.0e8 elements per sample variable), written
chunk by chunk by dask and never held in memory, in 6 (op, dtype) groups. Then, in the
same process, on dask's synchronous scheduler (one core), it times

* **read pass**: one pass over what ``compare`` reads -- ``sample_abs`` and
  ``sample_ref`` (1e8 elements each) and the run-level variables -- reduced with
  ``max``; a second figure reads all four sample variables;
* **compare**: ``tolstat.compare(open_errors(path, chunks=...), methods=[torch-defaults,
  atol=rtol=1e-2, study, tolstat], budgets=(1e-2, 1e-3), folds=5)``,

and reports ``compare / read pass``. Results go to ``benchmarks/results/compare.json``.

Usage::

    PYTHONPATH=. python benchmarks/bench_compare.py [--runs 100000] [--sample 1000] [--path /tmp/...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OPS = ("matmul", "softmax", "conv")
DTYPES = ("float16", "bfloat16")
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
METHODS = ["torch-defaults", "atol=rtol=1e-2", "study", "tolstat"]


def _rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _template(sample: int):
    """A 1-run dataset from tolstat.from_pairs: the schema's variables, labels and attrs."""
    import tolstat

    rng = np.random.default_rng(0)
    e = rng.standard_normal(sample)
    a = (e + 1e-3 * rng.standard_normal(sample)).astype(np.float16)
    return tolstat.from_pairs([(a, e)], op="matmul", dtype="float16", hardware="cpu:bench",
                              options=tolstat.CollectOptions(sample_size=sample, progress=False))


def _block(kind: str, loc: int, n: int, sample: int, seed: int, dts: np.ndarray) -> dict:
    """All variables of one chunk of runs (deterministic in (seed, chunk))."""
    r = np.random.default_rng([seed, loc])
    eps = np.array([EPS[d] for d in dts])
    ref = np.abs(r.standard_normal((n, sample))) * r.choice([1.0, 10.0], n)[:, None]
    signed = eps[:, None] * (0.5 * ref + 0.05) * r.standard_normal((n, sample))
    ab = np.abs(signed)
    return {"sample_abs": ab, "sample_ref": ref, "sample_signed": signed, "sample_ulp": ab / (eps[:, None] * np.maximum(ref, 1e-3))}


def generate(path: str, runs: int, sample: int, chunk: int, seed: int) -> dict:
    import dask
    import dask.array as da
    import xarray as xr

    import tolstat

    t0 = time.perf_counter()
    tpl = _template(sample)
    rng = np.random.default_rng(seed)
    ops = rng.choice(OPS, runs)
    dts = rng.choice(DTYPES, runs)
    starts = list(range(0, runs, chunk))
    sizes = [min(chunk, runs - s) for s in starts]

    def lazy(name):
        def one(i):
            s = starts[i]
            return _block(name, i, sizes[i], sample, seed, dts[s:s + sizes[i]])[name]
        parts = [da.from_delayed(dask.delayed(one)(i), (sizes[i], sample), dtype=np.float64)
                 for i in range(len(starts))]
        return da.concatenate(parts, axis=0)

    # run-level statistics: one in-memory pass over the generated chunks (not timed below)
    qs = tpl["quantile"].values
    run = {k: np.empty(runs) for k in ("max_abs", "max_rel", "max_ulp", "mean_abs", "mean_signed",
                                       "ref_max_abs", "ref_rms")}
    aq = np.empty((runs, qs.size))
    for i, s in enumerate(starts):
        b = _block("", i, sizes[i], sample, seed, dts[s:s + sizes[i]])
        sl = slice(s, s + sizes[i])
        run["max_abs"][sl] = b["sample_abs"].max(1)
        run["max_rel"][sl] = (b["sample_abs"] / np.maximum(b["sample_ref"], 6.1e-5)).max(1)
        run["max_ulp"][sl] = b["sample_ulp"].max(1)
        run["mean_abs"][sl] = b["sample_abs"].mean(1)
        run["mean_signed"][sl] = b["sample_signed"].mean(1)
        run["ref_max_abs"][sl] = b["sample_ref"].max(1)
        run["ref_rms"][sl] = np.sqrt((b["sample_ref"] ** 2).mean(1))
        aq[sl] = np.quantile(b["sample_abs"], qs, axis=1).T
    ones = np.ones(runs, dtype=np.int64)
    data = {
        **{k: ("run", v) for k, v in run.items()},
        "abs_quantile": (("run", "quantile"), aq),
        "n_elements": ("run", ones * sample), "n_nonfinite": ("run", ones * 0),
        "n_frontier": ("run", ones), "n_sample": ("run", ones * sample),
        "rel_floor": ("run", np.full(runs, 6.1e-5)),
        **{k: (("run", "sample"), lazy(k)) for k in ("sample_abs", "sample_ref", "sample_signed", "sample_ulp")},
    }
    coords = {
        "op": ("run", ops), "dtype": ("run", dts), "hardware": ("run", np.full(runs, "cpu:bench")),
        "platform": ("run", np.full(runs, str(tpl["platform"].values[0]))),
        "shape": ("run", np.full(runs, str(sample))), "seed": ("run", np.full(runs, seed, dtype=np.int64)),
        "run_index": ("run", np.arange(runs, dtype=np.int64)), "quantile": qs,
    }
    ds = xr.Dataset(data, coords=coords, attrs=dict(tpl.attrs))
    ds.attrs["labels"] = ""
    ds.attrs["covariates"] = "ref_max_abs,ref_rms,n_elements"
    tolstat.dataset.validate(ds, deep=False)
    with dask.config.set(scheduler="threads"):
        tolstat.save(ds, path, encoding={k: {"chunks": (chunk, sample)} for k in
                                         ("sample_abs", "sample_ref", "sample_signed", "sample_ulp")})
    return {"seconds": time.perf_counter() - t0, "runs": runs, "sample": sample,
            "elements_per_sample_variable": runs * sample,
            "bytes_on_disk": sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())}


def read_pass(path: str, chunk: int, names) -> float:
    import dask

    import tolstat

    t0 = time.perf_counter()
    ds = tolstat.open_errors(path, chunks={})
    with dask.config.set(scheduler="synchronous"):
        arrs = [ds[n].data.max() for n in names]
        dask.compute(*arrs, ds["max_abs"].data.max(), ds["n_sample"].data.max())
    return time.perf_counter() - t0


def run_compare(path: str, chunk: int, folds: int) -> tuple[float, object]:
    import dask

    import tolstat

    t0 = time.perf_counter()
    ds = tolstat.open_errors(path, chunks={})
    with dask.config.set(scheduler="synchronous"):
        res = tolstat.compare(ds, methods=METHODS, budgets=(1e-2, 1e-3), folds=folds, progress=False)
    return time.perf_counter() - t0, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=5000)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--path", default="/tmp/tolstat-bench-compare.zarr")
    ap.add_argument("--keep", action="store_true", help="keep the generated table")
    ap.add_argument("--out", default=str(HERE / "results" / "compare.json"))
    a = ap.parse_args()
    from threadpoolctl import threadpool_limits

    if os.path.exists(a.path):
        shutil.rmtree(a.path)
    gen = generate(a.path, a.runs, a.sample, a.chunk, a.seed)
    print(f"generated {gen['elements_per_sample_variable']:.3g} elements per sample variable in "
          f"{gen['seconds']:.1f} s, {gen['bytes_on_disk'] / 2**30:.2f} GiB on disk", flush=True)
    try:
        with threadpool_limits(limits=1):
            t_read = read_pass(a.path, a.chunk, ("sample_abs", "sample_ref"))
            t_cmp, res = run_compare(a.path, a.chunk, a.folds)
            t_read2 = read_pass(a.path, a.chunk, ("sample_abs", "sample_ref"))
            t_all = read_pass(a.path, a.chunk, ("sample_abs", "sample_ref", "sample_signed", "sample_ulp"))
    finally:
        if not a.keep:
            shutil.rmtree(a.path, ignore_errors=True)
    base = min(t_read, t_read2)
    print(res.summary())
    doc = {
        "benchmark": "tolstat.compare on a dask-backed error table vs one read pass (1 core, synchronous)",
        "host": {"machine": platform.machine(), "python": platform.python_version(),
                 "cpu_count": os.cpu_count()},
        "table": gen,
        "methods": METHODS, "budgets": [1e-2, 1e-3], "folds": a.folds, "chunk_runs": a.chunk,
        "seconds": {"read_pass_abs_ref": base, "read_pass_abs_ref_runs": [t_read, t_read2],
                    "read_pass_all_samples": t_all, "compare": t_cmp},
        "ratio_compare_over_read_pass": t_cmp / base,
        "ratio_compare_over_read_all_samples": t_cmp / t_all,
        "peak_rss_mib": _rss_peak_mib(),
        "summary": res.rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    os.replace(tmp, out)
    print(f"read pass {base:.1f} s (all four sample variables {t_all:.1f} s), compare {t_cmp:.1f} s: "
          f"ratio {t_cmp / base:.2f}x; peak RSS {doc['peak_rss_mib']:.0f} MiB; wrote {out}")


if __name__ == "__main__":
    main()
