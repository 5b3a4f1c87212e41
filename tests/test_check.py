"""check / CheckResult / assert_close."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tolstat
from table_helpers import group as _group, table as _table
from tolstat.checks.checking import assert_close, check, check_metrics
from tolstat.checks.result import CheckResult
from tolstat.calibration.selection import select
from tolstat.measure import noise
from tolstat.measure.metrics import error_metrics
from tolstat.models.scale import ScaleModel

REF = tolstat.CheckOptions(magnitude="ref")

pytest_plugins = ["pytester"]


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


@pytest.fixture(scope="module")
def table():
    ds = tolstat.collect(_kernel, _ref, lambda r: tolstat.Inputs(args=(r.standard_normal((8, 8)),)),
                         op="mul3", dtype="float16", runs=600, hardware="cpu", seed=0, options=tolstat.CollectOptions(progress=False))
    return select(ds, fp_budget=0.01, form="allclose")


def test_correct_output_passes(table):
    x = np.random.default_rng(1).standard_normal((8, 8))
    r = check(_kernel(x), _ref(x), op="mul3", dtype="fp16", table=table)
    assert isinstance(r, CheckResult) and r.passed and bool(r)
    ent = table.entry("mul3", "float16")
    st = ent.statistics["max_score"]
    # the kernel is correctly rounded: decision value 0 (tolstat.calibration.decision), every threshold passes
    assert r.correctly_rounded and r.statistics["max_score"] == 0.0 and r.ratios["max_score"] == 0.0
    # one element one ULP off: the statistic recomputed here, max |d| / (atol + rtol |ref|) of the
    # table's scale model, is what the check compares
    out = _kernel(x)
    out[0, 0] = np.nextafter(out[0, 0], np.float16(np.inf))
    r2 = check(out, _ref(x), op="mul3", dtype="fp16", table=table)
    d = np.abs(out.astype(np.float64) - _ref(x))
    s = ent.scale.atol + ent.scale.rtol * np.abs(_ref(x))
    v = r2.statistics["max_score"]
    assert v == pytest.approx(float(np.max(d / s)), rel=1e-12) and not r2.correctly_rounded
    assert r2.thresholds["max_score"] == st.threshold
    assert r2.passed == (v <= st.threshold)
    # a correctly rounded output: every calibration run reached a value this large (0)
    assert r.probabilities["max_score"] == np.sum(st.top >= 0.0) / st.n
    assert r.atol == st.threshold * ent.scale.atol and r.rtol == st.threshold * ent.scale.rtol
    assert_close(_kernel(x), _ref(x), op="mul3", dtype="float16", table=table)


def test_message_content(table):
    x = np.random.default_rng(2).standard_normal((8, 8))
    out = _kernel(x)
    out[3, 5] = out[3, 5] + np.float16(0.25)
    with pytest.raises(AssertionError, match="tolstat check FAILED") as ei:
        assert_close(out, _ref(x), op="mul3", dtype="float16", table=table)
    m = str(ei.value)
    for part in ("op='mul3'", "dtype='float16'", "max_score", "threshold", "index (3, 5)",
                 f"actual={float(out[3, 5])!r}", f"expected={float(_ref(x)[3, 5])!r}",
                 "probability that a correct kernel", "beyond the data", "atol=", "rtol="):
        assert part in m, (part, m)


def test_torch_tensors(table):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((8, 8))
    r = check(torch.from_numpy(_kernel(x)), torch.from_numpy(_ref(x)), op="mul3", dtype=torch.float16,
              table=table)
    assert r.passed


def test_nonfinite_output_fails(table):
    x = np.random.default_rng(4).standard_normal((8, 8))
    out = _kernel(x)
    out[0, 0] = np.nan
    r = check(out, _ref(x), op="mul3", dtype="float16", table=table)
    assert not r.passed and r.n_nonfinite == 1 and r.worst_index == (0, 0)
    assert "non-finite" in r.notes["max_score"]


def test_missing_group_and_bad_inputs(table):
    x = np.ones((2, 2))
    with pytest.raises(KeyError, match="available groups"):
        check(x.astype(np.float16), x, op="softmax", dtype="float16", table=table)
    with pytest.raises(ValueError, match="shape"):
        check(np.ones(3, np.float16), x, op="mul3", dtype="float16", table=table)
    with pytest.raises(ValueError, match="NaN"):
        check(x.astype(np.float16), np.full((2, 2), np.nan), op="mul3", dtype="float16", table=table)
    with pytest.raises(TypeError, match="table must be a ToleranceTable, got dict"):
        check(x, x, op="mul3", dtype="float16", table={"atol": 1})


def test_size_aware_needs_covariate():
    def k(x):
        return np.cumsum(x.astype(np.float16), axis=-1, dtype=np.float16)[:, -1]

    def ref(x):
        return x.astype(np.float16).astype(np.float64).sum(axis=-1)

    def mk(r):
        K = int(r.choice([16, 64]))
        return tolstat.Inputs(args=(r.standard_normal((8, K)),), covariates={"K": K})

    ds = tolstat.collect(k, ref, mk, op="sum", dtype="float16", runs=400, hardware="cpu",
                         options=tolstat.CollectOptions(progress=False, op_model=False))  # sums rows: not torch.sum(x)
    t = select(ds, fp_budget=0.02, form="size_aware")
    x = np.random.default_rng(0).standard_normal((8, 64))
    with pytest.raises(ValueError, match="'K'"):
        check(k(x), ref(x), op="sum", dtype="float16", table=t)
    assert check(k(x), ref(x), op="sum", dtype="float16", table=t, covariates={"K": 64}).passed


def test_baseline_form_handles_zero_baseline():
    rng = np.random.default_rng(0)
    pairs = []
    for i in range(400):
        x = rng.standard_normal(32)
        e = x.astype(np.float16).astype(np.float64) * 3.0
        out = (e + rng.standard_normal(32) * 1e-3).astype(np.float16)
        base = 0.0 if i % 4 == 0 else float(np.abs(e - (e + rng.standard_normal(32) * 1e-3)).max())
        pairs.append((out, e, None, {"baseline_max_abs": base}))
    ds = tolstat.from_pairs(pairs, op="b", dtype="float16", hardware="cpu")
    t = select(ds, fp_budget=0.05, form="baseline",
               options=tolstat.SelectOptions(scale=tolstat.models.ScaleOptions(floor=4.0)))
    ent = t.entry("b", "float16")
    x = rng.standard_normal(32)
    e = x.astype(np.float16).astype(np.float64) * 3.0
    out = (e + rng.standard_normal(32) * 1e-3).astype(np.float16)
    r = check(out, e, op="b", dtype="float16", table=t, covariates={"baseline_max_abs": 0.0})
    assert ent.scale.form == "baseline"
    # zero baseline error: the scale is the floor 4 * eps(fp16) * ref_rms, not 0 (no inf/NaN score)
    floor = 4.0 * 2.0**-10 * np.sqrt(np.mean(e**2))
    want = np.max(np.abs(out.astype(np.float64) - e)) / floor
    assert r.statistics["max_score"] == pytest.approx(want, rel=1e-12)
    r2 = check(out, e, op="b", dtype="float16", table=t, covariates={"baseline_max_abs": 2 * floor})
    assert r2.statistics["max_score"] == pytest.approx(want / 2, rel=1e-12)


# --------------------------------------------------------------------------- message text
def _syn():
    from table_helpers import group, stat, table

    return table([
        group("mm", "float64", "gpuA", 0.5, top=[0.5, 0.25, 0.125]),
        group("mm", "float64", "*", 0.25, top=[0.2]),
    ]), table([
        group("mm", "float64", "*", 0.25, top=[0.2], extra={"bias": stat(3.0, top=[2.5])}),
    ], extra=("bias",)), table([group("ul", "float16", "*", 2.0, statistic="max_ulp", n=10000, top=[2.0, 1.0])],
                               statistic="max_ulp")


EXP = np.array([[1.0, 2.0], [3.0, 4.0]])


def test_failure_message_exact_text():
    """The whole message of a failing check through the '*' fallback, line by line."""
    t, _, _ = _syn()
    at = EXP.copy()
    at[1, 0] += 0.75
    r = check(at, EXP, op="mm", dtype="float64", table=t, hardware="gpuB")
    assert r.message().splitlines() == [
        "tolstat check FAILED: op='mm', dtype='float64', hardware=* (any hardware)",
        "  what is wrong: the largest error |actual - expected| is 3x what the threshold allows",
        "  [FAIL] max_abs = 0.75 vs threshold 0.25 (3x the threshold; max |actual - expected|)",
        "  allowed per element: |actual - expected| <= atol + rtol*|expected| with atol=0.25, rtol=0",
        "  worst element at index (1, 0): actual=3.75, expected=3.0 (|d|=0.75, allowed 0.25)",
        "  1 of 4 elements exceed their allowance",
        "  probability that a correct kernel gives a max_abs this large: ~0.0025 (beyond the data (the largest "
        "of 400 calibration scores is 0.2); no tail model: probability < 1/(n+1))",
        "  promise: a correct kernel fails this check with probability <= 0.01 (confidence 0.95; order_statistic "
        "of 400 calibration runs)",
    ]
    assert len(r.message().splitlines()) <= 10
    with pytest.raises(AssertionError, match=r"^my context\ntolstat check FAILED: op='mm'"):
        assert_close(at, EXP, op="mm", dtype="float64", table=t, hardware="gpuB", msg="my context")


def test_passing_message_exact_text():
    t, _, _ = _syn()
    at = EXP.copy()
    at[0, 1] += 0.125
    r = assert_close(at, EXP, op="mm", dtype="float64", table=t, hardware="gpuA")
    assert r.message().splitlines() == [
        "tolstat check passed: op='mm', dtype='float64', hardware=gpuA",
        "  [ok] max_abs = 0.125 vs threshold 0.5 (0.25x the threshold; max |actual - expected|)",
        "  allowed per element: |actual - expected| <= atol + rtol*|expected| with atol=0.5, rtol=0",
        "  worst element at index (0, 1): actual=2.125, expected=2.0 (|d|=0.125, allowed 0.5)",
        "  0 of 4 elements exceed their allowance",
        "  probability that a correct kernel gives a max_abs this large: ~0.0075 (empirical: 3 of 400 "
        "calibration runs reached this value)",
        "  promise: a correct kernel fails this check with probability <= 0.01 (confidence 0.95; order_statistic "
        "of 400 calibration runs)",
    ]


def test_message_ulp_nonfinite_and_bias():
    _, tb, tu = _syn()
    # max_ulp: no allclose form and no per-element allowance; a NaN output: probability 0
    a = np.float16([1.0, np.nan, 2.0])
    r = check(a, np.array([1.0, 1.0, 2.0]), op="ul", dtype="float16", table=tu)
    m = r.message().splitlines()
    assert m[0] == "tolstat check FAILED: op='ul', dtype='float16', hardware=* (any hardware)"
    assert m[1] == "  what is wrong: the largest error in ULPs of the output format is infx what the threshold allows"
    assert m[2] == "  [FAIL] max_ulp = inf vs threshold 2 (infx the threshold; max ULP distance)"
    assert not any("allowed per element" in ln for ln in m)
    assert m[3] == "  worst element at index (1): actual=nan, expected=1.0 (|d|=inf)"
    assert m[4] == "  1 of 3 elements exceed their allowance; 1 non-finite outputs"
    assert m[5] == ("  probability that a correct kernel gives a max_ulp this large: ~0 (non-finite output "
                    "(NaN/Inf): never produced by the correct calibration runs)")
    assert r.n_exceeding == 1 and r.worst_index == (1,) and math.isnan(r.worst_allowed)
    # 1/(n+1) < 1e-3 is printed in exponent form
    a = np.float16([1.0, 1.0 + 3 * 2.0**-10, 2.0])
    r = check(a, np.array([1.0, 1.0, 2.0]), op="ul", dtype="float16", table=tu)
    assert "~1.0e-04 (beyond the data" in r.message() and r.statistics["max_ulp"] == 3.0
    # a bias statistic: both lines, only the failing one's probability
    at = EXP + 0.2  # |d| = 0.2 everywhere: bias sqrt(4) * 0.2 / 0.2 = 2 <= 3, max 0.2 <= 0.25
    r = check(at, EXP, op="mm", dtype="float64", table=tb)
    assert r.passed and r.statistics["bias"] == pytest.approx(2.0)
    m = r.message().splitlines()
    assert m[2] == ("  [ok] bias = 2 vs threshold 3 (0.667x the threshold; sqrt(N)*|mean(actual - expected)| "
                    "/ mean|actual - expected| (bias))")
    assert sum("probability that a correct kernel" in ln for ln in m) == 1  # passed: first statistic only
    at = EXP + 0.24
    at[0, 0] = EXP[0, 0] + 0.3
    r = check(at, EXP, op="mm", dtype="float64", table=tb)
    assert r.failed == ("max_abs",) and "gives a max_abs this large" in r.message()
    assert "gives a bias this large" not in r.message()


def test_assert_close_passes_its_options_on():
    """assert_close forwards allow_nan (default False), covariates and hardware_policy."""
    from table_helpers import group, table

    t = table([group("mm", "float64", "gpuA", 0.5, top=[0.5])])
    nan_ref = np.array([1.0, np.nan])
    with pytest.raises(ValueError, match="reference .* contains 1 NaN"):
        assert_close(np.array([1.0, np.nan]), nan_ref, op="mm", dtype="float64", table=t)
    r = assert_close(np.array([1.0, np.nan]), nan_ref, op="mm", dtype="float64", table=t,
                     options=tolstat.CheckOptions(allow_nan=True))
    assert r.passed and r.statistics["max_abs"] == 0.0
    # hardware_policy: 'error' refuses an uncalibrated machine, 'nearest' takes the only one
    with pytest.raises(KeyError, match="gpuB"):
        assert_close(EXP, EXP, op="mm", dtype="float64", table=t, hardware="gpuB",
                     options=tolstat.CheckOptions(hardware_policy="error"))
    r = assert_close(EXP, EXP, op="mm", dtype="float64", table=t, hardware="gpuB",
                     options=tolstat.CheckOptions(hardware_policy="nearest"))
    assert r.hardware == "gpuA"


def test_assert_close_takes_exactly_the_keywords_of_check():
    """One definition of what a check takes: assert_close refuses any other keyword, by name."""
    import inspect

    from table_helpers import group, table

    t = table([group("mm", "float64", "gpuA", 0.5, top=[0.5])])
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['atol'\]"):
        assert_close(EXP, EXP, op="mm", dtype="float64", table=t, atol=1e-3)
    with pytest.raises(TypeError, match=r"needs the keyword argument\(s\) \['table'\]"):
        assert_close(EXP, EXP, op="mm", dtype="float64")
    kw = {n for n, p in inspect.signature(check).parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert kw == set(tolstat.checks.checking._CHECK_KEYWORDS) and {"op", "inputs", "params", "options"} <= kw
    assert not {"magnitude", "allow_nan", "hardware_policy"} & kw  # in CheckOptions


def test_assert_close_forwards_covariates(mul3):
    def k(x):
        return np.cumsum(x.astype(np.float16), axis=-1, dtype=np.float16)[:, -1]

    def ref(x):
        return x.astype(np.float16).astype(np.float64).sum(axis=-1)

    def mk(r):
        K = int(r.choice([16, 64]))
        return tolstat.Inputs(args=(r.standard_normal((8, K)),), covariates={"K": K})

    ds = tolstat.collect(k, ref, mk, op="sum", dtype="float16", runs=200, hardware="cpu",
                         options=tolstat.CollectOptions(progress=False, op_model=False))  # sums rows: not torch.sum(x)
    t = select(ds, fp_budget=0.05, form="size_aware")
    x = np.random.default_rng(0).standard_normal((8, 64))
    r = assert_close(k(x), ref(x), op="sum", dtype="float16", table=t, covariates={"K": 64})
    assert r.passed and r.statistics == check(k(x), ref(x), op="sum", dtype="float16", table=t,
                                              covariates={"K": 64}).statistics


def test_probability_format_boundary_and_unknown_method():
    """1e-3 is printed as 0.001 (the exponent form starts below it); a result without
    methods says '?'."""
    import dataclasses

    from table_helpers import group, table

    t = table([group("mm", "float64", "*", 0.5, n=1000, top=[0.5])])
    at = EXP.copy()
    at[0, 0] += 0.5
    r = check(at, EXP, op="mm", dtype="float64", table=t)
    assert r.passed and r.probabilities["max_abs"] == 1e-3
    assert "this large: ~0.001 (empirical: 1 of 1000" in r.message()
    assert "(confidence 0.95; ? of 1000 calibration runs)" in dataclasses.replace(r, methods={}).message()


def test_assert_close_hides_its_frame_from_pytest(pytester):
    """A failing assert_close shows the caller's line and the message, not library frames."""
    if "MUTANT_UNDER_TEST" in __import__("os").environ:
        pytest.skip("an in-process nested pytest run breaks mutmut's test-to-function bookkeeping")
    pytester.makepyfile("""
import numpy as np
from table_helpers import group, table
import tolstat

def test_it():
    t = table([group("mm", "float64", "*", 0.5)])
    tolstat.assert_close(np.array([2.0]), np.array([1.0]), op="mm", dtype="float64", table=t)
""")
    pytester.syspathinsert(str(__import__("pathlib").Path(__file__).parent))
    res = pytester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "tolstat check FAILED" in out and "tolstat.assert_close(np.array([2.0])" in out
    assert "r = check(actual, expected" not in out  # the library frame is hidden


