"""Zero-run tolerances on the embedded corpus: FP on correct runs and recall, beside 1e-2 and torch's defaults.

Two tables (``docs/ops.md``, "Tolerances from zero runs"):

1. **Zero runs.** Per (op, dtype), the model-based threshold of
   :func:`tolstat.ops.tolerance` at ``fp_budget=0.01`` per check, derived from each case's
   inputs alone (the corpus op's torch call, :mod:`tolstat.corpus._magnitude`), decides
   every held-out run: its false-positive rate on the correct controls (every correct
   variant on every case) and its recall on the buggy runs (every bug of the op on the same
   cases; *detectable*: the bug's output differs from its base variant's by more than one
   ULP somewhere, as ``tolstat evaluate`` defines it), beside ``atol=rtol=1e-2`` and torch's
   ``assert_close`` defaults (fp16 rtol 1e-3 atol 1e-5; bf16 rtol 1.6e-2 atol 1e-5).
2. **Tiny budgets from few runs.** Per (op, dtype), the model's constant is fitted on 100
   correct runs (:func:`tolstat.ops.fit_tolerance`: the first ``ceil(100 / variants)``
   calibration cases, seed 0, through every correct variant), then its threshold at
   1e-2 .. 1e-6 per check decides the same held-out runs: realised FP per op (with the
   worst control's ratio to its threshold) and recall.

The held-out cases are those of ``tolstat evaluate`` (seed ``seed + 1``, quick shapes of
``EvalConfig.preset("quick")``), ``--n-test`` of them per (op, dtype). Usage::

    python benchmarks/zero_run_table.py [--n-test 400] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BUDGETS = (1e-2, 1e-3, 1e-4, 1e-5, 1e-6)
N_FIT = 100
RULES = ("zero_run", "zero_run stores=1", "atol=rtol=1e-2", "torch-defaults")
TORCH = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5)}  # assert_close (rtol, atol)


def _allclose_fails(a: np.ndarray, e: np.ndarray, rtol: float, atol: float) -> bool:
    """``|a - e| <= atol + rtol |e|`` fails somewhere (matched non-finite pairs pass)."""
    a = a.astype(np.float64)
    with np.errstate(all="ignore"):
        ok = np.abs(a - e) <= atol + rtol * np.abs(e)
    ok |= (a == e) | (np.isnan(a) & np.isnan(e))
    return bool(not ok.all())


def _call(case: Any, dtype: str) -> tuple[str, tuple, dict]:
    from tolstat import corpus
    from tolstat.corpus._magnitude import _CALLS

    name, call = _CALLS[case.op]
    args, kwargs = call(**case._cast(corpus.np_dtype(dtype)), **case.params)
    return name, args, kwargs


def _fit(op: str, dtype: str, seed: int, quick: bool) -> dict[str, Any]:
    """The fitted constants (theory floor 1 and pure fit) on N_FIT correct runs."""
    from tolstat import corpus
    from tolstat.ops import fit_tolerance

    spec = corpus.OPS[op]
    runs = []
    for case in corpus.iter_cases(op, dtype, n=math.ceil(N_FIT / len(spec.variants)), seed=seed, quick=quick):
        ref = corpus.run_reference(case, dtype)
        name, args, kwargs = _call(case, dtype)
        runs += [(corpus.run_kernel(k, case, dtype), ref, args, kwargs) for k in spec.variants.values()]
    runs = runs[:N_FIT]
    try:
        fitted = fit_tolerance(runs, op=name, dtype=dtype)
        pure = fit_tolerance(runs, op=name, dtype=dtype, floor=0.0).scale
        s1 = fit_tolerance(runs, op=name, dtype=dtype, stores=1).scale
    except ValueError as exc:  # a run the model cannot describe
        return {"scale": math.nan, "pure": math.nan, "s1": math.nan, "refused": str(exc), "runs": len(runs)}
    return {"scale": fitted.scale, "pure": pure, "s1": s1, "refused": "", "runs": len(runs), "label": fitted.label}


def _heldout(op: str, dtype: str, n_test: int, seed: int, quick: bool) -> list[dict[str, Any]]:
    """One record per held-out run: kind, detectable, the rules' verdicts, excess and size."""
    from tolstat import corpus
    from tolstat.measure.metrics import ulp_distance
    from tolstat.ops import tolerance

    spec = corpus.OPS[op]
    bugs = [b for b in corpus.BUGS.values() if b.op == op]
    rtol, atol = TORCH[dtype]
    recs = []
    for case in corpus.iter_cases(op, dtype, n=n_test, seed=seed, quick=quick):
        ref = corpus.run_reference(case, dtype)
        name, args, kwargs = _call(case, dtype)
        tol = tolerance(name, dtype, args, kwargs, fp_budget=0.01)
        tol1 = tolerance(name, dtype, args, kwargs, fp_budget=0.01, stores=1)
        outs = {v: corpus.run_kernel(k, case, dtype) for v, k in spec.variants.items()}
        items = [("control", v, "", True, out) for v, out in outs.items()]
        for b in bugs:
            out = corpus.run_kernel(b.kernel, case, dtype)
            with np.errstate(all="ignore"):
                det = bool(np.any(ulp_distance(out, outs[b.base], dtype) > 1.0))
            items.append(("bug", b.base, b.name, det, out))
        for kind, variant, bug, det, out in items:
            recs.append({"kind": kind, "variant": variant, "bug": bug, "detectable": det,
                         "zero_run": tol.failed(out, ref), "zero_run stores=1": tol1.failed(out, ref),
                         "excess": tol.excess(out, ref), "excess_s1": tol1.excess(out, ref), "n": tol.n,
                         "atol=rtol=1e-2": _allclose_fails(out, ref, 1e-2, 1e-2),
                         "torch-defaults": _allclose_fails(out, ref, rtol, atol)})
    return recs


