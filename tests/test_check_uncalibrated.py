"""``check`` of a group the table does not have: ``CheckOptions(uncalibrated=...)``.

``"raise"`` (the default) raises :class:`tolstat.calibration.table.MissingGroup`, a
``KeyError``; ``"model"`` decides the output by the zero-run threshold of
:func:`tolstat.ops.tolerance` (``stores=1``, the table's budget, 0.01 without a table),
labelled model-based. A group the table has but refused still raises.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import tolstat
from tolstat.calibration.table import MissingGroup
from tolstat.checks.options import CheckOptions
from tolstat.ops.zero_run import MODEL_LABEL, check_zero_run

MODEL = CheckOptions(uncalibrated="model")


def _pair(rng, m=32, k=128, n=32, scale=1.0):
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    out = ((a.astype(np.float32) @ b.astype(np.float32)) * np.float32(scale)).astype(np.float16)
    return out, a.astype(np.float64) @ b.astype(np.float64), (a, b)


@functools.lru_cache(maxsize=1)
def _softmax_table():
    """A table of another group (softmax): matmul checks find no group in it."""
    rng = np.random.default_rng(0)
    items = []
    for _ in range(60):
        x = rng.standard_normal((8, 64)).astype(np.float16)
        y = x.astype(np.float64)
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        ref = e / e.sum(axis=-1, keepdims=True)
        items.append({"actual": ref.astype(np.float16), "expected": ref, "inputs": (x, -1)})
    ds = tolstat.from_pairs(items, op="softmax", dtype="float16", hardware="cpu:test",
                            options=tolstat.CollectOptions(progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tolstat.select(ds, fp_budget=0.05)


def test_missing_group_raises_by_default():
    out, ref, inputs = _pair(np.random.default_rng(1))
    with pytest.raises(MissingGroup, match="no tolerance for op='matmul'"):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=_softmax_table(), inputs=inputs)
    assert issubclass(MissingGroup, KeyError)


@pytest.mark.parametrize("scale", [1.0, 1.004, 1.02])
def test_model_decides_as_the_zero_run_threshold_at_the_table_budget(scale):
    rng = np.random.default_rng(2)
    table = _softmax_table()
    for _ in range(5):
        out, ref, inputs = _pair(rng, k=int(rng.choice([16, 128, 512])), scale=scale)
        r = tolstat.check(out, ref, op="matmul", dtype="float16", table=table, inputs=inputs, options=MODEL)
        z = check_zero_run(out, ref, op="matmul", dtype="float16", inputs=inputs, fp_budget=table.fp_budget,
                           stores=1)
        assert r.passed == z.passed
        assert r.statistics["zero_run"] == z.worst_ratio
        assert r.worst_index == z.worst_index
        assert r.methods == {"zero_run": "model_zero_run"} and r.n_calibration == 0
        assert r.fp_budget == table.fp_budget
        assert MODEL_LABEL in r.message() and "no table group" in r.message()
    assert scale != 1.02 or not r.passed  # a 2 % scale error is caught


def test_without_a_table_the_budget_is_one_percent():
    out, ref, inputs = _pair(np.random.default_rng(3))
    r = tolstat.check(out, ref, op="matmul", dtype="float16", table=None, inputs=inputs, options=MODEL)
    z = check_zero_run(out, ref, op="matmul", dtype="float16", inputs=inputs, fp_budget=0.01, stores=1)
    assert r.fp_budget == 0.01 and r.statistics["zero_run"] == z.worst_ratio and r.passed


def test_correct_runs_pass_and_a_scale_bug_fails_end_to_end():
    # fresh correct fp32-accumulating runs through check at a 1 % budget: the model-based
    # threshold fails at most a few of 300 (binomial(300, 0.01) exceeds 9 with probability
    # about 1e-3); every run of a 1 % scale error fails
    rng = np.random.default_rng(4)
    fails = caught = 0
    for _ in range(300):
        k = int(rng.choice([8, 64, 256, 1024]))
        out, ref, inputs = _pair(rng, m=16, k=k, n=16)
        fails += not tolstat.check(out, ref, op="matmul", dtype="float16", table=None, inputs=inputs,
                                   options=MODEL).passed
    for _ in range(20):
        out, ref, inputs = _pair(rng, m=16, k=64, n=16, scale=1.01)
        caught += not tolstat.check(out, ref, op="matmul", dtype="float16", table=None, inputs=inputs,
                                    options=MODEL).passed
    assert fails <= 9
    assert caught == 20


def test_a_calibrated_group_is_checked_with_its_table():
    rng = np.random.default_rng(5)
    table = _softmax_table()
    x = rng.standard_normal((8, 64)).astype(np.float16)
    y = x.astype(np.float64)
    e = np.exp(y - y.max(axis=-1, keepdims=True))
    ref = e / e.sum(axis=-1, keepdims=True)
    r = tolstat.check(ref.astype(np.float16), ref, op="softmax", dtype="float16", table=table, inputs=(x, -1),
                      options=MODEL)
    assert "zero_run" not in r.statistics and r.n_calibration > 0


def test_refused_group_is_not_replaced_by_the_model():
    rng = np.random.default_rng(6)
    items = [dict(zip(("actual", "expected", "inputs"), _pair(rng, scale=1.001))) for _ in range(20)]
    ds = tolstat.from_pairs(items, op="matmul", dtype="float16", hardware="cpu:test",
                            options=tolstat.CollectOptions(progress=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = tolstat.select(ds, fp_budget=0.001, on_error="skip")
    out, ref, inputs = _pair(rng)
    with pytest.raises(KeyError, match="has no op_score threshold") as exc:
        tolstat.check(out, ref, op="matmul", dtype="float16", table=table, inputs=inputs, options=MODEL)
    assert not isinstance(exc.value, MissingGroup)


def test_errors_name_what_is_missing():
    out, ref, inputs = _pair(np.random.default_rng(7))
    with pytest.raises(TypeError, match=r"needs options=CheckOptions\(uncalibrated='model'\)"):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=None, inputs=inputs)
    with pytest.raises(ValueError, match="needs inputs="):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=None, options=MODEL)
    with pytest.raises(ValueError, match=r"CheckOptions.uncalibrated must be one of \('raise', 'model'\), got 'x'"):
        CheckOptions(uncalibrated="x")
    with pytest.raises(KeyError, match="register"):
        tolstat.check(out, ref, op="my_unknown_op", dtype="float16", table=None, inputs=inputs, options=MODEL)


def test_assert_close_raises_with_the_model_message():
    rng = np.random.default_rng(8)
    out, ref, inputs = _pair(rng, scale=1.05)
    with pytest.raises(AssertionError, match="model-based threshold from zero runs"):
        tolstat.assert_close(out, ref, op="matmul", dtype="float16", table=None, inputs=inputs, options=MODEL)
    out, ref, inputs = _pair(rng)
    tolstat.assert_close(out, ref, op="matmul", dtype="float16", table=None, inputs=inputs, options=MODEL)


@pytest.mark.parametrize("policy", ["exact", "pooled", "nearest", "error"])
def test_under_a_hardware_policy_only_a_missing_op_and_dtype_is_modelled(policy):
    rng = np.random.default_rng(9)
    out, ref, inputs = _pair(rng)
    opts = CheckOptions(uncalibrated="model", hardware_policy=policy)
    r = tolstat.check(out, ref, op="matmul", dtype="float16", table=_softmax_table(), inputs=inputs,
                      hardware="gpu:other", options=opts)
    assert r.methods == {"zero_run": "model_zero_run"}
    if policy in ("exact", "error"):  # softmax/float16 is calibrated, on other hardware: the policy refuses it
        x = rng.standard_normal((8, 64)).astype(np.float16)
        with pytest.raises(KeyError, match="under hardware_policy") as exc:
            tolstat.check(x, x.astype(np.float64), op="softmax", dtype="float16", table=_softmax_table(),
                          inputs=(x, -1), hardware="gpu:other", options=opts)
        assert not isinstance(exc.value, MissingGroup)
