"""``tolstat.select`` with its default form against ``form="size_aware"`` on the same runs (issue 10).

Builds an error dataset of ``--runs`` runs (default 1e6) with operator statistics: 2000 runs
of a float16 kernel are collected with ``tolstat.from_pairs`` (a magnitude given, 8 element
samples per run) and tiled, with a random multiplicative jitter on every per-run error
variable so that no two runs are duplicates, and **a fresh reference fingerprint per run**:
a million independent runs, each its own unit, as a million runs on fresh inputs are. The
same runs with the tiled fingerprints (2,000 references, each shared by 500 runs: 500
units per group of 250,000 runs, each unit of 500 runs) are timed too (``shared
references``): there the scale forms' fitting units hold 100,000 runs per group, and their
quantile regressions run at their 20,000-point cap. In the same process it times

* ``select(ds, fp_budget=0.01)`` (default: form "auto" -> the operator combined score,
  certified with clusters/pooling machinery), and
* ``select(ds, fp_budget=0.01, form="size_aware")`` (the former noise-scale form),
* the default on the same runs without their operator statistics, as plain
  ``(actual, expected)`` pairs give them (the default then fits a scale form),

and reports the ratio (goal: default within 3x of size_aware), and **one pass over the
dataset** (one numpy reduction of every data variable along ``run``: reading everything
``select`` could read once), timed in the same process, with ``select / one pass`` for the
default (both datasets), ``size_aware``, ``allclose`` and ``form=None`` (the speed issue's goal: within
3x). Each time is the median of ``--repeats``, the calls interleaved. Results go to
``benchmarks/results/select.json`` (atomically, with the load average at the start and
the end).

Usage::

    PYTHONPATH=. python benchmarks/bench_select.py [--runs 1000000] [--groups 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

import tolstat
from tolstat._base.util import atomic_write_text

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


def one_pass(ds) -> float:
    """One numpy reduction of every data variable along ``run`` (the baseline)."""
    tot = 0.0
    for v in ds.data_vars:
        x = np.asarray(ds[v].values)
        if x.dtype.kind in "fiu" and x.size:
            tot += float(np.nanmax(x, axis=0).sum())
    return tot


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "select.json"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    t_build, shared = timed(lambda: dataset(args.runs, args.groups))  # 2,000 references, tiled
    # every run its own reference, as runs on fresh inputs: a million units
    ds = shared.assign(ref_fingerprint=("run", np.random.default_rng(1).integers(-2**62, 2**62, args.runs)))
    ds["ref_fingerprint"].attrs = shared["ref_fingerprint"].attrs
    # the same runs as plain (actual, expected) pairs give them: no operator statistics
    plain, plain_shared = (d.drop_vars([v for v in d.data_vars if d[v].attrs.get("role") == "op_statistic"])
                           for d in (ds, shared))
    calls = {"one pass": lambda: one_pass(ds),
             "default": lambda: tolstat.select(ds, fp_budget=0.01),
             "default, plain pairs": lambda: tolstat.select(plain, fp_budget=0.01),
             "size_aware": lambda: tolstat.select(ds, fp_budget=0.01, form="size_aware"),
             "allclose": lambda: tolstat.select(ds, fp_budget=0.01, form="allclose"),
             "form=None": lambda: tolstat.select(ds, fp_budget=0.01, form=None),
             "default, shared references": lambda: tolstat.select(shared, fp_budget=0.01),
             "default, plain pairs, shared references": lambda: tolstat.select(plain_shared, fp_budget=0.01)}
    times = {k: [] for k in calls}
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(args.repeats):
            for k, f in calls.items():
                t, out[k] = timed(f)
                times[k].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    t2 = out["default"]
    res = {
        "runs": args.runs, "groups": args.groups, "units": int(np.unique(ds["ref_fingerprint"].values).size),
        "units_shared_references": int(np.unique(shared["ref_fingerprint"].values).size),
        "build_s": t_build, "repeats": args.repeats,
        "size_aware_s": med["size_aware"], "default_s": med["default"],
        "ratio_default_over_size_aware": med["default"] / med["size_aware"],
        "one_pass_s": med["one pass"],
        "ratio_over_one_pass": {k: med[k] / med["one pass"] for k in calls if k != "one pass"},
        "seconds": med,
        "default_form": t2.entry("rowsum0", "float16").certificate["form"],
        "default_method": t2.entry("rowsum0", "float16").statistics["op_score"].method,
        "default_form_plain_pairs": out["default, plain pairs"].entry("rowsum0", "float16").certificate["form"],
        "goal": "select within 3x of one pass over the dataset",
        "load_start": load0, "load_end": os.getloadavg(),
        "machine": platform.machine(), "python": platform.python_version(), "tolstat": tolstat.__version__,
    }
    print(json.dumps(res, indent=1))
    atomic_write_text(args.out, json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
