"""Recall of the operator-noise statistics on the embedded corpus (an exploration).

For every (op, dtype) of the corpus the script runs

* calibration cases (seed ``--seed``) through every correct variant,
* held-out test cases (seed ``--seed + 1``) through every correct variant (controls) and
  every bug of the op (buggy runs, paired with their base variant on the same inputs; a
  buggy run is *detectable* when it differs from its paired correct output by more than
  one ULP somewhere, as ``tolstat evaluate`` defines it),

computes per run the statistics of :func:`tolstat.measure.noise.run_statistics` twice (with the
op's magnitude ``m = op(|inputs|)`` and with the fallback ``m = |ref|``) plus a baseline
max-only score ``max |d| / (u_out (|ref| + rms(ref)))``, and reports, per method, the
false-positive rate on the held-out controls and the recall on detectable buggy runs at a
per-(op, dtype) threshold equal to the empirical ``1 - budget`` quantile of calibration
runs (plain quantile; no finite-sample certificate: this measures power, not validity).

Combined scores ``S = max_j T_j / q_j``: the calibration *cases* are split at random in
two halves (all variants of a case stay together); ``q_j`` is a quantile of ``T_j`` on the first half
and the threshold on ``S`` the ``1 - budget`` quantile on the second.

Run::

    PYTHONPATH=. python benchmarks/opstat_recall.py              # seed 0 (about 1-2 min)
    PYTHONPATH=. python benchmarks/opstat_recall.py --seed 10 --out benchmarks/results/opstat_recall_seed10

Writes ``benchmarks/results/opstat_recall.json`` and ``.md`` (and a per-run cache under
``--cache`` to re-analyse without re-running kernels: ``--from-cache``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SUBTLE_FOCUS = ("matmul_lowp_acc", "mean_lowp_acc", "cumsum_lowp_carry",
                "matmul_splitk_trunc_store", "layer_norm_eps_1e-6", "layer_norm_one_pass_var",
                "layer_norm_unbiased_var", "attention_scale_sqrt_d_plus_1")


# ------------------------------------------------------------------------- collection
def _baseline(out, ref, dtype):
    from tolstat._base.dtypes import unit_roundoff

    d = np.abs(out.astype(np.float64) - ref)
    if not np.isfinite(d).all():
        return math.inf
    u = unit_roundoff(dtype)
    rms = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
    tiny = float(np.finfo(np.float16).tiny) if dtype == "float16" else 2.0 ** -126
    return float(np.max(d / (u * (np.abs(ref) + rms) + u * tiny)))


def collect_runs(ops, dtypes, n_cal, n_test, seed, quick=False, progress=True):
    from tolstat import corpus
    from tolstat.measure.metrics import ulp_distance
    from tolstat.measure import noise
    from tolstat.measure.noise import run_statistics

    rows = []
    bugs_by_op = {}
    for b in corpus.BUGS.values():
        bugs_by_op.setdefault(b.op, []).append(b)
    for op in ops:
        spec = corpus.OPS[op]
        rowwise = op in corpus.ROWWISE
        t0 = time.perf_counter()
        for dt in dtypes:
            for part, n, sd in (("cal", n_cal, seed), ("test", n_test, seed + 1)):
                for ci, case in enumerate(corpus.cases(op, dt, n=n, seed=sd, quick=quick)):
                    ref = corpus.run_reference(case, dt)
                    mag = corpus.run_magnitude(case, dt)
                    K = case.covariates["K"]
                    outs = {v: corpus.run_kernel(k, case, dt) for v, k in spec.variants.items()}
                    entries = [("control", v, "", "", o, True) for v, o in outs.items()]
                    if part == "test":
                        for b in bugs_by_op.get(op, []):
                            o = corpus.run_kernel(b.kernel, case, dt)
                            with np.errstate(all="ignore"):
                                det = bool(np.any(ulp_distance(o, outs[b.base], dt) > 1.0))
                            entries.append(("bug", b.base, b.name, b.category, o, det))
                    for kind, var, bug, cat, o, det in entries:
                        s_op = run_statistics(o, ref, dtype=dt, magnitude=mag, K=K,
                                              rowwise=rowwise, op=op)
                        s_mid = run_statistics(o, ref, dtype=dt, magnitude=mag, K=K,
                                               rowwise=rowwise, op=op, shape=noise.MID_SHAPE)
                        s_ref = run_statistics(o, ref, dtype=dt, magnitude=None, K=K,
                                               rowwise=rowwise, op=op)
                        rows.append({"op": op, "dtype": dt, "part": part, "case": ci,
                                     "kind": kind, "variant": var, "bug": bug,
                                     "category": cat, "detectable": det,
                                     "base_max": _baseline(o, ref, dt),
                                     **{f"m:{k}": v for k, v in s_op.items()},
                                     **{f"i:{k}": v for k, v in s_mid.items()},
                                     **{f"r:{k}": v for k, v in s_ref.items()}})
        if progress:
            print(f"  {op}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- analysis
def _q(x, p):
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(np.quantile(x, p, method="higher")) if x.size else math.nan


def _ratio(t, q):
    """T / q with q = 0 meaning 'exact in calibration': 0 stays 0, anything else is inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(q > 0, t / np.where(q > 0, q, 1.0), np.where(t > 0, np.inf, 0.0))
    return np.where(np.isnan(t), -np.inf, r)  # a statistic that does not apply never trips