# --------------------------------------------------------------------------- frames, dtypes, operator form
# Traceback hiding, check_metrics dtypes, the operator form.


def _frames_of_assert_close(entries):
    # the library frame (its code name is ``assert_close``, or a renamed copy of it under a
    # mutation-testing trampoline); not this test's own frame
    return [e.name for e in entries if "assert_close" in e.name and not e.name.startswith("test_")]


def test_failing_assert_close_hides_its_own_frame_from_pytest_tracebacks():
    t = _table([_group("add", "float32", "*", 0.5)])
    with pytest.raises(AssertionError, match="max_abs") as ei:
        assert_close(np.array([2.0], np.float32), np.array([1.0]), op="add", dtype="float32", table=t)
    assert _frames_of_assert_close(ei.traceback)  # the frame exists in the raw traceback
    # ... and pytest hides it (``__tracebackhide__ = True``): the report starts at the caller
    assert _frames_of_assert_close(ei.traceback.filter(ei)) == []


def test_check_metrics_scores_elements_at_the_entry_dtype_not_the_metrics_dtype():
    # a baseline-relative scale: s = max(base_err, floor * eps(dtype) * ref_rms); the entry is
    # for float32 while the metrics were computed from float64 arrays (m.dtype = float64)
    g = _group("mm", "float32", "*", 4.0, statistic="max_score")
    g["scale"] = ScaleModel(form="baseline", baseline="base_err", floor=1.0).to_dict()
    ent = _table([g], "max_score").entry("mm", "float32", "*")
    a = np.array([1.0, 2.0, 3.0])
    e = np.array([1.0, 2.0 + 2.0**-20, 3.0])
    m = error_metrics(a, e)
    assert m.dtype == "float64"
    r = check_metrics(m, a, e, ent, {"base_err": 0.0})
    rms = math.sqrt(float(np.mean(e**2)))
    ref = 2.0**-20 / (float(np.finfo(np.float32).eps) * rms)  # about 3.9: the float64 eps would give 2e9
    assert r.statistics["max_score"] == pytest.approx(ref, rel=1e-12)
    assert r.passed


