"""Suite budgets of property-based and parametrised suites: counting checks, the model-based tail.

The plugin counts the checks a test declares (Hypothesis examples, parametrised items,
``@pytest.mark.tolstat(checks=...)``) and, with ``suite_tail = "model"``, extends thresholds
the calibration runs cannot support at ``suite_budget / N``
(:mod:`tolstat.calibration.tiny_budget`). The done-when experiment itself (200 repetitions)
is ``benchmarks/hypothesis_suite.py``; here a few repetitions of it, and the rule's coverage
under its assumption and outside it.
"""

from __future__ import annotations

import importlib.metadata
import math

import numpy as np
import pytest

import tolstat
from tolstat.calibration.selection import rebudget, select
from tolstat.calibration.tiny_budget import (MODEL_TAIL, extend_budget, gaussian_tail_ratio, rebudget_with_tail,
                                             smallest_supported_budget)
from tolstat.models.estimators.orderstat import order_statistic_min_n

pytest_plugins = ["pytester"]
pytest.importorskip("hypothesis")
pytest.importorskip("h5netcdf")  # import h5py before pytester's in-process runs

_INSTALLED = any(ep.value == "tolstat.checks.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
_LOAD = () if _INSTALLED else ("-p", "tolstat.checks.pytest_plugin")

KERNELS = '''
import numpy as np


def draw(seed, m, k):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, 32)).astype(np.float16)


def reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def fp32acc(a, b):  # correct: fp32 accumulation, one rounding to fp16
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)


def acc16(a, b):  # the bug: an fp16 accumulator across K-tiles of 8
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for pa, pb in zip(np.array_split(a, a.shape[1] // 8, axis=1), np.array_split(b, a.shape[1] // 8, axis=0)):
        p = (pa.astype(np.float32) @ pb.astype(np.float32)).astype(np.float16)
        acc = (acc.astype(np.float32) + p.astype(np.float32)).astype(np.float16)
    return acc
'''

HYP_TEST = '''
import os

from hypothesis import Phase, given, settings, strategies as st

import kernels


@settings(max_examples=100, deadline=None, database=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([64, 256, 1024]), m=st.sampled_from([16, 32]))
def test_matmul(tolstat_check, seed, k, m):
    a, b = kernels.draw(seed, m, k)
    out = getattr(kernels, os.environ["KERNEL"])(a, b)
    tolstat_check(out, kernels.reference(a, b), op="matmul", dtype="float16", inputs=(a, b))
'''


def _kernels():
    ns: dict = {}
    exec(KERNELS, ns)  # the same source the pytester suites import
    return ns


@pytest.fixture(scope="module")
def matmul_table(tmp_path_factory):
    """The operator-form table of the correct fp16 matmul, 400 runs at 1% per check."""
    k = _kernels()

    def make(rng):
        return tolstat.Inputs(args=k["draw"](int(rng.integers(2**32)), int(rng.choice([16, 32])),
                                             int(rng.choice([64, 256, 1024]))))

    ds = tolstat.collect(k["fp32acc"], k["reference"], make, op="matmul", dtype="float16", runs=400, seed=3,
                         options=tolstat.CollectOptions(progress=False))
    p = tmp_path_factory.mktemp("tab") / "matmul.json"
    select(ds, fp_budget=0.01).to_json(p)
    return p


@pytest.fixture(scope="module")
def mul3_table(tmp_path_factory):
    """A cheap table: a correctly rounded fp16 multiply (every score 0), 1500 runs."""
    def kern(x):
        return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)

    def ref(x):
        return x.astype(np.float16).astype(np.float64) * 3.0

    ds = tolstat.collect(kern, ref, lambda r: tolstat.Inputs(args=(r.standard_normal(64),)), op="mul3",
                         dtype="float16", runs=1500, hardware="cpu", options=tolstat.CollectOptions(progress=False))
    p = tmp_path_factory.mktemp("tab") / "mul3.json"
    select(ds, fp_budget=0.01, form="allclose", by=("op", "dtype")).to_json(p)
    return p


# ----------------------------------------------------------------------- the rule
def test_tail_ratio_and_supported_budget():
    from scipy.special import ndtri

    assert gaussian_tail_ratio(1e-4, 1e-2) == pytest.approx(ndtri(1 - 1e-4) / ndtri(1 - 1e-2))
    # larger than the ratio of the Chernoff factors sqrt(2 log(2/d)) of tolstat.ops.tolerance
    assert gaussian_tail_ratio(1e-6, 1e-2) > math.sqrt(math.log(2e6) / math.log(200))
    assert gaussian_tail_ratio(1e-3, 1e-3) == 1.0
    with pytest.raises(ValueError, match="budget=0.1 must be at most anchor=0.01"):
        gaussian_tail_ratio(0.1, 0.01)
    with pytest.raises(ValueError, match="budget must be a probability in \\(0, 1\\), got 0"):
        gaussian_tail_ratio(0, 0.01)
    for a in (0.01, 1e-3):
        n = order_statistic_min_n(1 - a, 0.95)  # the order statistic's own count
        assert smallest_supported_budget(n, 0.95) <= a < smallest_supported_budget(n - 1, 0.95)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        smallest_supported_budget(0, 0.95)
    with pytest.raises(ValueError, match="tail must be one of"):
        rebudget_with_tail(None, 1e-4, tail="gpd")  # type: ignore[arg-type]


