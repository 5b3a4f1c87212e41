"""What one :func:`tolstat.check` costs, for a table of every form, against one numpy pass.

Run: ``PYTHONPATH=. python benchmarks/bench_check_forms.py [--quick] [--compare DIR]``.

One run builds a table of every form from the same synthetic calibration pairs (float16,
256 elements, a few ULP of noise; ``form="auto"``, the default of :func:`tolstat.select`,
which on plain pairs picks the better of ``allclose`` and ``size_aware``; ``form=None``
(``max_abs``); ``allclose``; ``size_aware`` and ``normalised`` and ``baseline`` (pairs with
the covariates ``K`` and ``baseline_max_abs``); and the operator form, ``form="auto"`` on
pairs with a magnitude array, checked with ``CheckOptions(magnitude=)``), then times, at 1e3, 1e5, 1e6
and 1e7 elements, one numpy pass ``np.abs(a.astype(np.float64) - e).max()`` and ``check``
of two outputs: a noisy one (a few ULP off, what a reduction kernel gives) and a correctly
rounded one (decision value 0). The two are timed alternately, in batches of calls long
enough for the clock; each figure is the minimum over the repeats (a shared machine's load
slows single repeats, not the best one). The load average (``os.getloadavg()``) at the
start and the end is printed and written.

Prints one line per (size, form, output) with the time per call and its ratio to the
numpy pass, and writes ``benchmarks/results/check_forms.md`` (and ``check_forms.json``).

``--compare DIR`` runs the same measurements with the tolstat found under ``DIR`` (e.g. a
``git archive`` of an earlier commit) in a subprocess first, and adds its ratios as the
"before" columns: both sets of ratios are measured in one session, each against its own
numpy pass.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SIZES = (1_000, 100_000, 1_000_000, 10_000_000)
FORMS = ("auto", "None", "allclose", "size_aware", "normalised", "baseline", "operator")
K = 64
EPS16 = float(np.finfo(np.float16).eps)


def _pair(rng: np.random.Generator, n: int, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """A float16 output of a reduction of length ``k`` and its float64 reference."""
    e = rng.standard_normal(n) * np.sqrt(k)
    a = (e + rng.standard_normal(n) * 0.5 * EPS16 * (np.abs(e) + np.sqrt(k))).astype(np.float16)
    return a, e


def build_tables(tolstat) -> dict:
    """One table per form, all from the same calibration pairs (seeded)."""
    rng = np.random.default_rng(0)
    plain, cov, mag = [], [], []
    for _ in range(400):
        k = int(rng.choice([16, 64, 256]))
        a, e = _pair(rng, 256, k)
        base = float(np.abs(e - (e + rng.standard_normal(256) * 1e-3 * np.sqrt(k))).max())
        plain.append((a, e))
        cov.append((a, e, None, {"K": k, "baseline_max_abs": base}))
        mag.append((a, e, np.abs(e) + np.sqrt(k)))
    kw = dict(op="sum", dtype="float16", hardware="bench")
    ds = tolstat.from_pairs(plain, **kw)
    dsc = tolstat.from_pairs(cov, **kw)
    dsm = tolstat.from_pairs(mag, **kw)
    return {
        "auto": tolstat.select(ds, fp_budget=0.01),
        "None": tolstat.select(ds, fp_budget=0.01, form=None),
        "allclose": tolstat.select(ds, fp_budget=0.01, form="allclose"),
        "size_aware": tolstat.select(dsc, fp_budget=0.01, form="size_aware"),
        "normalised": tolstat.select(dsc, fp_budget=0.01, form="normalised"),
        "baseline": tolstat.select(dsc, fp_budget=0.01, form="baseline"),
        "operator": tolstat.select(dsm, fp_budget=0.01),
    }


def _describe(table) -> str:
    ent = table.entry("sum", "float16", "bench")
    if ent.operator:
        return "operator (op_score)"
    if ent.scale is None:
        return ent.max_statistic
    return f"{ent.max_statistic}, scale {ent.scale.form}"


def _check_kwargs(form: str, table, e: np.ndarray) -> dict:
    kw = dict(op="sum", dtype="float16", table=table, hardware="bench")
    if form == "size_aware":
        kw["covariates"] = {"K": K}
    elif form == "baseline":
        kw["covariates"] = {"baseline_max_abs": 8e-3}
    elif form == "operator":
        import tolstat

        kw["options"] = tolstat.CheckOptions(magnitude=np.abs(e) + np.sqrt(K))
    return kw


def _batch(f, k: int) -> float:
    t = time.perf_counter()
    for _ in range(k):
        f()
    return (time.perf_counter() - t) / k


def _min_pair(f, g, repeats: int, batch_s: float = 2e-3) -> tuple[float, float]:
    """Minimum time per call of ``f`` and ``g``, timed alternately in batches."""
    f()
    g()
    t1 = _batch(f, 1)
    k = max(1, int(batch_s / max(t1, 1e-7)))
    bf, bg = np.inf, np.inf
    for _ in range(repeats):
        bg = min(bg, _batch(g, k))
        bf = min(bf, _batch(f, k))
    return bf, bg


def _where(path: Path) -> str:
    """``path`` relative to the repository when it lies in it (no machine paths in results)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def measure(quick: bool = False) -> dict:
    import tolstat

    load_start = os.getloadavg()
    t0 = time.perf_counter()
    tables = build_tables(tolstat)
    t_build = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    rows = []
    sizes = SIZES[:3] if quick else SIZES
    for n in sizes:
        a, e = _pair(rng, n)
        outputs = {"noisy": a, "correctly rounded": e.astype(np.float16)}
        repeats = {1_000: 15, 100_000: 9, 1_000_000: 7, 10_000_000: 3}[n]
        if quick:
            repeats = max(2, repeats // 3)
        for form in FORMS:
            table = tables[form]
            kw = _check_kwargs(form, table, e)
            for out_name, out in outputs.items():
                r = tolstat.check(out, e, **kw)

                def f(out=out, kw=kw):
                    return tolstat.check(out, e, **kw)

                def g(out=out):
                    return np.abs(out.astype(np.float64) - e).max()

                tf, tg = _min_pair(f, g, repeats)
                rows.append(dict(n=n, form=form, output=out_name, check_s=tf, numpy_s=tg, ratio=tf / tg,
                                 passed=bool(r.passed), correctly_rounded=bool(r.correctly_rounded)))
                print(f"n={n:>9,d} {form:<11s} {out_name:<18s} check {tf * 1e3:9.3f} ms  numpy {tg * 1e3:9.3f} ms  "
                      f"ratio {tf / tg:6.2f}  passed={r.passed}", flush=True)
    return dict(load_start=load_start, load_end=os.getloadavg(), build_s=t_build, tolstat=_where(Path(tolstat.__file__).parent),
                forms={k: _describe(v) for k, v in tables.items()}, rows=rows,
                python=platform.python_version(), numpy=np.__version__, machine=platform.machine(),
                cpus=os.cpu_count())


def _markdown(res: dict, before: dict | None) -> str:
    def load(r: dict) -> str:
        return (f"{r['load_start'][0]:.2f} at the start, {r['load_end'][0]:.2f} at the end "
                f"(1-minute load average, {r['cpus']} cores)")

    lines = ["# `tolstat.check` per form against one numpy pass", "",
             "Written by `benchmarks/bench_check_forms.py`. Ratio: the minimum time per call of `check` over the "
             "minimum of one numpy pass `np.abs(a.astype(np.float64) - e).max()` on the same arrays, timed "
             "alternately in the same process (float16 output, float64 reference). Tables: one per form, "
             "calibrated on the same 400 synthetic pairs of 256 elements; `auto` is the default "
             "`tolstat.select(ds, fp_budget=0.01)` on plain pairs.", "",
             f"Load: {load(res)}.", ""]
    if before is not None:
        lines += [f"Before (the code of the previous commit, run with `--compare`): load {load(before)}.", ""]
    lines += ["Forms: " + "; ".join(f"`{k}`: {v}" for k, v in res["forms"].items()) + ".", ""]
    bmap = {(r["n"], r["form"], r["output"]): r for r in (before or {}).get("rows", [])}
    head = "| elements | form | output | check ms/call | numpy ms | ratio |"
    sep = "|---:|---|---|---:|---:|---:|"
    if before is not None:
        head += " before: ms/call | before: ratio |"
        sep += "---:|---:|"
    lines += [head, sep]
    for r in res["rows"]:
        line = (f"| {r['n']:.0e} | {r['form']} | {r['output']} | {r['check_s'] * 1e3:.3f} | {r['numpy_s'] * 1e3:.3f} "
                f"| {r['ratio']:.2f} |")
        if before is not None:
            b = bmap.get((r["n"], r["form"], r["output"]))
            line += f" {b['check_s'] * 1e3:.3f} | {b['ratio']:.2f} |" if b else " | |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes up to 1e6, fewer repeats")
    ap.add_argument("--compare", metavar="DIR", help="also measure the tolstat under DIR (the 'before' columns)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the --compare subprocess
    ap.add_argument("--out", default=str(RESULTS / "check_forms.md"), help="markdown output")
    args = ap.parse_args(argv)
    if args.json:
        print("JSON:" + json.dumps(measure(args.quick)))
        return
    before = None
    if args.compare:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(args.compare))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--json"] + (["--quick"] if args.quick else [])
        print(f"# before: the tolstat under {args.compare}", flush=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                              cwd=os.path.abspath(args.compare))
        print(proc.stdout.rsplit("JSON:", 1)[0], end="")
        before = json.loads(proc.stdout.rsplit("JSON:", 1)[1])
        before["path"] = _where(Path(args.compare))  # no machine path in the results
        print("# after: this tolstat", flush=True)
    res = measure(args.quick)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from tolstat._base.util import atomic_write_text  # the tolstat measured (PYTHONPATH) writes it

    atomic_write_text(out, _markdown(res, before))
    atomic_write_text(out.with_suffix(".json"), json.dumps(dict(after=res, before=before), indent=1))
    print(f"load average {res['load_start'][0]:.2f} -> {res['load_end'][0]:.2f}; wrote {out}")


if __name__ == "__main__":
    main()