# Operator-form checks (``_check_operator``, ``_op_inputs``): expected values from
# ``noise.record_statistics`` and ``noise.noise_scale`` (the documented definitions of the
# statistics and the noise scale), the combined score from its definition max_j T_j / q_j.
OP_NORMALISERS = {"op_max": 4.0, "op_rms": 2.0, "inv_row_sum": 3.0, "op_row_rms_max": 2.5}


def _optable(thr, *, rowwise=True, covariates=(), needs_magnitude=False, drop_needs=False):
    g = _group("softmax", "float16", "*", thr, statistic="op_score")
    cert = {"form": "operator", "method": "order_statistic", "normalisers": dict(OP_NORMALISERS),
            "rowwise": rowwise, "covariates": list(covariates), "needs_magnitude": needs_magnitude,
            "guarantee": "PAC: test"}
    if drop_needs:
        del cert["needs_magnitude"]
    g["certificate"] = cert
    return _table([g], statistic="op_score")


def _softmax_pair(seed=0, bug=0.0):
    x = np.random.default_rng(seed).standard_normal((4, 16))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    e = e / e.sum(axis=1, keepdims=True)
    a = (e * (1 + bug)).astype(np.float16)
    a[0, 3] = np.float16(float(a[0, 3]) * 1.01)  # one element off by about 1%: not correctly rounded
    return a, e