class Single:
    def __init__(self, name, col):
        self.name, self.col = name, col

    def fit(self, cal, budget):
        self.thr = _q(cal[self.col], 1 - budget)

    def flag(self, test):
        t = np.asarray(test[self.col], dtype=np.float64)
        return t > self.thr


class Combined:
    def __init__(self, name, cols, norm_p=0.5):
        self.name, self.cols, self.norm_p = name, cols, norm_p

    def _s(self, d):
        return np.max(np.stack([_ratio(np.asarray(d[c], dtype=np.float64), self.q[c])
                                for c in self.cols]), axis=0)

    def fit(self, cal, budget):
        # a random half of the cases (all variants of a case together); a parity split
        # would give the halves disjoint (shape, dist, scale) cells of the case grid
        case = np.asarray(cal["case"])
        ids = np.unique(case)
        pick = np.random.default_rng(12345).permutation(ids)[: ids.size // 2]
        half = np.isin(case, pick)
        a = {c: np.asarray(cal[c])[half] for c in self.cols}
        b = {c: np.asarray(cal[c])[~half] for c in self.cols}
        self.q = {}
        for c in self.cols:
            q = _q(a[c], self.norm_p)
            if q == 0:  # fall back to the half's max (0 only when exact on the whole half)
                q = _q(a[c], 1.0)
            self.q[c] = q
        self.thr = _q(self._s(b), 1 - budget)

    def flag(self, test):
        return self._s(test) > self.thr


def _cols(rows, keys):
    return {k: np.array([r.get(k, np.nan) for r in rows]) for k in keys}


def analyse(rows, budget, methods, by_variant=False):
    """Fit each method per (op, dtype) group (per (op, dtype, variant) with
    ``by_variant``: a bug is then checked against its base variant's threshold)."""
    keys = sorted({k for r in rows for k in r})
    by_group = {}
    for r in rows:
        g = (r["op"], r["dtype"], r["variant"]) if by_variant else (r["op"], r["dtype"])
        by_group.setdefault(g, []).append(r)
    flags = {m.name: [] for m in methods}
    meta = []
    for _, rs in sorted(by_group.items()):
        cal = [r for r in rs if r["part"] == "cal"]
        test = [r for r in rs if r["part"] == "test"]
        C, T = _cols(cal, keys), _cols(test, keys)
        for m in methods:
            m.fit(C, budget)
            flags[m.name].append(m.flag(T))
        meta.extend(test)
    kind = np.array([r["kind"] for r in meta])
    det = np.array([r["detectable"] for r in meta], dtype=bool)
    cat = np.array([r["category"] for r in meta])
    bug = np.array([r["bug"] for r in meta])
    ctrl = kind == "control"
    buggy = (kind == "bug") & det
    subtle = buggy & (cat == "subtle")
    summary, per_bug = [], {}
    for m in methods:
        f = np.concatenate(flags[m.name])
        summary.append({
            "method": m.name,
            "fp": int(f[ctrl].sum()), "n_control": int(ctrl.sum()),
            "fp_rate": float(f[ctrl].mean()),
            "caught": int(f[buggy].sum()), "n_detectable": int(buggy.sum()),
            "recall_detectable": float(f[buggy].mean()),
            "caught_subtle": int(f[subtle].sum()), "n_subtle": int(subtle.sum()),
            "recall_subtle": float(f[subtle].mean()),
        })
        for b in sorted(set(bug[buggy].tolist())):
            sel = buggy & (bug == b)
            per_bug.setdefault(b, {"category": str(cat[sel][0]), "n_detectable": int(sel.sum())})
            per_bug[b][m.name] = f"{int(f[sel].sum())}/{int(sel.sum())}"
    return summary, per_bug


MODELS = {"m": "m = op(|x|)", "i": "m = op(|x|) + mid term", "r": "m = |ref|"}


def default_methods():
    inv = ["inv_row_sum", "inv_masked_zero", "inv_row_lse", "inv_row_mean", "inv_row_scale"]
    core = ["op_max", "op_rms", "op_row_rms_max", "op_bias"]
    M = [Single("baseline max |d|/(u(|ref|+rms))", "base_max")]
    for k, lab in MODELS.items():
        M.append(Single(f"op_max, {lab}", f"{k}:op_max"))
    for k, lab in MODELS.items():
        for p in (0.5, 0.9, 0.99):
            M.append(Combined(f"S core+inv, {lab}, q=p{int(p * 100)}",
                              [f"{k}:{c}" for c in core + inv], p))
    M.append(Combined("S core+inv+row_bias, m+mid, q=p99",
                      [f"i:{c}" for c in core + inv + ["op_row_bias_max"]], 0.99))
    M.append(Combined("S core+inv+mean+frac, m+mid, q=p99",
                      [f"i:{c}" for c in core + inv + ["op_mean", "op_frac"]], 0.99))
    M.append(Combined("S max+rms, m+mid, q=p99", ["i:op_max", "i:op_rms"], 0.99))
    M.append(Combined("S core (no inv), m+mid, q=p99", [f"i:{c}" for c in core], 0.99))
    for p in (0.9, 0.95, 0.99):
        M.append(Combined(f"S core+inv, both m and m+mid, q=p{int(p * 100)}",
                          [f"{k}:{c}" for k in "mi" for c in core + inv], p))
    M.append(Combined("S core+inv, all three m, q=p99",
                      [f"{k}:{c}" for k in "mir" for c in core + inv], 0.99))
    M.append(Combined("S max+rms+inv, both m and m+mid, q=p99",
                      [f"{k}:{c}" for k in "mi" for c in ["op_max", "op_rms"] + inv], 0.99))
    M.append(Combined("S core+inv+row_bias, both m and m+mid, q=p99",
                      [f"{k}:{c}" for k in "mi" for c in core + inv + ["op_row_bias_max"]],
                      0.99))
    return M


def _table(summary):
    lines = ["| method | FP (held-out controls) | recall (detectable) | subtle |",
             "|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['method']} | {s['fp']}/{s['n_control']} ({100 * s['fp_rate']:.2f}%) "
                     f"| {s['caught']}/{s['n_detectable']} ({100 * s['recall_detectable']:.1f}%) "
                     f"| {s['caught_subtle']}/{s['n_subtle']} ({100 * s['recall_subtle']:.1f}%) |")
    return lines


def _md(summary, per_bug, cfg, seconds, summary_v=None, per_bug_v=None):
    lines = ["# Operator-noise statistics: recall on the embedded corpus", "",
             f"Config: {json.dumps(cfg)}; collection {seconds:.0f} s.", "",
             ("Thresholds: per group, the empirical (1 - budget) quantile of calibration "
              "runs (no finite-sample certificate). Recall is over detectable buggy runs."), "",
             "## Groups (op, dtype): one threshold covers every correct variant", ""]
    lines += _table(summary)
    if summary_v is not None:
        lines += ["", "## Groups (op, dtype, variant): a bug checked against its base variant",
                  ""]
        lines += _table(summary_v)
    names = [s["method"] for s in summary]
    lines += ["", "## Per bug kind (detectable runs caught)", "",
              "| bug | category | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    order = sorted(per_bug, key=lambda b: (b not in SUBTLE_FOCUS, per_bug[b]["category"], b))
    for b in order:
        r = per_bug[b]
        lines.append(f"| {b} | {r['category']} | " + " | ".join(r.get(n, "-") for n in names) + " |")
    if per_bug_v is not None:
        pick = [n for n in names if n.startswith(("op_max", "S core+inv+row_bias, both",
                                                  "baseline"))]
        lines += ["", "## Per bug kind, groups (op, dtype, variant)", "",
                  "| bug | category | " + " | ".join(pick) + " |",
                  "|---|---|" + "---|" * len(pick)]
        for b in order:
            r = per_bug_v[b]
            lines.append(f"| {b} | {r['category']} | "
                         + " | ".join(r.get(n, "-") for n in pick) + " |")
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-cal", type=int, default=300)
    ap.add_argument("--n-test", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=0.01)
    ap.add_argument("--ops", nargs="*", default=None)
    ap.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    ap.add_argument("--out", default=str(HERE / "results" / "opstat_recall"))
    ap.add_argument("--cache", default="/tmp/opstat_recall_runs.pkl.gz")
    ap.add_argument("--from-cache", action="store_true")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    from tolstat import corpus

    ops = args.ops or sorted(corpus.OPS)
    cfg = {"ops": ops, "dtypes": args.dtypes, "n_cal": args.n_cal, "n_test": args.n_test,
           "seed": args.seed, "budget": args.budget}
    t0 = time.perf_counter()
    if args.from_cache:
        with gzip.open(args.cache, "rb") as fh:
            rows, seconds = pickle.load(fh)
    else:
        with threadpool_limits(limits=1, user_api="blas"):
            rows = collect_runs(ops, args.dtypes, args.n_cal, args.n_test, args.seed)
        seconds = time.perf_counter() - t0
        _atomic_write(Path(args.cache), gzip.compress(pickle.dumps((rows, seconds))))
    methods = default_methods()
    summary, per_bug = analyse(rows, args.budget, methods)
    summary_v, per_bug_v = analyse(rows, args.budget, methods, by_variant=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(out.with_suffix(".json"), json.dumps(
        {"config": cfg, "collect_seconds": seconds, "summary": summary, "per_bug": per_bug,
         "summary_by_variant": summary_v, "per_bug_by_variant": per_bug_v},
        indent=2).encode())
    md = _md(summary, per_bug, cfg, seconds, summary_v, per_bug_v)
    _atomic_write(out.with_suffix(".md"), md.encode())
    print(md)


if __name__ == "__main__":
    main()
