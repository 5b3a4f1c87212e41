"""What one :func:`tolstat.check` with ``inputs=`` costs, against one numpy pass and the reference.

Run: ``PYTHONPATH=. python benchmarks/bench_check_inputs.py [--quick]``.

The operator form from the op's own arguments, the path of a kernel author's test: per op
(``gelu``, elementwise; ``softmax`` and ``layer_norm``, rows of up to 1,024, with the
invariants of their rows; ``matmul`` with K = 64), one table
from :func:`tolstat.from_pairs` of 300 float16 runs of 4,096 outputs with their ``inputs``
and ``params`` (the operator statistics derived from them) and the default ``tolstat.select(ds, fp_budget=0.01)``; then, at
1e3, 1e5, 1e6 (the size of the speed goal) and 1e7 output elements, the minimum time per call of

* ``check(out, ref, op=..., inputs=..., params=..., table=...)``, the user's call;
* ``check`` with ``CheckOptions(magnitude=)`` and the covariate ``K`` given (both computed
  beforehand by :func:`tolstat.ops.op_statistics`): the operator check without deriving its magnitude;
* one numpy pass ``np.abs(a.astype(np.float64) - e).max()``;
* the float64 reference the test computes anyway (the op on the float16 inputs, in float64).

The four are timed alternately in batches long enough for the clock; each figure is the
minimum over the repeats. The ratios are to the numpy pass and to the reference. The
magnitude is the op evaluated once more in float64 on absolute inputs, so ``inputs=``
costs about one reference more than the check with a given magnitude. Writes
``benchmarks/results/check_inputs.md`` and ``.json`` (atomically), with the load average
at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

import tolstat
from tolstat._base.util import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
SIZES = (1_000, 100_000, 1_000_000, 10_000_000)
K = 64


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return erf(x)


class Op:
    """A float16 kernel (float32 arithmetic, one rounding to float16), its float64 reference
    on the same float16 inputs, and inputs of a given output size."""

    def __init__(self, name: str, params: dict[str, Any] | None, make: Callable[[np.random.Generator, int], tuple],
                 f32: Callable[..., np.ndarray], f64: Callable[..., np.ndarray]):
        self.name, self.params, self.make, self._f32, self._f64 = name, params, make, f32, f64

    def kernel(self, *x: Any) -> np.ndarray:
        return self._f32(*(_as(v, np.float32) for v in x), **(self.params or {})).astype(np.float16)

    def reference(self, *x: Any) -> np.ndarray:
        return self._f64(*(_as(v, np.float64) for v in x), **(self.params or {}))


def _as(v: Any, dt: type) -> Any:
    """An array argument in ``dt``; any other (a shape) as it is."""
    return v.astype(dt) if isinstance(v, np.ndarray) else v


def _softmax(x: np.ndarray, dim: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=dim, keepdims=True))
    return e / e.sum(axis=dim, keepdims=True)


def _rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray]:
    cols = min(n, 1024)
    return (rng.standard_normal((max(n // cols, 1), cols)).astype(np.float16),)


def _mm(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    m = max(int(round(math.sqrt(n))), 1)
    return (rng.standard_normal((m, K)).astype(np.float16), rng.standard_normal((K, max(n // m, 1))).astype(np.float16))


def _layer_norm(x: np.ndarray, shape: tuple, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + x.dtype.type(eps)) * w + b  # float32 in the kernel, float64 in the reference


def _ln_inputs(rng: np.random.Generator, n: int) -> tuple:
    (x,) = _rows(rng, n)
    c = x.shape[-1]
    return (x, (c,), (1 + 0.1 * rng.standard_normal(c)).astype(np.float16), (0.1 * rng.standard_normal(c)).astype(np.float16))


OPS = {
    "gelu": Op("gelu", None, lambda rng, n: (rng.standard_normal(n).astype(np.float16),),
               lambda x: 0.5 * x * (1 + _erf(x / np.float32(math.sqrt(2.0))).astype(np.float32)),
               lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2.0)))),
    "softmax": Op("softmax", {"dim": -1}, _rows, _softmax, _softmax),
    "matmul": Op("matmul", None, _mm, lambda a, b: a @ b, lambda a, b: a @ b),
    "layer_norm": Op("layer_norm", {"eps": 1e-5}, _ln_inputs, _layer_norm, _layer_norm),
}


def _table(op: Op) -> Any:
    pairs = []
    for i in range(300):
        x = op.make(np.random.default_rng([0, i]), 4096)
        pairs.append({"actual": op.kernel(*x), "expected": op.reference(*x), "inputs": x, "params": op.params})
    ds = tolstat.from_pairs(pairs, op=op.name, dtype="float16", hardware="bench",
                            options=tolstat.CollectOptions(progress=False))
    return tolstat.select(ds, fp_budget=0.01)


def _batch(f: Callable[[], Any], k: int) -> float:
    t = time.perf_counter()
    for _ in range(k):
        f()
    return (time.perf_counter() - t) / k


def _min_times(fs: dict[str, Callable[[], Any]], repeats: int, batch_s: float = 2e-3) -> dict[str, float]:
    """Minimum time per call of each function, timed alternately in batches."""
    ks = {}
    for name, f in fs.items():
        f()
        ks[name] = max(1, int(batch_s / max(_batch(f, 1), 1e-7)))
    best = {name: math.inf for name in fs}
    for _ in range(repeats):
        for name, f in fs.items():
            best[name] = min(best[name], _batch(f, ks[name]))
    return best


def measure(quick: bool = False) -> dict:
    load_start = os.getloadavg()
    rows = []
    sizes = SIZES[:2] if quick else SIZES
    for name, op in OPS.items():
        table = _table(op)
        ent = table.entry(name, "float16", "bench")
        rng = np.random.default_rng(1)
        for n in sizes:
            x = op.make(rng, n)
            a, e = op.kernel(*x), op.reference(*x)
            st = tolstat.ops.op_statistics(name, x, op.params, dtype="float16")
            mag, kcov = st.magnitude, {"K": float(st.K)}
            kw = dict(op=name, dtype="float16", table=table, hardware="bench")
            r = tolstat.check(a, e, inputs=x, params=op.params, **kw)
            fs = {
                "check (inputs=)": lambda: tolstat.check(a, e, inputs=x, params=op.params, **kw),
                "check (magnitude=)": lambda: tolstat.check(a, e, covariates=kcov, options=tolstat.CheckOptions(magnitude=mag),
                                                     **kw),
                "numpy pass": lambda: np.abs(a.astype(np.float64) - e).max(),
                "reference": lambda: op.reference(*x),
            }
            repeats = {1_000: 15, 100_000: 9, 1_000_000: 7, 10_000_000: 3}[n]
            t = _min_times(fs, max(2, repeats // 3) if quick else repeats)
            row = dict(op=name, n=int(a.size), passed=bool(r.passed), operator=bool(ent.operator),
                       **{f"{k} s": v for k, v in t.items()},
                       ratio_numpy=t["check (inputs=)"] / t["numpy pass"],
                       ratio_reference=t["check (inputs=)"] / t["reference"],
                       ratio_numpy_magnitude=t["check (magnitude=)"] / t["numpy pass"])
            rows.append(row)
            print(f"{name:<8s} n={a.size:>10,d}  check(inputs=) {t['check (inputs=)'] * 1e3:9.3f} ms "
                  f"({row['ratio_numpy']:6.2f}x numpy, {row['ratio_reference']:5.2f}x reference)  "
                  f"check(magnitude=) {t['check (magnitude=)'] * 1e3:9.3f} ms ({row['ratio_numpy_magnitude']:5.2f}x)  "
                  f"numpy {t['numpy pass'] * 1e3:8.3f} ms  reference {t['reference'] * 1e3:8.3f} ms  "
                  f"passed={r.passed}", flush=True)
    return dict(load_start=load_start, load_end=os.getloadavg(), rows=rows, python=platform.python_version(),
                tolstat=tolstat.__version__,
                numpy=np.__version__, machine=platform.machine(), cpus=os.cpu_count())


def _markdown(res: dict) -> str:
    lines = ["# `tolstat.check` with `inputs=` against one numpy pass and the reference", "",
             "Written by `benchmarks/bench_check_inputs.py`: per op one table from 300 float16 runs collected "
             "with the operator statistics derived from the inputs, the default `select`; then the minimum time "
             "per call of `check(..., inputs=, params=)`, of `check` with the magnitude given, of one numpy pass "
             "`np.abs(a.astype(np.float64) - e).max()` and of the float64 reference, timed alternately in one "
             "process.", "",
             f"Load: {res['load_start'][0]:.2f} at the start, {res['load_end'][0]:.2f} at the end (1-minute load "
             f"average, {res['cpus']} cores).", "",
             "| op | elements | check(inputs=) ms | / numpy pass | / reference | check(magnitude=) ms | / numpy pass "
             "| numpy pass ms | reference ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['op']} | {r['n']:,} | {r['check (inputs=) s'] * 1e3:.3f} | {r['ratio_numpy']:.2f} "
                     f"| {r['ratio_reference']:.2f} | {r['check (magnitude=) s'] * 1e3:.3f} "
                     f"| {r['ratio_numpy_magnitude']:.2f} | {r['numpy pass s'] * 1e3:.3f} "
                     f"| {r['reference s'] * 1e3:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes up to 1e5, fewer repeats")
    ap.add_argument("--out", default=str(RESULTS / "check_inputs.md"), help="markdown output")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = measure(args.quick)
    out = Path(args.out)
    atomic_write_text(out, _markdown(res))
    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1) + "\n")
    print(f"load average {res['load_start'][0]:.2f} -> {res['load_end'][0]:.2f}; wrote {out}")


if __name__ == "__main__":
    main()