def _expected(a, e, K=1.0, rowwise=True):
    st = noise.record_statistics(a, e, dtype="float16", K=K, rowwise=rowwise, op="softmax")
    return {k: st[k] for k in OP_NORMALISERS}


@pytest.mark.parametrize("bug", [0.0, 0.05])
def test_operator_check_values_thresholds_and_worst_element(bug):
    a, e = _softmax_pair(bug=bug)
    st = _expected(a, e)
    s = max(v / OP_NORMALISERS[k] for k, v in st.items())
    thr = 1.5 * s if bug == 0 else 0.5 * s
    r = tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(thr), options=REF)
    assert r.passed == (bug == 0)
    assert r.statistics["op_score"] == pytest.approx(s, rel=1e-12)
    for k, v in st.items():
        assert r.statistics[k] == pytest.approx(v, rel=1e-9, abs=1e-300)  # row statistics need rowwise=True
        assert r.thresholds[k] == pytest.approx(thr * OP_NORMALISERS[k], rel=1e-15)
    assert set(r.failed) == ({k for k in r.statistics if r.statistics[k] > r.thresholds[k]})
    assert r.methods == {k: "order_statistic" for k in r.statistics}
    # the worst element: largest |d| / s_i, its error and its allowance thr * q_op_max * s_i
    sc = noise.noise_scale(e, dtype="float16").ravel()
    d = np.abs(a.astype(np.float64) - e).ravel()
    w = int(np.argmax(d / sc))
    assert r.worst_index == tuple(int(i) for i in np.unravel_index(w, e.shape))
    assert r.worst_error == d[w] and r.worst_actual == float(a.ravel()[w]) and r.worst_expected == e.ravel()[w]
    assert r.worst_allowed == pytest.approx(thr * OP_NORMALISERS["op_max"] * sc[w], rel=1e-12)
    assert r.n_exceeding == int(np.sum(d > thr * OP_NORMALISERS["op_max"] * sc))
    assert r.guarantee == "PAC: test"


