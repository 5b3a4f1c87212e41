"""One decision: what check compares is what calibration certified, and what compare/evaluate count.

For tables of every form, built through the public API from ``(actual, expected)`` pairs:

* the value :func:`tolstat.check` compares with each threshold equals, exactly, the decision
  value of the same run in the calibration dataset (:func:`tolstat.calibration.decision.run_values`),
  and the threshold is one of those values (the engine certifies in the check's units);
* :func:`tolstat.check_runs` and the scores of :mod:`tolstat.assess.comparison` (which
  :func:`tolstat.compare` and :func:`tolstat.assess.evaluation` count) give, run by run, the
  pass/fail of :func:`tolstat.check`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tolstat
from tolstat.assess.rules import SelectRule, calibrate_and_score
from tolstat.calibration.decision import run_values

HW = "sim"


def _pair(rng: np.random.Generator, op: bool = False):
    k = int(rng.choice([16, 64]))
    a = rng.standard_normal((8, k)).astype(np.float16).astype(np.float64)
    b = rng.standard_normal((k, 8)).astype(np.float16).astype(np.float64)
    ref = a @ b
    out = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    if op:
        return out, ref, np.abs(a) @ np.abs(b), {"covariates": {"K": k}}
    return out, ref, None, {"covariates": {"K": k}}


def _pairs(seed: int, n: int, op: bool = False):
    rng = np.random.default_rng(seed)
    return [_pair(rng, op) for _ in range(n)]


def _dataset(pairs, op: bool):
    if op:
        items = [{"actual": o, "expected": r, "magnitude": m, **c} for o, r, m, c in pairs]
    else:
        items = [{"actual": o, "expected": r, **c} for o, r, m, c in pairs]
    return tolstat.from_pairs(items, op="matmul", dtype="fp16", hardware=HW, options=tolstat.CollectOptions(progress=False))


@pytest.fixture(scope="module")
def plain():
    pairs = _pairs(1, 360)
    return pairs, _dataset(pairs, False)


@pytest.fixture(scope="module")
def operator():
    pairs = _pairs(2, 360, op=True)
    return pairs, _dataset(pairs, True)


def _check(pair, table):
    out, ref, mag, cov = pair
    return tolstat.check(out, ref, op="matmul", dtype="fp16", table=table, hardware=HW,
                         covariates=cov["covariates"], options=tolstat.CheckOptions(magnitude=mag))


PLAIN_FORMS = [dict(), dict(form="allclose"), dict(form="size_aware"), dict(form=None),
               dict(form=None, statistic="max_rel"), dict(form=None, statistic="max_ulp"),
               dict(form=None, statistic=("max_abs", "bias"), fp_budget=0.03)]


def _tables(data, forms):
    pairs, ds = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [tolstat.select(ds, **{"fp_budget": 0.01, **kw}) for kw in forms]


@pytest.mark.parametrize("kw", PLAIN_FORMS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_check_compares_the_calibration_decision_value_of_every_run_plain(plain, kw):
    pairs, ds = plain
    (table,) = _tables(plain, [kw])
    ent = table.entry("matmul", "float16", HW)
    expect = {name: run_values(ds, name, ent.certificate if name == "op_score" else ent.scale)
              for name in ent.statistics}
    for i, pair in enumerate(pairs):
        r = _check(pair, table)
        for name in ent.statistics:
            assert r.statistics[name] == expect[name][i], (kw, i, name)
    if "bias" not in ent.statistics:
        (name,) = ent.statistics
        # the engine certified a threshold in the check's own units: one of the runs' values
        assert ent.statistics[name].threshold in set(expect[name].tolist())


@pytest.mark.parametrize("kw", [dict(), dict(form="operator")], ids=["default", "operator"])
def test_check_compares_the_calibration_decision_value_of_every_run_operator(operator, kw):
    pairs, ds = operator
    (table,) = _tables(operator, [kw])
    ent = table.entry("matmul", "float16", HW)
    assert ent.operator
    expect = run_values(ds, "op_score", ent.certificate)
    got = np.array([_check(p, table).statistics["op_score"] for p in pairs])
    np.testing.assert_array_equal(got, expect)


def test_a_correctly_rounded_output_has_decision_value_zero_and_passes(plain):
    pairs, ds = plain
    (table,) = _tables(plain, [dict(form=None)])
    out, ref, _, cov = pairs[0]
    rn = ref.astype(np.float16)
    r = tolstat.check(rn, ref, op="matmul", dtype="fp16", table=table, hardware=HW)
    assert r.passed and r.correctly_rounded and r.statistics["max_abs"] == 0.0
    assert "correctly rounded" in r.message()
    bad = rn.copy()
    bad[0, 0] = np.nextafter(bad[0, 0], np.float16(np.inf))  # one element one ULP off
    r2 = tolstat.check(bad, ref, op="matmul", dtype="fp16", table=table, hardware=HW)
    assert not r2.correctly_rounded and r2.statistics["max_abs"] > 0


@pytest.mark.parametrize("which", ["plain", "operator"])
def test_check_runs_compare_and_evaluate_decide_run_by_run_as_check(plain, operator, which):
    data = plain if which == "plain" else operator
    forms = PLAIN_FORMS[:4] if which == "plain" else [dict(), dict(form="operator")]
    pairs, ds = data
    fresh = _pairs(99, 200, op=which == "operator")
    # a few wrong outputs, so that both verdicts occur
    fresh += [(o * np.float16(1.01), r, m, c) for o, r, m, c in fresh[:40]]
    test = _dataset(fresh, which == "operator")
    for kw in forms:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = tolstat.select(ds, fp_budget=0.01, **kw)
            outcome = calibrate_and_score(SelectRule("t", **kw), ds, test, budget=0.01)
        by_check = np.array([_check(p, table).passed for p in fresh])
        assert (~by_check).any() and by_check.any(), kw
        np.testing.assert_array_equal(tolstat.check_runs(test, table), by_check, err_msg=str(kw))
        # compare and evaluate count a failure when the ratio exceeds 1
        np.testing.assert_array_equal(~(outcome.ratios > 1.0), by_check, err_msg=str(kw))


def test_ratio_to_a_zero_threshold_is_zero_for_exact_results_and_inf_above():
    """A zero threshold passes only exact results: ``0 / 0 = 0`` (a pass, ``ratio <= 1``),
    anything above 0 is ``inf`` (a fail), NaN stays NaN; the ratio fails exactly where
    :func:`~tolstat.calibration.decision.exceeds` does."""
    from tolstat.calibration.decision import exceeds, ratio

    x = np.array([0.0, -0.0, 5e-324, 1.0, np.inf, np.nan])
    r = ratio(x, 0.0)
    np.testing.assert_array_equal(r, [0.0, 0.0, np.inf, np.inf, np.inf, np.nan])
    np.testing.assert_array_equal(r > 1.0, exceeds(x, 0.0))
    assert ratio(0.0, 0.0) == 0.0


def test_ratio_of_a_huge_score_to_a_tiny_threshold_is_inf_without_a_warning():
    """``x / thr`` that overflows is a failed check (``inf``), from the array ratio (what
    compare and evaluate score) as from the scalar one (what check reports), and neither
    warns: a suite run with warnings as errors does not error on a far-off output."""
    import warnings

    from tolstat.calibration.decision import exceeds, ratio, ratio_value

    x = np.array([1e300, 1e-300, np.inf, 0.0, np.nan])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = ratio(x, 1e-300)
        v = [ratio_value(xi, 1e-300) for xi in x]
    np.testing.assert_array_equal(r, [np.inf, 1.0, np.inf, 0.0, np.nan])
    np.testing.assert_array_equal(r, v)
    np.testing.assert_array_equal(r > 1.0, exceeds(x, 1e-300))


@pytest.mark.parametrize("chunked", [False, True], ids=["in_memory", "dask"])
def test_run_values_of_rows_equal_the_values_of_the_runs_cut_out(plain, chunked):
    """``run_values(ds, ..., rows=r)`` scores the runs ``r`` (any order, repeats) exactly as
    ``run_values(ds.isel(run=r), ...)``, for the statistic that reads rows in place
    (``max_score``) and for those scored on the cut-out runs."""
    _, ds = plain
    if chunked:
        pytest.importorskip("dask")
        ds = ds.chunk({"run": 50})
    rng = np.random.default_rng(5)
    rows = np.concatenate([rng.permutation(ds.sizes["run"])[:200], [3, 3, 7]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tables = _tables((None, ds), [dict(form="allclose"), dict(form="size_aware")])
    models = [t.entry("matmul", "float16", HW).scale for t in tables]
    models.append(tolstat.models.ScaleModel.fit_free("float16"))
    for model in models:
        got = run_values(ds, "max_score", model, rows=rows)
        np.testing.assert_array_equal(got, run_values(ds.isel(run=rows), "max_score", model))
        assert np.unique(got).size > 3  # the runs' own scores, not one repeated value
    for name in ("max_abs", "max_rel", "bias"):
        np.testing.assert_array_equal(run_values(ds, name, rows=rows), run_values(ds.isel(run=rows), name))
    assert run_values(ds, "max_score", models[0], rows=np.zeros(0, dtype=int)).size == 0
