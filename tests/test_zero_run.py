"""Tolerances from zero runs (tolstat.ops.zero_run): the model-based threshold and its fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tolstat.ops as ops
from tolstat._base.dtypes import unit_roundoff
from tolstat.ops import (MODEL_LABEL, UnknownOpError, check_zero_run, fit_scale, fit_tolerance, tail_factor,
                         tolerance)

U16, U32 = unit_roundoff("float16"), unit_roundoff("float32")
TINY16 = float(np.finfo(np.float16).tiny)


def _inputs(rng: np.random.Generator, m: int = 32, k: int = 256, n: int = 16) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16))


def _matmul_f32(a: np.ndarray, b: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """fp16 inputs, products and sums in float32, one store to float16."""
    acc = a.astype(np.float32) @ b.astype(np.float32)
    return (acc * np.float32(scale)).astype(np.float16)


def _matmul_splitk_f16(a: np.ndarray, b: np.ndarray, splits: int = 4) -> np.ndarray:
    """Split-K whose partial sums are added in float16 (atomic adds into the fp16 output)."""
    k = a.shape[1] // splits
    out = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for s in range(splits):
        part = a[:, s * k:(s + 1) * k].astype(np.float32) @ b[s * k:(s + 1) * k].astype(np.float32)
        out = (out.astype(np.float32) + part).astype(np.float16)
    return out


def _ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def test_exported_lazily_from_ops():
    assert ops.tolerance is tolerance
    assert "tolerance" in ops.__all__ and "check_zero_run" in ops.__all__


def test_fp16_matmul_passes_correct_runs_and_catches_a_one_percent_scale_error():
    rng = np.random.default_rng(0)
    caught = 0
    for _ in range(40):
        a, b = _inputs(rng)
        tol = tolerance("matmul", "float16", (a, b), fp_budget=0.01)
        ref = _ref(a, b)
        assert tol.passes(_matmul_f32(a, b), ref)
        caught += tol.failed(_matmul_f32(a, b, scale=1.01), ref)
    assert caught == 40
    # a per-element threshold: the check decides with the worst element's ratio
    a, b = _inputs(rng)
    good = check_zero_run(_matmul_f32(a, b), _ref(a, b), op="torch.matmul", dtype="fp16", inputs=(a, b))
    bad = check_zero_run(_matmul_f32(a, b, 1.01), _ref(a, b), op="matmul", dtype="float16", inputs=(a, b))
    assert good.passed and good.worst_ratio <= 1.0 and bool(good)
    assert not bad.passed and bad.worst_ratio > 1.0 and len(bad.worst_index) == 2
    assert bad.tolerance.atol.shape == (32, 16) and bad.tolerance.rtol == U16


def test_threshold_is_half_ulp_plus_the_probabilistic_accumulation_term():
    rng = np.random.default_rng(1)
    a, b = _inputs(rng, m=8, k=100, n=4)
    tol = tolerance("matmul", "float16", (a, b), fp_budget=0.01)
    m = np.abs(a.astype(float)) @ np.abs(b.astype(float))
    lam = math.sqrt(2 * math.log(2 * 32 / 0.01))
    assert tol.n == 32 and tol.K == 100 and tol.acc_dtype == "float32" and tol.scale == 1.0
    assert tol.tail == pytest.approx(lam, rel=1e-12)
    expected = U16 * np.abs(_ref(a, b)) + lam * (1 + U16) * 10.0 * U32 * m + U16 * TINY16
    np.testing.assert_allclose(tol.threshold(_ref(a, b)), expected, rtol=1e-12)
    np.testing.assert_allclose(tol.atol + tol.rtol * np.abs(_ref(a, b)), expected, rtol=1e-12)
    # one store to the output format is allowed per intermediate rounding the author names
    two = tolerance("matmul", "float16", (a, b), stores=2)
    np.testing.assert_allclose(two.threshold(_ref(a, b)) - tol.threshold(_ref(a, b)), 2 * U16 * m, rtol=1e-9)


def test_union_bound_grows_like_sqrt_log_n_over_budget():
    rng = np.random.default_rng(2)
    tails = {}
    for rows in (1, 16, 256):
        a, b = _inputs(rng, m=rows, k=64, n=8)
        for budget in (1e-2, 1e-4, 1e-6):
            t = tolerance("matmul", "float16", (a, b), fp_budget=budget)
            assert t.n == rows * 8
            assert t.tail ** 2 / 2 == pytest.approx(math.log(2 * t.n / budget), rel=1e-12)
            tails[rows, budget] = t.tail
            np.testing.assert_allclose(t.atol - U16 * TINY16, t.tail * t.unit, rtol=1e-12,
                                       atol=1e-300)
    for budget in (1e-2, 1e-4, 1e-6):
        assert tails[1, budget] < tails[16, budget] < tails[256, budget]
    for rows in (1, 16, 256):
        assert tails[rows, 1e-2] < tails[rows, 1e-4] < tails[rows, 1e-6]
    assert tail_factor(0.01 / 8) == pytest.approx(tails[1, 1e-2])


def test_label_is_model_based_never_certified():
    rng = np.random.default_rng(3)
    a, b = _inputs(rng, m=4, k=16, n=4)
    assert MODEL_LABEL == ("model-based: assumes independent, mean-zero rounding errors (probabilistic "
                           "rounding-error analysis), not certified by calibration runs")
    tol = tolerance("mm", "bfloat16", (a, b))
    assert tol.label == MODEL_LABEL
    runs = [(_matmul_f32(a, b), _ref(a, b), (a, b))]
    fitted = fit_tolerance(runs, op="matmul", dtype="float16")
    assert fitted.label.startswith(MODEL_LABEL) and "fitted on 1 runs" in fitted.label
    for label in (tol.label, fitted.label, fitted.tolerance((a, b), fp_budget=1e-5).label):
        assert label.replace("not certified", "").find("certified") == -1


def test_fit_scale_meets_the_plotting_positions_and_recovers_a_gaussian_scale():
    rng = np.random.default_rng(4)
    n, c_true, R = 64, 0.3, 100
    excess = np.abs(rng.standard_normal((R, n)) * c_true).max(axis=1)
    c = fit_scale(excess, [n] * R)
    assert 0.2 < c < 0.45  # the Gaussian's max over n elements sits under lambda(1/(R+1) / n)
    for j in range(1, R + 1):  # at budget j/(R+1) the fitted threshold fails at most j - 1 runs
        assert np.sum(excess > c * np.sqrt(2 * np.log(2 * n * (R + 1) / j))) <= j - 1
    assert fit_scale(excess, [n] * R) < fit_scale(excess * 2, [n] * R)
    # held out: at 1e-3 per check the fitted threshold fails about 1e-3 of fresh runs, not 1e-2
    fresh = np.abs(rng.standard_normal((20000, n)) * c_true).max(axis=1)
    assert np.mean(fresh > c * tail_factor(1e-3 / n)) < 3e-3
    assert fit_scale([0.0, 0.0], [5, 5]) == 0.0


def test_fit_raises_the_constant_for_a_kernel_with_fp16_partial_sums():
    rng = np.random.default_rng(5)
    runs = []
    for _ in range(30):
        a, b = _inputs(rng, m=16, k=256, n=8)
        runs.append((_matmul_splitk_f16(a, b), _ref(a, b), (a, b)))
    # the zero-run model (one rounding to fp16) does not describe fp16 partial sums
    assert sum(tolerance("matmul", "float16", x[2]).failed(x[0], x[1]) for x in runs) > 10
    fitted = fit_tolerance(runs, op="matmul", dtype="float16")
    pure = fit_tolerance(runs, op="matmul", dtype="float16", floor=0.0)
    assert fitted.scale == pure.scale > 10.0 and fitted.n_runs == 30
    fresh_fail = 0
    for _ in range(30):
        a, b = _inputs(rng, m=16, k=256, n=8)
        tol = fitted.tolerance((a, b), fp_budget=1e-5)
        assert tol.scale == fitted.scale and tol.fp_budget == 1e-5
        out, ref = _matmul_splitk_f16(a, b), _ref(a, b)
        fresh_fail += tol.failed(out, ref)
        assert tol.failed(out, ref) == (tol.excess(out, ref) > tol.scale * tol.tail)
        assert tol.failed(_matmul_f32(a, b, 1.01), ref)
    assert fresh_fail == 0
    # a correctly rounded-like kernel fits below the theory's constant; the floor keeps it at 1
    ok = [(_matmul_f32(*x[2]), x[1], x[2]) for x in runs]
    assert fit_tolerance(ok, op="matmul", dtype="float16", floor=0.0).scale < 1.0
    assert fit_tolerance(ok, op="matmul", dtype="float16").scale == 1.0


def test_bfloat16_rowwise_op_by_alias():
    import ml_dtypes

    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    ref = e / e.sum(-1, keepdims=True)
    x32 = x.astype(np.float32)
    e32 = np.exp(x32 - x32.max(-1, keepdims=True))
    out = (e32 / e32.sum(-1, keepdims=True)).astype(ml_dtypes.bfloat16)
    tol = tolerance("F.softmax", "bf16", (x,), {"dim": -1})
    assert tol.op == "softmax" and tol.dtype == "bfloat16" and tol.K == 64 and tol.rtol == 2.0 ** -8
    assert tol.passes(out, ref) and tol.failed(out.astype(np.float64) * 1.02, ref)


def test_non_finite_pairs():
    a = np.array([[1.0, np.inf]], np.float16)
    b = np.ones((2, 1), np.float16)
    tol = tolerance("matmul", "float16", (a, b))
    ref = np.array([[np.inf]])
    assert tol.passes(np.array([[np.inf]], np.float16), ref)
    assert tol.failed(np.array([[np.nan]], np.float16), ref)


def test_errors_name_the_argument_and_value():
    a = np.ones((2, 3), np.float16)
    b = np.ones((3, 2), np.float16)
    for bad in (0, 1, 1.5, -0.1, "0.01", True, math.nan):
        with pytest.raises(ValueError, match=r"fp_budget .*" + (repr(bad) if not isinstance(bad, float)
                                                                else "")):
            tolerance("matmul", "float16", (a, b), fp_budget=bad)
    with pytest.raises(ValueError, match="dtype .*'int8'"):
        tolerance("matmul", "int8", (a, b))
    with pytest.raises(ValueError, match="acc_dtype .*'nope'"):
        tolerance("matmul", "float16", (a, b), acc_dtype="nope")
    with pytest.raises(ValueError, match="stores .*-1"):
        tolerance("matmul", "float16", (a, b), stores=-1)
    with pytest.raises(UnknownOpError, match="no operator model for 'my_kernel'.*register"):
        tolerance("my_kernel", "float16", (a, b))
    with pytest.raises(TypeError, match="op must be"):
        tolerance(None, "float16", (a, b))
    tol = tolerance("matmul", "float16", (a, b))
    with pytest.raises(ValueError, match=r"expected has shape \(3, 3\).*\(2, 2\)"):
        tol.passes(np.ones((3, 3)), np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"actual has shape \(1, 4\)"):
        tol.passes(np.ones((1, 4)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="delta must be a probability in \\(0, 2\\), got 0"):
        tail_factor(0)
    with pytest.raises(ValueError, match="runs is empty"):
        fit_tolerance([], op="matmul", dtype="float16")
    with pytest.raises(TypeError, match="run 0: expected \\(actual, expected, inputs"):
        fit_tolerance([np.ones(3)], op="matmul", dtype="float16")
    with pytest.raises(ValueError, match="run 0: a mapping run needs.*'inputs'"):
        fit_tolerance([{"actual": 1, "expected": 1}], op="matmul", dtype="float16")
    with pytest.raises(ValueError, match="floor must be .*-1"):
        fit_tolerance([(a, a, (a, b))], op="matmul", dtype="float16", floor=-1)
    with pytest.raises(ValueError, match="excess of run 1 is inf.*calibrate"):
        fit_scale([0.1, math.inf], [4, 4])
    with pytest.raises(ValueError, match="one length"):
        fit_scale([0.1], [4, 4])
    # an error where the model allows none (relu is exact: m = 0 off its support)
    x = np.array([-1.0, 2.0], np.float16)
    with pytest.raises(ValueError, match="the model does not describe this kernel"):
        fit_tolerance([(np.array([0.5, 2.0]), np.array([0.0, 2.0]), (x,))], op="relu", dtype="float16")