def test_operator_check_rowwise_flag_and_op_are_used():
    a, e = _softmax_pair()
    flat = _expected(a, e, rowwise=False)
    rows = _expected(a, e, rowwise=True)
    assert math.isnan(flat["op_row_rms_max"]) and not math.isnan(rows["op_row_rms_max"])
    r = tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(100.0), options=REF)
    assert r.statistics["op_row_rms_max"] == pytest.approx(rows["op_row_rms_max"], rel=1e-9)
    assert r.statistics["inv_row_sum"] == pytest.approx(rows["inv_row_sum"], rel=1e-9)


def test_operator_check_reduction_length_default_and_covariate():
    a, e = _softmax_pair()
    r1 = tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(100.0), options=REF)
    assert r1.statistics["op_rms"] == pytest.approx(_expected(a, e, K=1.0)["op_rms"], rel=1e-9)
    t = _optable(100.0, covariates=["K"])
    r64 = tolstat.check(a, e, op="softmax", dtype="float16", table=t, options=REF, covariates={"K": 64})
    assert r64.statistics["op_rms"] == pytest.approx(_expected(a, e, K=64.0)["op_rms"], rel=1e-9)
    assert r64.statistics["op_rms"] != r1.statistics["op_rms"]
    with pytest.raises(ValueError, match="needs the covariate K"):
        tolstat.check(a, e, op="softmax", dtype="float16", table=t, options=REF)


