"""Out-of-core calibration of a 1e9-element error table (issue 6).

Generates an error table on disk (zarr v2, ``sample_abs`` float64, 244,141 runs x 4096
samples = 1.0e9 elements, ~8 GB, written chunk by chunk by dask, never held in memory),
then calibrates it out of core -- exact group top-k of the element samples per
(op, dtype, hardware) plus the order-statistic bound and the empirical upper quantile
per group -- and compares with one read pass of the same arrays (``abs().max()``), on the
threaded scheduler and on a ``dask.distributed.LocalCluster(n_workers=2,
threads_per_worker=1)``. Every phase runs in a fresh subprocess so that its peak RSS
(``ru_maxrss``) is its own; for the cluster the workers' peaks are collected too.

Usage::

    PYTHONPATH=. python benchmarks/bench_outofcore.py [--runs 244141] [--path /tmp/...]

Results go to ``benchmarks/results/outofcore.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GROUP_OPS = ("matmul", "softmax", "conv")
GROUP_DTYPES = ("float16", "bfloat16")


def _rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def generate(path: str, runs: int, sample: int, chunk_runs: int, seed: int) -> dict:
    """Write the table with dask, one chunk of runs at a time."""
    import dask
    import dask.array as da
    import xarray as xr

    rng = np.random.default_rng(seed)
    ops = rng.choice(GROUP_OPS, runs)
    dts = rng.choice(GROUP_DTYPES, runs)
    scale = np.where(dts == "float16", 1e-3, 8e-3) * np.where(ops == "conv", 2.0, 1.0)
    n_sample = np.where(rng.random(runs) < 0.05, rng.integers(1, sample, runs), sample)

    def block(sc, ns, block_info=None):
        loc = block_info[0]["chunk-location"][0]
        r = np.random.default_rng([seed, loc])
        x = np.abs(r.standard_normal((sc.shape[0], sample))) * sc[:, None]
        x[np.arange(sample)[None, :] >= ns[:, None]] = np.nan
        return x

    sc = da.from_array(scale, chunks=chunk_runs)
    ns = da.from_array(n_sample, chunks=chunk_runs)
    data = da.map_blocks(block, sc, ns, new_axis=1, chunks=(sc.chunks[0], (sample,)),
                         dtype=np.float64)
    ds = xr.Dataset(
        {"sample_abs": (("run", "sample"), data), "n_sample": ("run", n_sample)},
        coords={"op": ("run", ops), "dtype": ("run", dts),
                "hardware": ("run", np.array(["cpu:bench"] * runs))},
    )
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        ds.to_zarr(path, mode="w", zarr_format=2, consolidated=True,
                   encoding={"sample_abs": {"chunks": (chunk_runs, sample)}})
    return {"seconds": time.perf_counter() - t0, "elements": runs * sample,
            "bytes_on_disk": sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()),
            "peak_rss_mib": _rss_peak_mib()}


def _open(path: str, chunk_runs: int):
    import warnings

    import xarray as xr

    # the small label arrays are stored in one chunk; splitting them is harmless
    warnings.filterwarnings("ignore", message="The specified chunks separate")

    return xr.open_zarr(path, chunks={"run": chunk_runs}, consolidated=True)


def phase_readpass(path: str, chunk_runs: int) -> dict:
    ds = _open(path, chunk_runs)
    x = ds["sample_abs"].data
    t0 = time.perf_counter()
    m = float(abs(x).max().compute())
    dt = time.perf_counter() - t0
    return {"seconds": dt, "elements": int(x.size), "value": m}


def phase_calibrate(path: str, chunk_runs: int, k: int, p_bound: float, confidence: float,
                    p_quantile: float) -> dict:
    from tolstat.models.estimators import tail

    ds = _open(path, chunk_runs)
    n_el = int(ds["sample_abs"].size)
    t0 = time.perf_counter()
    top = tail.group_topk(ds, "sample_abs", k)
    t_topk = time.perf_counter() - t0
    bound = tail.topk_order_statistic_bound(top, p=p_bound, confidence=confidence)
    q = tail.upper_quantile(top, p=p_quantile, method="higher")
    dt = time.perf_counter() - t0
    groups = []
    for op in top["op"].values:
        for dtyp in top["dtype"].values:
            for hw in top["hardware"].values:
                sel = dict(op=op, dtype=dtyp, hardware=hw)
                groups.append({"op": str(op), "dtype": str(dtyp), "hardware": str(hw),
                               "n": int(top.n.sel(**sel)), "max": float(top.sel(**sel, rank=1)),
                               f"bound_p{p_bound}_c{confidence}": float(bound.sel(**sel)),
                               "order_rank": int(bound.order_rank.sel(**sel)),
                               f"quantile_higher_p{p_quantile}": float(q.sel(**sel))})
    return {"seconds": dt, "seconds_topk": t_topk, "elements": n_el, "k": k, "groups": groups}


def run_phase(args: argparse.Namespace) -> dict:
    """Run one phase in this process (threads or a LocalCluster) and add peak RSS."""
    import dask

    client = cluster = None
    if args.scheduler == "distributed":
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None, memory_limit="4GiB")
        client = Client(cluster)
    else:
        dask.config.set(scheduler="threads", num_workers=args.threads)
    try:
        if args.phase == "readpass":
            out = phase_readpass(args.path, args.chunk_runs)
        else:
            out = phase_calibrate(args.path, args.chunk_runs, args.k, args.p_bound,
                                  args.confidence, args.p_quantile)
        out["peak_rss_mib"] = _rss_peak_mib()
        if client is not None:
            peaks = client.run(_rss_peak_mib)
            out["worker_peak_rss_mib"] = {str(w): v for w, v in peaks.items()}
            out["client_scheduler_peak_rss_mib"] = out.pop("peak_rss_mib")
            out["peak_rss_mib"] = max(peaks.values())
    finally:
        if client is not None:
            client.close()
            cluster.close()
    out["elements_per_second"] = out["elements"] / out["seconds"]
    return out


def _sub(argv: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"phase {argv} failed:\n{res.stdout}\n{res.stderr}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default="/tmp/tolstat_bench/table.zarr")
    ap.add_argument("--runs", type=int, default=244_141)
    ap.add_argument("--sample", type=int, default=4096)
    ap.add_argument("--chunk-runs", type=int, default=1024)
    ap.add_argument("--k", type=int, default=20_000)
    ap.add_argument("--p-bound", type=float, default=0.9999)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--p-quantile", type=float, default=0.99999)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="reuse an existing table")
    ap.add_argument("--out", default=str(HERE / "results" / "outofcore.json"))
    ap.add_argument("--phase", choices=["generate", "readpass", "calibrate"], help=argparse.SUPPRESS)
    ap.add_argument("--scheduler", choices=["threads", "distributed"], default="threads",
                    help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.phase == "generate":
        print(json.dumps(generate(args.path, args.runs, args.sample, args.chunk_runs, args.seed)))
        return
    if args.phase is not None:
        print(json.dumps(run_phase(args)))
        return

    common = ["--path", args.path, "--runs", str(args.runs), "--sample", str(args.sample),
              "--chunk-runs", str(args.chunk_runs), "--k", str(args.k),
              "--p-bound", str(args.p_bound), "--confidence", str(args.confidence),
              "--p-quantile", str(args.p_quantile), "--threads", str(args.threads),
              "--seed", str(args.seed)]
    Path(args.path).parent.mkdir(parents=True, exist_ok=True)
    results: dict = {"runs": args.runs, "sample": args.sample, "elements": args.runs * args.sample,
                     "chunk_runs": args.chunk_runs, "machine": {"cpus": os.cpu_count()}}
    if not (args.keep and Path(args.path).exists()):
        shutil.rmtree(args.path, ignore_errors=True)
        results["generate"] = _sub(common + ["--phase", "generate"])
        print("generate", json.dumps(results["generate"]), flush=True)
    for sched in ("threads", "distributed"):
        r: dict = {}
        for phase in ("readpass", "calibrate"):
            r[phase] = _sub(common + ["--phase", phase, "--scheduler", sched])
            print(sched, phase, json.dumps({k: v for k, v in r[phase].items() if k != "groups"}),
                  flush=True)
        r["calibrate_over_readpass"] = r["calibrate"]["seconds"] / r["readpass"]["seconds"]
        results[sched] = r
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    from tolstat._base.util import atomic_write_text

    atomic_write_text(args.out, json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