def _coverage(draw, quantile, b=1e-4, n=300, g=0.95, reps=4000, ratio=gaussian_tail_ratio, seed=0):
    """Fraction of calibrations whose extended threshold max(scores) * ratio(b, a0) covers the true quantile."""
    rng = np.random.default_rng(seed)
    a0 = smallest_supported_budget(n, g)
    top = draw(rng, (reps, n)).max(axis=1)
    return float(np.mean(top * ratio(b, a0) >= quantile))


def test_coverage_of_the_rule_holds_under_its_assumption_and_not_outside():
    from scipy.special import ndtri

    # exactly normal scores: the rule's assumption with equality; coverage is the confidence
    cov = _coverage(lambda r, s: r.standard_normal(s), ndtri(1 - 1e-4))
    assert 0.93 <= cov <= 0.97
    # the maximum of 64 normal elements (a max statistic): lighter than the assumption, covered
    cov_max = _coverage(lambda r, s: r.standard_normal(s + (64,)).max(axis=-1), _max_quantile(64, 1e-4),
                        reps=1000)
    assert cov_max >= 0.97
    # with the Chernoff factors' ratio the normal scores are under-covered: why it is not used
    chernoff = _coverage(lambda r, s: r.standard_normal(s), ndtri(1 - 1e-4),
                         ratio=lambda b, a: math.sqrt(math.log(2 / b) / math.log(2 / a)))
    assert chernoff < 0.8
    # an exponential tail (heavier than normal) breaks the assumption: the rule under-covers
    heavy = _coverage(lambda r, s: r.exponential(size=s), -math.log(1e-4))
    assert heavy < 0.8  # measured 0.60 at 300 runs, 1e-4


def _max_quantile(m, b):
    from scipy.special import ndtri

    return float(ndtri((1 - b) ** (1 / m)))


def test_extend_budget_on_a_calibrated_table(matmul_table):
    t = tolstat.load_table(matmul_table)
    own = t.entry("matmul", "float16").statistics["op_score"]
    n = own.n
    assert order_statistic_min_n(1 - 1e-4, 0.95) > n  # 400 runs cannot certify 1e-4 distribution-free
    with pytest.raises(KeyError, match="needs n >= "):
        rebudget(t, 1e-4).entry("matmul", "float16")
    e = extend_budget(t, 1e-4, why="suite budget 0.01 over 100 checks")
    ent = e.entry("matmul", "float16")
    cal = ent.statistics["op_score"]
    top = np.sort(np.asarray(own.top)[~np.isnan(own.top)])[::-1]
    want = max(top[0] * gaussian_tail_ratio(1e-4, smallest_supported_budget(n, 0.95)), own.threshold)
    assert cal.threshold == pytest.approx(want, rel=1e-12)
    assert cal.method == MODEL_TAIL and cal.budget == pytest.approx(1e-4) and e.fp_budget == pytest.approx(1e-4)
    assert "model-based" in cal.reason and "not distribution-free" in cal.reason
    assert ent.certificate["guarantee"].startswith("model-based")
    # a budget the runs support: the distribution-free order statistic, untouched
    same = extend_budget(t, 0.01)
    assert same.entry("matmul", "float16").statistics["op_score"].method == "order_statistic"
    assert same.entry("matmul", "float16").statistics["op_score"].threshold == own.threshold
    # it still decides: a correct output passes, the fp16-accumulation bug fails
    k = _kernels()
    a, b = k["draw"](99, 32, 1024)
    ref = k["reference"](a, b)
    assert tolstat.check(k["fp32acc"](a, b), ref, op="matmul", dtype="float16", table=e, inputs=(a, b)).passed
    assert not tolstat.check(k["acc16"](a, b), ref, op="matmul", dtype="float16", table=e, inputs=(a, b)).passed
    # saved and loaded, the extended table keeps its method and threshold
    p = matmul_table.parent / "extended.json"
    e.to_json(p)
    back = tolstat.load_table(p).entry("matmul", "float16").statistics["op_score"]
    assert back.method == MODEL_TAIL and back.threshold == cal.threshold


# ----------------------------------------------------------------------- counting checks
COUNTED = '''
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st


def k(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def check(tolstat_check, seed):
    x = np.random.default_rng(seed).standard_normal(64)
    tolstat_check(k(x), ref(x), op="mul3", dtype="float16")


@settings(max_examples=25, deadline=None, database=None)
@example(seed=1)
@given(seed=st.integers(0, 1000))
def test_property(tolstat_check, seed):
    check(tolstat_check, seed)


@pytest.mark.parametrize("seed", range(3))
def test_param(tolstat_check, seed):
    check(tolstat_check, seed)


@pytest.mark.tolstat(checks=4)
def test_loop(tolstat_check):
    for seed in range(4):
        check(tolstat_check, seed)


def test_plain(tolstat_check):
    check(tolstat_check, 0)
'''