def test_operator_check_magnitude_requirement():
    a, e = _softmax_pair()
    # calibrated without a magnitude: none needed
    assert tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(100.0)).passed
    for t in (_optable(100.0, needs_magnitude=True), _optable(100.0, drop_needs=True)):  # default: needed
        with pytest.raises(ValueError, match="pass inputs="):
            tolstat.check(a, e, op="softmax", dtype="float16", table=t)


def test_operator_check_ratio_of_zero_against_a_zero_threshold_is_zero():
    g = _group("softmax", "float16", "*", 0.0, statistic="op_score")
    g["certificate"] = {"form": "operator", "method": "order_statistic", "rowwise": True,
                        "normalisers": {"op_max": 4.0, "op_rms": 2.0}, "covariates": [],
                        "needs_magnitude": False, "guarantee": "PAC: test"}
    t = _table([g], statistic="op_score")
    e = np.array([[0.25, 0.5, 0.125, 0.125]])  # exactly representable in float16
    r = tolstat.check(e.astype(np.float16), e, op="softmax", dtype="float16", table=t, options=REF)
    assert r.passed and r.statistics == {"op_score": 0.0, "op_max": 0.0, "op_rms": 0.0}
    assert r.ratios == {"op_score": 0.0, "op_max": 0.0, "op_rms": 0.0}  # 0 / 0 is "at no fraction"
    bad = e.astype(np.float16)
    bad[0, 0] = np.float16(0.375)
    r = tolstat.check(bad, e, op="softmax", dtype="float16", table=t, options=REF)
    assert not r.passed and r.ratios["op_score"] == math.inf


def test_element_count_never_contradicts_the_verdict():
    from tolstat.checks.result import _elements_line

    class R:  # the fields the line reads
        correctly_rounded, n_nonfinite, n_elements = False, 0, 100

    r = R()
    r.passed, r.n_exceeding = False, 0
    assert "no single element exceeds its allowance" in _elements_line(r)
    r.passed, r.n_exceeding = True, 3
    assert "3 of 100 elements exceed their own allowance, which the threshold" in _elements_line(r)
    r.passed, r.n_exceeding = False, 3
    assert _elements_line(r) == "  3 of 100 elements exceed their allowance"