def _tail(b: float, n: np.ndarray) -> np.ndarray:
    return np.sqrt(2.0 * np.log(2.0 * np.maximum(n, 1) / b))


def _rates(recs: list[dict[str, Any]], fails: np.ndarray) -> dict[str, Any]:
    ctrl = np.array([r["kind"] == "control" for r in recs])
    bug = ~ctrl
    det = bug & np.array([r["detectable"] for r in recs])
    return {"controls": int(ctrl.sum()), "fp": int(fails[ctrl].sum()), "bugs": int(bug.sum()),
            "caught": int(fails[bug].sum()), "detectable": int(det.sum()), "caught_detectable": int(fails[det].sum())}


def _group(op: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    fit = _fit(op, dtype, args.seed, True)
    recs = _heldout(op, dtype, args.n_test, args.seed + 1, True)
    excess = {"scale": np.array([r["excess"] for r in recs]), "pure": np.array([r["excess"] for r in recs]),
              "s1": np.array([r["excess_s1"] for r in recs])}
    e = excess["scale"]
    n = np.array([r["n"] for r in recs], dtype=np.float64)
    out: dict[str, Any] = {"op": op, "dtype": dtype, "fit": fit, "rules": {}, "tiny": {}}
    for rule in RULES:
        out["rules"][rule] = _rates(recs, np.array([r[rule] for r in recs]))
    # the zero-run verdict is the excess beyond the output rounding against lambda(b / n) (c = 1)
    agree = np.array([r["zero_run"] for r in recs]) == (e > _tail(0.01, n))
    out["zero_run_excess_agreement"] = float(agree.mean())
    ctrl = np.array([r["kind"] == "control" for r in recs])
    out["variants"] = {}
    for v in dict.fromkeys(r["variant"] for r in recs if r["kind"] == "control"):
        vr = [r for r in recs if r["kind"] == "control" and r["variant"] == v]
        out["variants"][v] = {"controls": len(vr), "zero_run_fp": sum(r["zero_run"] for r in vr),
                              "stores1_fp": sum(r["zero_run stores=1"] for r in vr)}
    for c_key in ("scale", "pure", "s1"):
        c, e = fit[c_key], excess[c_key]
        for b in BUDGETS:
            if not math.isfinite(c):
                continue
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = np.where(e > 0, e / (c * _tail(b, n)), 0.0)
            row = _rates(recs, ratio > 1.0)
            row["worst_control_ratio"] = float(ratio[ctrl].max()) if ctrl.any() else math.nan
            out["tiny"][f"{c_key}@{b:g}"] = row
    return out


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100.0 * k / n:.1f}%)" if n else "-"


def _sum(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(r[k] for r in rows) for k in ("controls", "fp", "bugs", "caught", "detectable",
                                                  "caught_detectable")}