def test_plugin_counts_hypothesis_examples_and_parametrised_items(pytester, mul3_table):
    pytester.makepyfile(COUNTED)
    args = (*_LOAD, "-p", "no:cacheprovider", f"--tolstat-table={mul3_table}", "--tolstat-suite-budget=0.01")
    res = pytester.runpytest(*args, "--tolstat-suite-tail=model")
    res.assert_outcomes(passed=6)
    # 26 (25 examples + 1 explicit) + 3 parametrised + 4 declared + 1 = 34 checks
    res.stdout.fnmatch_lines(["tolstat: suite budget 0.01 split over 34 checks (Bonferroni): 0.0002941 per check",
                              "tolstat: the 6 tests that use tolstat declare 34 checks (1 Hypothesis tests counted*",
                              "tolstat: 1 of 1 groups have too few calibration runs for 0.0002941 per check: their "
                              "thresholds are model-based*"])
    assert res.ret == pytest.ExitCode.OK
    # without the tail the group is refused (1,500 runs cannot certify 2.9e-4): the checks fail
    res = pytester.runpytest(*args)
    res.assert_outcomes(failed=6)
    assert "needs n >= " in res.stdout.str()


OVER = '''
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st


def k(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


@settings(max_examples=10, deadline=None, database=None)
@given(seed=st.integers(0, 1000))
@pytest.mark.tolstat(op="mul3", dtype="float16"{checks})
def test_two_per_example(tolstat_check, seed):
    x = np.random.default_rng(seed).standard_normal(64)
    for y in (x, -x):
        tolstat_check(k(y), y.astype(np.float16).astype(np.float64) * 3.0)
'''


def test_more_checks_than_declared_fails_the_session(pytester, mul3_table):
    args = (*_LOAD, "-p", "no:cacheprovider", f"--tolstat-table={mul3_table}", "--tolstat-suite-budget=0.01",
            "--tolstat-suite-tail=model")
    pytester.makepyfile(OVER.format(checks=""))
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*20 checks ran but the suite budget 0.01 was split over 10*more than declared: "
                              "*test_two_per_example made 20 (declared 10)*"])
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    pytester.makepyfile(OVER.format(checks=", checks=2"))
    res = pytester.runpytest(*args)
    res.stdout.fnmatch_lines(["tolstat: suite budget 0.01 split over 20 checks (Bonferroni): 0.0005 per check"])
    assert res.ret == pytest.ExitCode.OK
    pytester.makepyfile(OVER.format(checks=", checks=0"))
    res = pytester.runpytest(*args)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "checks=...) must be a positive integer" in "\n".join(res.stderr.lines + res.stdout.lines)


def test_suite_tail_is_validated(pytester, mul3_table):
    pytester.makepyfile("def test_a():\n    pass\n")
    pytester.makefile(".toml", pyproject=f'[tool.tolstat]\ntable = "{mul3_table.as_posix()}"\nsuite_tail = "gpd"\n')
    res = pytester.runpytest(*_LOAD, "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "suite_tail must be one of ['none', 'model'], got 'gpd'" in "\n".join(res.stderr.lines + res.stdout.lines)


# ----------------------------------------------------------------------- the done-when, a few repetitions
def _hypothesis_sessions(pytester, table, kernel, seeds, monkeypatch):
    pytester.makepyfile(kernels=KERNELS, test_hyp=HYP_TEST)
    monkeypatch.setenv("KERNEL", kernel)
    out = []
    for s in seeds:
        res = pytester.runpytest(*_LOAD, "-p", "no:cacheprovider", f"--tolstat-table={table}",
                                 "--tolstat-suite-budget=0.01", "--tolstat-suite-tail=model",
                                 f"--hypothesis-seed={s}")
        res.stdout.fnmatch_lines(["tolstat: suite budget 0.01 split over 100 checks (Bonferroni): 0.0001 per check"])
        out.append(res.ret)
    return out


def test_hypothesis_suite_of_100_examples_passes_a_correct_kernel_and_catches_the_bug(pytester, matmul_table,
                                                                                        monkeypatch):
    assert _hypothesis_sessions(pytester, matmul_table, "fp32acc", (0, 1), monkeypatch) == [0, 0]
    assert _hypothesis_sessions(pytester, matmul_table, "acc16", (0, 1), monkeypatch) == [1, 1]


@pytest.mark.slow
def test_hypothesis_suite_twenty_repetitions(pytester, matmul_table, monkeypatch):
    """20 sessions of 100 examples at suite budget 1%: a correct kernel fails at most one
    (at the promised 1% per session, two or more of 20 has probability 1.7%)."""
    rc = _hypothesis_sessions(pytester, matmul_table, "fp32acc", range(100, 120), monkeypatch)
    assert sum(r != 0 for r in rc) <= 1
    assert all(r == 1 for r in _hypothesis_sessions(pytester, matmul_table, "acc16", range(100, 105), monkeypatch))
