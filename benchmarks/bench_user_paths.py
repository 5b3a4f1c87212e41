"""Speed and memory on the paths a user touches every day, each against a baseline
measured in the same run.

Run: ``PYTHONPATH=. python benchmarks/bench_user_paths.py [--evaluate] [--quick]``.
Prints one row per measurement with its goal and writes
``benchmarks/results/user_paths.json``. Times are medians of repeats, the compared
calls interleaved so that a change of machine load hits both; the load average at the
start and the end is recorded (on a shared machine absolute times move, the ratios less).

* ``import tolstat`` (fresh interpreter) and the pytest plugin's cost at pytest start-up;
* :func:`tolstat.check` on 1e6 float16 elements against one numpy pass
  ``np.abs(a.astype(np.float64) - b.astype(np.float64)).max()``, and its overhead on
  1,000 elements;
* :func:`tolstat.measure.noise.record_statistics` (one fused pass) against its numpy definition;
* streaming collection (``collect(store=...)``) against in-memory collection, per run
  (the marginal cost between two run counts; the fixed cost of a store separately);
* per-group quantiles against the numpy loop;
* with ``--evaluate``: peak RSS, wall time and CPU time of ``tolstat evaluate`` (default
  and ``--fp-budget 0.001``), each in its own process under ``/usr/bin/time -v``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def _median_pair(f, g, repeats):
    """Medians of ``f`` and ``g`` timed alternately (one warm-up call each)."""
    f()
    g()
    tf, tg = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        tf.append(time.perf_counter() - t)
        t = time.perf_counter()
        g()
        tg.append(time.perf_counter() - t)
    return statistics.median(tf), statistics.median(tg)


def _run_s(args, repeats=7):
    """Median wall time of a fresh process."""
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(args, env=ENV, check=True, capture_output=True, cwd=ROOT)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _import_s(stmt, before="pass"):
    """Seconds ``stmt`` takes in a fresh interpreter (after ``before``)."""
    code = f"{before}\nimport time\nt = time.perf_counter()\n{stmt}\nprint(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], env=ENV, check=True, capture_output=True, text=True,
                         cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def bench_import(rows, repeats):
    tol, base, plug = [], [], []
    for _ in range(repeats):  # alternate, so that load changes hit both
        tol.append(_import_s("import tolstat"))
        base.append(_import_s("import numpy"))
        plug.append(_import_s("import tolstat.checks.pytest_plugin", before="import pytest"))
    t_tol, t_np = statistics.median(tol), statistics.median(base)
    rows.append(dict(name="import tolstat (fresh process)", value=t_tol, unit="s", baseline=t_np,
                     baseline_name="import numpy", goal="< 0.3 s", met=t_tol < 0.3))
    rows.append(dict(name="import of the pytest plugin module (pytest already imported)",
                     value=statistics.median(plug), unit="s", goal="< 0.3 s", met=statistics.median(plug) < 0.3))


def _table(np, tolstat):
    rng = np.random.default_rng(0)
    pairs = [(e.astype(np.float16), e) for e in rng.standard_normal((300, 256))]
    ds = tolstat.from_pairs(pairs, op="add", dtype="float16", hardware="bench")
    return tolstat.select(ds, fp_budget=0.01, form=None)  # the max_abs table (no operator form)


def bench_check(rows, repeats):
    import numpy as np

    import tolstat

    table = _table(np, tolstat)
    rng = np.random.default_rng(1)
    for n, reps in ((1_000_000, repeats * 3), (1_000, repeats * 100)):
        e = rng.standard_normal(n)
        a = e.astype(np.float16)
        f = lambda: tolstat.check(a, e, op="add", dtype="float16", table=table)  # noqa: E731
        g = lambda: np.abs(a.astype(np.float64) - e.astype(np.float64)).max()  # noqa: E731
        tf, tg = _median_pair(f, g, reps)
        if n > 1000:
            rows.append(dict(name="check, 1e6 float16 elements (max_abs table)", value=tf, unit="s", baseline=tg,
                             baseline_name="one numpy pass |a - b|.max() with float64 upcast",
                             ratio=tf / tg, goal="<= 2x the numpy pass", met=tf / tg <= 2))
        else:
            rows.append(dict(name="check overhead, 1e3 float16 elements", value=tf - tg, unit="s", baseline=tg,
                             baseline_name="one numpy pass", goal="< 0.2 ms", met=tf - tg < 2e-4))


def bench_noise(rows, repeats):
    import numpy as np

    from tolstat.measure import noise

    rng = np.random.default_rng(2)
    e = rng.standard_normal((1000, 1000))
    a = e.astype(np.float16)
    m = np.abs(e) + 1.0
    kw = dict(dtype="float16", magnitude=m, K=64.0, rowwise=True)

    def numpy_def():
        noise.run_statistics(a, e, **kw)
        noise.run_statistics(a, e, shape=noise.MID_SHAPE, **kw)

    tf, tg = _median_pair(lambda: noise.record_statistics(a, e, **kw), numpy_def, repeats)
    rows.append(dict(name="record_statistics, 1e6 elements, row-wise", value=tf, unit="s", baseline=tg,
                     baseline_name="numpy definition (run_statistics twice)", ratio=tf / tg,
                     goal="faster than the numpy definition", met=tf < tg))


def _kernel(a, b):
    import numpy as np

    return (a.astype(np.float16) @ b.astype(np.float16)).astype(np.float16)


def _reference(a, b):
    import numpy as np

    return a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)


def _make(rng):
    return (rng.standard_normal((64, 64)), rng.standard_normal((64, 64)))


def bench_stream(rows, runs):
    """Per-run cost of streaming vs in-memory collection: the marginal cost between
    ``runs`` and ``3 * runs`` runs (what 200,000 runs pay), and the fixed cost of a store
    (creating it, reopening it at the end) separately."""
    import zarr  # noqa: F401  (imported once for both: a one-time cost, not per run)

    import tolstat

    # op_model=False: the plain runs the recorded figures were measured on (not tolstat.ops' statistics)
    kw = dict(op="matmul", dtype="fp16", hardware="bench", seed=0,
              options=tolstat.CollectOptions(progress=False, op_model=False))
    tolstat.collect(_kernel, _reference, _make, runs=3, **kw)
    d = Path(tempfile.mkdtemp())
    sizes = (runs, 3 * runs)
    tm = {n: [] for n in sizes}
    ts = {n: [] for n in sizes}
    try:
        for rep in range(3):
            for n in sizes:  # alternated, so that load changes hit both
                t = time.perf_counter()
                tolstat.collect(_kernel, _reference, _make, runs=n, **kw)
                tm[n].append(time.perf_counter() - t)
                t = time.perf_counter()
                tolstat.collect(_kernel, _reference, _make, runs=n, store=d / f"s{rep}_{n}.zarr", **kw)
                ts[n].append(time.perf_counter() - t)
    finally:
        shutil.rmtree(d)
    med = statistics.median
    m_run = (med(tm[sizes[1]]) - med(tm[sizes[0]])) / (sizes[1] - sizes[0])
    s_run = (med(ts[sizes[1]]) - med(ts[sizes[0]])) / (sizes[1] - sizes[0])
    fixed = med(ts[sizes[0]]) - sizes[0] * s_run - (med(tm[sizes[0]]) - sizes[0] * m_run)
    total = med(ts[sizes[0]]) / med(tm[sizes[0]])
    rows.append(dict(name=f"streaming collection per run (marginal, {sizes[0]} -> {sizes[1]} runs of a 64x64 "
                          "float16 matmul)", value=s_run, unit="s/run", baseline=m_run,
                     baseline_name="in-memory collection", ratio=s_run / m_run,
                     goal="<= 1.5x in-memory per run", met=s_run / m_run <= 1.5,
                     note=f"plus a fixed {fixed:.2f} s per store (create, reopen); {sizes[0]} runs in all: "
                          f"{total:.2f}x"))


def bench_quantiles(rows, repeats, quick):
    import numpy as np

    from tolstat.models.estimators import quantile_groups

    rng = np.random.default_rng(3)
    G, N = (100, 100_000) if quick else (400, 100_000)
    x = rng.standard_normal((G, N))
    q = [0.5, 0.99, 0.999]
    load0 = os.getloadavg()[0]
    ours, loop = _median_pair(lambda: quantile_groups(x, q), lambda: np.array([np.quantile(r, q) for r in x]),
                              max(repeats, 9))
    load1 = os.getloadavg()[0]
    assert np.array_equal(quantile_groups(x, q)[0], np.array([np.quantile(r, q) for r in x]))
    rows.append(dict(name=f"per-group quantiles {G}x{N}, p = {q}", value=ours, unit="s", baseline=loop,
                     baseline_name="numpy loop of np.quantile per group", ratio=loop / ours,
                     goal=">= 10x the numpy loop", met=loop / ours >= 10,
                     note=f"1-min load average {load0:.1f} before, {load1:.1f} after"))


def _time_v(args):
    out = subprocess.run(["/usr/bin/time", "-v", *args], env=ENV, capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    get = lambda pat: re.search(pat, out.stderr).group(1)  # noqa: E731
    cpu = float(get(r"User time \(seconds\): ([\d.]+)")) + float(get(r"System time \(seconds\): ([\d.]+)"))
    wall = get(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)")
    parts = [float(p) for p in wall.split(":")]
    wall_s = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    rss = int(get(r"Maximum resident set size \(kbytes\): (\d+)")) * 1024
    table = out.stdout[out.stdout.find("method"):out.stdout.find("\nwrote")].strip()
    return rss, cpu, wall_s, table


def bench_evaluate(rows):
    out = Path(tempfile.mkdtemp())
    try:
        for label, extra, goal_gb in (("default", [], 1.0), ("--fp-budget 0.001", ["--fp-budget", "0.001"], 2.0)):
            try:
                rss, cpu, wall, table = _time_v([sys.executable, "-m", "tolstat.cli.main", "evaluate", "--no-plots",
                                                 "--no-progress", "-o", str(out / "o"), *extra])
            except RuntimeError as exc:  # the run failed: say so, keep the other rows
                rows.append(dict(name=f"tolstat evaluate {label}", value=float("nan"), unit="-",
                                 goal=f"< {goal_gb:g} GB", met=None, note=f"failed: {str(exc)[-300:]}"))
                continue
            rows.append(dict(name=f"tolstat evaluate {label}: peak RSS", value=rss / 2**30, unit="GiB",
                             goal=f"< {goal_gb:g} GB", met=rss < goal_gb * 1e9, table=table))
            rows.append(dict(name=f"tolstat evaluate {label}: wall time", value=wall, unit="s",
                             cpu_s=cpu, goal="< 45 s on 2 cores" if label == "default" else "-",
                             met=(wall < 45) if label == "default" else None,
                             note=f"CPU time (user+sys) {cpu:.1f} s; 1-min load average at the end "
                                  f"{os.getloadavg()[0]:.1f}"))
    finally:
        shutil.rmtree(out)


def _fmt(v, unit):
    if unit == "s" and abs(v) < 1:
        return f"{v * 1e3:.3f} ms"
    if unit == "s/run":
        return f"{v * 1e3:.2f} ms/run"
    return f"{v:.3f} {unit}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and smaller sizes")
    ap.add_argument("--evaluate", action="store_true", help="also run tolstat evaluate twice (minutes)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "user_paths.json"))
    args = ap.parse_args(argv)
    reps = 3 if args.quick else 7
    load0 = os.getloadavg()
    rows: list[dict] = []
    bench_import(rows, reps)
    bench_check(rows, reps)
    bench_noise(rows, reps)
    bench_stream(rows, 150 if args.quick else 600)
    bench_quantiles(rows, reps, args.quick)
    if args.evaluate:
        bench_evaluate(rows)
    load1 = os.getloadavg()
    print(f"load average (1, 5, 15 min) at start {load0}, at end {load1}; {os.cpu_count()} CPUs")
    for r in rows:
        base = f"  baseline {_fmt(r['baseline'], r['unit'])} ({r['baseline_name']})" if "baseline" in r else ""
        ratio = f"  ratio {r['ratio']:.2f}x" if "ratio" in r else ""
        met = {True: "MET", False: "NOT MET", None: ""}[r["met"]]
        note = f"  ({r['note']})" if r.get("note") else ""
        print(f"{r['name']}: {_fmt(r['value'], r['unit'])}{ratio}{base}  goal {r['goal']}  {met}{note}")
    doc = {"machine": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
           "loadavg_start": load0, "loadavg_end": load1, "quick": args.quick,
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    path = Path(args.out)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    os.replace(tmp, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
