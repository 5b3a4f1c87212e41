"""A Hypothesis suite at a suite budget: false failures of a correct kernel, and a bug it must catch.

The experiment of the "property-based suites that do not flake" item: a Hypothesis test of
100 examples per run checks an fp16 matmul against its float64 reference with
``tolstat_check`` (``inputs=``, the operator form), under ``--tolstat-suite-budget 0.01``:
the plugin counts the test's 100 examples and gives each check ``1e-4``. The calibration
has 400 runs, far too few for the distribution-free order statistic at ``1e-4`` (about
30,000 units), so ``--tolstat-suite-tail model`` extends the thresholds by the model-based
tail (:mod:`tolstat.calibration.tiny_budget`).

Each repetition is one full pytest session, run **in process** (``pytest.main``: the
plugin's options, its collection-time count of the Hypothesis examples, the split table
and the check; a subprocess per repetition would spend most of its time importing), with
its own Hypothesis seed (``--hypothesis-seed=REP``, no example database, shrinking off: it
does not change a verdict, only the time a failing repetition takes). A repetition fails
when pytest's exit status is not 0.

Kernels (fp16 inputs and output; shapes ``m x K @ K x 32``, ``m`` in {16, 32}, ``K`` in
{64, 256, 1024}, standard normal entries):

* ``fp32acc``: one fp32 product, rounded once to fp16 (the kernel of the done-when);
* ``splitk4``: ``K`` split in 4, each part's fp32 product rounded to fp16, the partials
  added in fp16: a correct kernel that rounds intermediates to the output format, where
  the zero-run model of ``tolstat.ops`` does not hold and the tail does the work;
* ``acc16`` (the bug): the accumulator held in fp16 across ``K``-tiles of 8 (each tile's
  product in fp32, added to the fp16 accumulator and rounded): low-precision accumulation.

Besides the repetitions, every check is also decided directly (``tolstat.check`` with the
split table, the plugin's own table) on fresh draws, for the per-check false-positive rate
and recall. Run: ``python benchmarks/hypothesis_suite.py`` (``--reps 200``); results go to
``benchmarks/results/hypothesis_suite.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KERNELS = '''
import numpy as np

MS, KS, N = (16, 32), (64, 256, 1024), 32


def draw(seed, m, k):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, N)).astype(np.float16))


def reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def fp32acc(a, b):
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)


def _tiles16(a, b, tiles):
    """Per tile an fp32 product rounded to fp16, added into an fp16 accumulator."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for part_a, part_b in zip(np.array_split(a, tiles, axis=1), np.array_split(b, tiles, axis=0)):
        p = (part_a.astype(np.float32) @ part_b.astype(np.float32)).astype(np.float16)
        acc = (acc.astype(np.float32) + p.astype(np.float32)).astype(np.float16)
    return acc


def splitk4(a, b):
    return _tiles16(a, b, 4)


