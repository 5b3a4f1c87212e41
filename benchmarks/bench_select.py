"""``tolstat.select`` with its default form against ``form="size_aware"`` on the same runs (issue 10).

Builds an error dataset of ``--runs`` runs (default 1e6) with operator statistics: 2000 runs
of a float16 kernel are collected with ``tolstat.from_pairs`` (a magnitude given, 8 element
samples per run) and tiled, with a random multiplicative jitter on every per-run error
variable so that no two runs are duplicates. In the same process it times

* ``select(ds, fp_budget=0.01)`` (default: form "auto" -> the operator combined score,
  certified with clusters/pooling machinery), and
* ``select(ds, fp_budget=0.01, form="size_aware")`` (the former noise-scale form),

and reports the ratio. Goal: default within 3x of size_aware. Results go to
``benchmarks/results/select.json``.

Usage::

    PYTHONPATH=. python benchmarks/bench_select.py [--runs 1000000] [--groups 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import numpy as np

import tolstat

HERE = Path(__file__).resolve().parent


def dataset(runs: int, groups: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(2000):
        x = rng.standard_normal((16, 16))
        e = x.sum(axis=1) / 4
        a = (x.astype(np.float16).sum(axis=1, dtype=np.float16) / np.float16(4)).astype(np.float16)
        pairs.append((a, e, np.abs(x).sum(axis=1) / 4))
    base = tolstat.from_pairs(pairs, op="rowsum", dtype="float16", options=tolstat.CollectOptions(sample_size=8, progress=False))
    idx = np.tile(np.arange(base.sizes["run"]), -(-runs // base.sizes["run"]))[:runs]
    ds = base.isel(run=idx)
    jit = lambda: rng.uniform(0.9, 1.1, runs)  # noqa: E731
    err = jit()  # one factor per run for the absolute errors, so samples stay below the max
    upd = {}
    for v in ds.data_vars:
        role = ds[v].attrs.get("role")
        if role == "op_statistic" or v == "max_rel":
            upd[v] = ("run", np.asarray(ds[v].values) * jit())
        elif v in ("max_abs", "mean_abs"):
            upd[v] = ("run", np.asarray(ds[v].values) * err)
    upd["sample_abs"] = (ds["sample_abs"].dims, ds["sample_abs"].values * err[:, None])
    upd["op"] = ("run", np.array([f"rowsum{k}" for k in range(groups)])[np.arange(runs) % groups])
    upd["run_index"] = ("run", np.arange(runs))
    out = ds.assign(upd)
    for v in upd:
        out[v].attrs = ds[v].attrs
    return out


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--out", default=str(HERE / "results" / "select.json"))
    args = ap.parse_args()
    t_build, ds = timed(lambda: dataset(args.runs, args.groups))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t_size, t1 = timed(lambda: tolstat.select(ds, fp_budget=0.01, form="size_aware"))
        t_def, t2 = timed(lambda: tolstat.select(ds, fp_budget=0.01))
    res = {
        "runs": args.runs, "groups": args.groups, "build_s": t_build,
        "size_aware_s": t_size, "default_s": t_def, "ratio_default_over_size_aware": t_def / t_size,
        "default_form": t2.entry("rowsum0", "float16").certificate["form"],
        "default_method": t2.entry("rowsum0", "float16").statistics["op_score"].method,
        "machine": platform.machine(), "python": platform.python_version(), "tolstat": tolstat.__version__,
    }
    print(json.dumps(res, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