def test_operator_check_of_a_non_finite_output_names_the_non_finite_element():
    a, e = _softmax_pair()
    for bad in (np.inf, -np.inf):
        out = a.copy()
        out[2, 7] = bad
        r = tolstat.check(out, e, op="softmax", dtype="float16", table=_optable(100.0), options=REF)
        assert not r.passed and r.statistics["op_score"] == math.inf
        assert r.n_nonfinite == 1 and r.worst_index == (2, 7)
        assert r.worst_actual == bad and r.worst_expected == e[2, 7] and r.worst_error == math.inf


def _matmul_optable():
    g = _group("matmul", "float16", "*", 100.0, statistic="op_score")
    g["certificate"] = {"form": "operator", "method": "order_statistic", "rowwise": False,
                        "normalisers": {"op_max": 4.0, "op_rms": 2.0}, "covariates": ["K"],
                        "needs_magnitude": True, "guarantee": "PAC: test"}
    return _table([g], statistic="op_score")


def test_operator_check_with_inputs_equals_the_check_with_their_magnitude_and_K():
    rng = np.random.default_rng(11)
    A = rng.standard_normal((8, 32)).astype(np.float16)
    B = rng.standard_normal((32, 6)).astype(np.float16)
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    e = A64 @ B64
    out = e.astype(np.float16)
    out[3, 1] = np.nextafter(out[3, 1], np.float16(np.inf))  # one element one ULP off
    t = _matmul_optable()
    r = tolstat.check(out, e, op="matmul", dtype="float16", table=t, inputs=(A, B))
    hand = tolstat.check(out, e, op="matmul", dtype="float16", table=t, covariates={"K": 32},
                         options=tolstat.CheckOptions(magnitude=np.abs(A64) @ np.abs(B64)))
    assert not r.correctly_rounded and r.statistics["op_max"] > 0
    assert r.statistics == hand.statistics and r.passed and hand.passed
    assert (r.worst_index, r.worst_allowed) == (hand.worst_index, hand.worst_allowed)
    # inputs whose output has another shape than expected are refused
    with pytest.raises(ValueError, match=r"the inputs of 'matmul' give an output of shape \(8, 5\) but expected "
                                         r"has shape \(8, 6\)"):
        tolstat.check(out, e, op="matmul", dtype="float16", table=t, inputs=(A, B[:, :5]))


def test_operator_check_of_an_output_held_in_float64_equals_the_check_of_the_stored_output():
    a, e = _softmax_pair()
    t = _optable(100.0)
    r16 = tolstat.check(a, e, op="softmax", dtype="float16", table=t, options=REF)
    r64 = tolstat.check(a.astype(np.float64), e, op="softmax", dtype="float16", table=t, options=REF)
    assert not r16.correctly_rounded and r16.statistics["op_score"] > 0
    assert r64.statistics == r16.statistics and r64.passed == r16.passed
    assert (r64.worst_index, r64.worst_error, r64.n_exceeding) == (r16.worst_index, r16.worst_error, r16.n_exceeding)
    # the reference rounded once to float16, held in float64: correctly rounded, score 0
    exact = e.astype(np.float16).astype(np.float64)
    r = tolstat.check(exact, e, op="softmax", dtype="float16", table=t, options=REF)
    assert r.correctly_rounded and r.passed and r.statistics["op_score"] == 0.0
    # one float16 ULP off at one element: not correctly rounded
    off = exact.copy()
    off[1, 2] = float(np.nextafter(np.float16(off[1, 2]), np.float16(np.inf)))
    assert not tolstat.check(off, e, op="softmax", dtype="float16", table=t, options=REF).correctly_rounded


def test_the_verdict_line_of_a_pass_never_reads_as_a_contradiction():
    import dataclasses

    import tolstat

    rng = np.random.default_rng(5)
    pairs = []
    for _ in range(120):
        e = rng.standard_normal(64)
        pairs.append(((e + rng.standard_normal(64) * 2e-3).astype(np.float16), e))
    table = tolstat.select(tolstat.from_pairs(pairs, op="noisy", dtype="fp16"), fp_budget=0.05, form="allclose")
    e = rng.standard_normal(64)
    res = tolstat.check((e + rng.standard_normal(64) * 1e-3).astype(np.float16), e, op="noisy", dtype="fp16",
                        table=table)
    assert res.passed
    line = res.verdict_line()
    assert line.startswith("PASS noisy/float16: ") and "% of its threshold" in line
    # a statistic over its threshold in a passing check is named as not deciding, not as "<="
    k = next(iter(res.statistics))
    odd = dataclasses.replace(res, statistics={k: 2 * res.thresholds[k]}, ratios={k: 2.0}, failed=(k,))
    assert "is above its threshold" in odd.verdict_line() and "not the deciding statistic" in odd.verdict_line()
    rounded = tolstat.check(e.astype(np.float16), e, op="noisy", dtype="fp16", table=table)
    assert rounded.passed and "correctly rounded" in rounded.verdict_line()
    bad = tolstat.check((e * 1.1).astype(np.float16), e, op="noisy", dtype="fp16", table=table)
    assert not bad.passed and bad.verdict_line().startswith("FAIL noisy/float16: ")