def acc16(a, b):
    return _tiles16(a, b, a.shape[1] // 8)
'''

TEST = '''
import os

from hypothesis import Phase, given, settings, strategies as st

import kernels


@settings(max_examples=100, deadline=None, database=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from(kernels.KS), m=st.sampled_from(kernels.MS))
def test_matmul(tolstat_check, seed, k, m):
    a, b = kernels.draw(seed, m, k)
    out = getattr(kernels, os.environ["TOLSTAT_BENCH_KERNEL"])(a, b)
    tolstat_check(out, kernels.reference(a, b), op="matmul", dtype="float16", inputs=(a, b))
'''

CONFTEST = '''
import json
import os


def pytest_sessionfinish(session, exitstatus):
    from tolstat.checks.pytest_plugin import _KEY

    st = session.config.stash[_KEY]
    e = st.table.data
    with open(os.environ["TOLSTAT_BENCH_LOG"], "a") as fh:
        fh.write(json.dumps({"per_check": float(st.table.fp_budget), "n_suite": st.n_suite,
                             "n_checks": st.n_checks, "threshold": float(e["threshold"].values[0, 0]),
                             "method": str(e["method"].values[0, 0])}) + "\\n")
'''


def _calibrate(mod, kernel: str, runs: int, path: Path) -> None:
    import tolstat

    k = getattr(mod, kernel)
    rng0 = np.random.default_rng(12345)

    def make(rng):
        m, kk = int(rng.choice(mod.MS)), int(rng.choice(mod.KS))
        return tolstat.Inputs(args=mod.draw(int(rng.integers(2**32)), m, kk))

    ds = tolstat.collect(k, mod.reference, make, op="matmul", dtype="float16", runs=runs, seed=int(rng0.integers(1000)),
                         options=tolstat.CollectOptions(progress=False))
    tolstat.select(ds, fp_budget=0.01).to_json(path)


def _session(work: Path, table: Path, kernel: str, rep: int, log: Path, tail: str) -> int:
    import pytest

    os.environ["TOLSTAT_BENCH_KERNEL"] = kernel
    os.environ["TOLSTAT_BENCH_LOG"] = str(log)
    args = [str(work / "test_hyp.py"), "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
            "--rootdir", str(work), "-c", str(work / "pytest.ini"), "--tolstat-table", str(table),
            "--tolstat-suite-budget", "0.01", "--tolstat-suite-tail", tail, f"--hypothesis-seed={rep}"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = pytest.main(args)
    return int(rc)


def _direct(mod, table, kernel: str, n: int, seed: int) -> dict:
    """Decide n fresh draws directly with the given table: failures and the largest score/threshold ratio."""
    import tolstat

    rng = np.random.default_rng(seed)
    fails, worst, by_k = 0, 0.0, {}
    for _ in range(n):
        m, k = int(rng.choice(mod.MS)), int(rng.choice(mod.KS))
        a, b = mod.draw(int(rng.integers(2**32)), m, k)
        r = tolstat.check(getattr(mod, kernel)(a, b), mod.reference(a, b), op="matmul", dtype="float16",
                          table=table, inputs=(a, b))
        fails += not r.passed
        worst = max(worst, float(r.ratios.get("op_score", 0.0)))
        f, t = by_k.get(k, (0, 0))
        by_k[k] = (f + (not r.passed), t + 1)
    return {"checks": n, "failed": fails, "rate": fails / n, "worst_ratio": worst,
            "by_K": {str(k): {"failed": f, "checks": t} for k, (f, t) in sorted(by_k.items())}}


def main(argv: list[str] | None = None) -> int:
    """Run the experiment and write the results (JSON and a Markdown table)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200, help="pytest sessions per (kernel, variant)")
    ap.add_argument("--bug-reps", type=int, default=None, help="sessions with the bug (default: --reps)")
    ap.add_argument("--runs", type=int, default=400, help="calibration runs per kernel")
    ap.add_argument("--direct", type=int, default=2000, help="checks decided directly per (kernel, variant)")
    ap.add_argument("--kernels", default="fp32acc,splitk4", help="correct kernels, comma-separated")
    ap.add_argument("-o", "--out", default=str(Path(__file__).parent / "results" / "hypothesis_suite"))
    a = ap.parse_args(argv)
    bug_reps = a.reps if a.bug_reps is None else a.bug_reps
    from tolstat.checks.pytest_plugin import suite_table
    import tolstat

    results: dict = {"reps": a.reps, "bug_reps": bug_reps, "runs": a.runs, "examples": 100, "suite_budget": 0.01,
                     "kernels": {}}
    with tempfile.TemporaryDirectory() as td:
        work = Path(td)
        (work / "kernels.py").write_text(KERNELS)
        (work / "test_hyp.py").write_text(TEST)
        (work / "conftest.py").write_text(CONFTEST)
        (work / "pytest.ini").write_text("[pytest]\n")
        sys.path.insert(0, str(work))
        import kernels as mod  # noqa: E402  (the module the test imports)

        for kernel in a.kernels.split(","):
            t0 = time.time()
            table_path = work / f"{kernel}.json"
            _calibrate(mod, kernel, a.runs, table_path)
            base = tolstat.load_table(table_path)
            split = suite_table(base, 0.01, 100, tail="model")
            res: dict = {"calibration_s": round(time.time() - t0, 1),
                         "table_threshold": float(base.data["threshold"].values[0, 0]),
                         "split_threshold": float(split.data["threshold"].values[0, 0]),
                         "split_method": str(split.data["method"].values[0, 0]),
                         "split_reason": str(split.data["reason"].values[0, 0])}
            for variant, kern, reps in (("correct", kernel, a.reps), ("bug", "acc16", bug_reps)):
                log = work / f"{kernel}-{variant}.jsonl"
                t0 = time.time()
                rcs = [_session(work, table_path, kern, rep, log, "model") for rep in range(reps)]
                info = [json.loads(x) for x in log.read_text().splitlines()]
                res[variant] = {"repetitions": reps, "failed": int(sum(rc != 0 for rc in rcs)),
                                "exit_codes": sorted(set(rcs)), "wall_s": round(time.time() - t0, 1),
                                "per_check_budget": info[0]["per_check"], "n_suite": info[0]["n_suite"],
                                "checks_made": int(sum(i["n_checks"] for i in info)),
                                "method": info[0]["method"]}
                res[variant]["direct_split"] = _direct(mod, split, kern, a.direct, seed=7)
                res[variant]["direct_table_1pct"] = _direct(mod, base, kern, a.direct, seed=7)
                print(kernel, variant, json.dumps(res[variant]), flush=True)
            results["kernels"][kernel] = res
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    lines = ["| correct kernel | calibration runs | threshold at 1% | at 1e-4 (method) | correct: failed repetitions "
             "| bug: failed repetitions | per check, correct: FP (1e-4 table) | worst ratio | per check, bug: recall "
             "(1e-4 table) | recall (1% table) |", "|" + "---|" * 10]
    for kernel, r in results["kernels"].items():
        c, b = r["correct"], r["bug"]
        lines.append(f"| {kernel} | {a.runs} | {r['table_threshold']:.4g} | {r['split_threshold']:.4g} "
                     f"({r['split_method']}) | {c['failed']}/{c['repetitions']} | {b['failed']}/{b['repetitions']} "
                     f"| {c['direct_split']['failed']}/{c['direct_split']['checks']} | "
                     f"{c['direct_split']['worst_ratio']:.3g} | "
                     f"{100 * b['direct_split']['rate']:.1f}% | {100 * b['direct_table_1pct']['rate']:.1f}% |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