def _table1(groups: list[dict[str, Any]]) -> str:
    rules = RULES
    head = ["op", "dtype", "controls", "bugs (detectable)"]
    for r in rules:
        head += [f"{r} FP", f"{r} recall (detectable)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups + [None]:
        rows = [g["rules"][r] for r in rules] if g else [_sum([x["rules"][r] for x in groups]) for r in rules]
        cells = [g["op"] if g else "**all**", g["dtype"] if g else "", str(rows[0]["controls"]),
                 f"{rows[0]['bugs']} ({rows[0]['detectable']})"]
        for x in rows:
            cells += [_pct(x["fp"], x["controls"]), _pct(x["caught_detectable"], x["detectable"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _table2(groups: list[dict[str, Any]]) -> str:
    ops = list(dict.fromkeys(g["op"] for g in groups))
    head = ["op", "c fitted (fp16, bf16)", "c pure fit (fp16, bf16)", "controls"]
    head += [f"FP @{b:g}" for b in BUDGETS] + ["worst control ratio @1e-5"]
    head += [f"recall (det.) @{b:g}" for b in BUDGETS] + ["FP @1e-5, pure fit", "recall @1e-5, pure fit"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops + ["**all**"]:
        gs = [g for g in groups if g["op"] == op or op == "**all**"]
        ok = [g for g in gs if g["tiny"]]
        cs = ", ".join(f"{g['fit']['scale']:.3g}" for g in gs) if op != "**all**" else ""
        ps = ", ".join(f"{g['fit']['pure']:.3g}" for g in gs) if op != "**all**" else ""
        rows = {b: _sum([g["tiny"][f"scale@{b:g}"] for g in ok]) for b in BUDGETS}
        pure = _sum([g["tiny"]["pure@1e-05"] for g in ok])
        worst = max((g["tiny"]["scale@1e-05"]["worst_control_ratio"] for g in ok), default=math.nan)
        cells = [op, cs, ps, str(rows[BUDGETS[0]]["controls"])]
        cells += [f"{rows[b]['fp']}" for b in BUDGETS] + [f"{worst:.2f}"]
        cells += [_pct(rows[b]["caught_detectable"], rows[b]["detectable"]) for b in BUDGETS]
        cells += [str(pure["fp"]), _pct(pure["caught_detectable"], pure["detectable"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _table_variants(groups: list[dict[str, Any]]) -> str:
    lines = ["| op | dtype | correct variant | controls | zero_run FP | zero_run stores=1 FP |",
             "|---|---|---|---|---|---|"]
    for g in groups:
        for v, x in g["variants"].items():
            if x["zero_run_fp"] or x["stores1_fp"]:
                lines.append(f"| {g['op']} | {g['dtype']} | {v} | {x['controls']} | "
                             f"{_pct(x['zero_run_fp'], x['controls'])} | {_pct(x['stores1_fp'], x['controls'])} |")
    return "\n".join(lines)


def _table_s1(groups: list[dict[str, Any]]) -> str:
    ops = list(dict.fromkeys(g["op"] for g in groups))
    head = ["op", "c fitted, stores=1 (fp16, bf16)", "controls"] + [f"FP @{b:g}" for b in BUDGETS]
    head += ["worst control ratio @1e-5"] + [f"recall (det.) @{b:g}" for b in (1e-2, 1e-5)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops + ["**all**"]:
        gs = [g for g in groups if g["op"] == op or op == "**all**"]
        rows = {b: _sum([g["tiny"][f"s1@{b:g}"] for g in gs if f"s1@{b:g}" in g["tiny"]]) for b in BUDGETS}
        worst = max((g["tiny"]["s1@1e-05"]["worst_control_ratio"] for g in gs if "s1@1e-05" in g["tiny"]),
                    default=math.nan)
        cells = [op, ", ".join(f"{g['fit']['s1']:.3g}" for g in gs) if op != "**all**" else "",
                 str(rows[BUDGETS[0]]["controls"])]
        cells += [str(rows[b]["fp"]) for b in BUDGETS] + [f"{worst:.2f}"]
        cells += [_pct(rows[b]["caught_detectable"], rows[b]["detectable"]) for b in (1e-2, 1e-5)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from threadpoolctl import threadpool_limits

    from tolstat import corpus
    from tolstat._base.util import atomic_write_text
    from tolstat.assess.evaluation import EvalConfig
    from tolstat.ops import MODEL_LABEL

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-test", type=int, default=400, help="held-out cases per (op, dtype)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    cfg = EvalConfig.preset("quick")
    args.seed = cfg.seed
    t0 = time.perf_counter()
    groups = []
    with threadpool_limits(limits=1, user_api="blas"):
        for op in sorted(corpus.OPS):
            for dt in cfg.dtypes:
                groups.append(_group(op, dt, args))
                print(f"{op} {dt}: {time.perf_counter() - t0:.0f} s", flush=True)
    secs = time.perf_counter() - t0
    settings = (f"Held-out: {args.n_test} cases per (op, dtype) (seed {cfg.seed + 1}, quick shapes) through every "
                f"correct variant (controls) and every bug (buggy runs); fit: {N_FIT} correct runs per (op, dtype) "
                f"(seed {cfg.seed}). Label: \"{MODEL_LABEL}\". Produced by `python benchmarks/zero_run_table.py "
                f"--n-test {args.n_test}` in {secs:.0f} s.")
    md = ("# Tolerances from zero runs on the corpus\n\n" + settings
          + "\n\n## Zero runs: fp_budget=0.01 per check, from the inputs alone\n\n" + _table1(groups)
          + "\n\nThe correct variants that fail the zero-run threshold (every other variant: no false positive):\n\n"
          + _table_variants(groups)
          + "\n\n## Tiny budgets: the model's constant fitted on 100 runs, per check budget\n\n"
          + "FP: false positives among the held-out controls (count); c: the fitted constant "
            "(at least the theory's 1); pure fit: without that floor.\n\n" + _table2(groups)
          + "\n\nThe same fit on the model with one intermediate store (`stores=1`):\n\n" + _table_s1(groups) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "zero_run.md", md)
    doc = {"settings": settings, "seconds": secs, "n_test": args.n_test, "n_fit": N_FIT, "budgets": BUDGETS,
           "label": MODEL_LABEL, "groups": groups}
    atomic_write_text(args.out / "zero_run.json", json.dumps(doc, indent=1, default=float))
    print(md)
    print(f"wrote {args.out / 'zero_run.md'} and {args.out / 'zero_run.json'} ({secs:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