def test_operator_check_note_names_the_statistic_that_trips_first_only_when_one_applies():
    """The note names the statistic attaining the combined score; when none of the table's
    statistics applies to the output (here a row statistic of a table that is not
    row-wise), the score is NaN and the note names none."""
    e = np.array([[0.25, 0.5, 0.125, 0.125]])  # exactly representable in float16
    base = "no probability quoted: the threshold is an order statistic of the combined score"
    for rowwise, want in ((True, base + "; op_row_rms_max trips first"), (False, base)):
        g = _group("softmax", "float16", "*", 100.0, statistic="op_score")
        g["certificate"] = {"form": "operator", "method": "order_statistic", "rowwise": rowwise,
                            "normalisers": {"op_row_rms_max": 2.0}, "covariates": [],
                            "needs_magnitude": False, "guarantee": "PAC: test"}
        r = check(e.astype(np.float16), e, op="softmax", dtype="float16", table=_table([g], statistic="op_score"),
                  options=REF)
        assert r.notes == {"op_score": want, "op_row_rms_max": want}, rowwise
        assert math.isnan(r.statistics["op_score"]) != rowwise


@pytest.mark.parametrize("form", ["allclose", "operator"])
def test_check_warns_for_an_output_larger_than_every_calibration_run(form, tmp_path):
    import warnings

    from tolstat.checks.checking import CalibrationRangeWarning

    rng = np.random.default_rng(3)
    pairs = []
    for i in range(320):
        x = rng.standard_normal((2, 8 + 8 * (i % 2))).astype(np.float16)  # 16 or 32 elements
        y = (x.astype(np.float32) * 3).astype(np.float16)
        pairs.append({"actual": y, "expected": x.astype(np.float64) * 3, "inputs": (x, np.float16(3.0))})
    ds = tolstat.from_pairs(pairs, op="mul", dtype="float16", hardware="cpu",
                            options=tolstat.CollectOptions(progress=False))
    t = select(ds, fp_budget=0.01, form=form)
    assert t.entry("mul", "float16", "cpu").certificate["n_elements_max"] == 32
    t.to_json(tmp_path / "t.json")
    loaded = tolstat.load_table(tmp_path / "t.json")

    def run(n_rows, table):
        x = rng.standard_normal((n_rows, 16)).astype(np.float16)
        y = (x.astype(np.float32) * 3).astype(np.float16)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            check(y, x.astype(np.float64) * 3, op="mul", dtype="float16", table=table, hardware="cpu",
                  inputs=(x, np.float16(3.0)))
        return [w for w in got if issubclass(w.category, CalibrationRangeWarning)]

    assert run(2, t) == [] and run(2, loaded) == []  # 32 elements: calibrated
    for table in (t, loaded):
        (w,) = run(5, table)  # 80 elements
        msg = str(w.message)
        assert "(mul, float16, cpu)" in msg and "80 elements" in msg and "2.5x" in msg and "(32)" in msg
        assert w.filename == __file__  # points at the caller's check
    x = rng.standard_normal((5, 16)).astype(np.float16)
    with pytest.warns(CalibrationRangeWarning) as rec:  # through assert_close too, at the caller's line
        assert_close((x.astype(np.float32) * 3).astype(np.float16), x.astype(np.float64) * 3, op="mul",
                     dtype="float16", table=t, hardware="cpu", inputs=(x, np.float16(3.0)))
    assert rec[0].filename == __file__


def test_tables_without_the_calibrated_size_do_not_warn(table):
    import warnings

    cert = table.entry("mul3", "float16", "cpu").certificate
    assert cert["n_elements_max"] == 64
    d = table.to_dict()
    for grp in d["groups"]:
        grp["certificate"].pop("n_elements_max")
    old = tolstat.ToleranceTable.from_groups(d.pop("groups"), d)
    x = np.random.default_rng(4).standard_normal((40, 40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(_kernel(x), _ref(x), op="mul3", dtype="float16", table=old, hardware="cpu")
