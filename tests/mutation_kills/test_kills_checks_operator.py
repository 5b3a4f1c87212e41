"""Checks against an operator-form table entry (``checks._check_operator``, ``_op_inputs``).

The expected values come from :func:`tolstat.measure.noise.record_statistics` and
:func:`tolstat.measure.noise.noise_scale` (the documented definitions of the statistics and the
noise scale), the combined score from its definition ``max_j T_j / q_j``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tolstat
from tolstat.measure import noise

from table_helpers import group as _group, table as _table  # noqa: E402

Q = {"op_max": 4.0, "op_rms": 2.0, "inv_row_sum": 3.0, "op_row_rms_max": 2.5}


def _optable(thr, *, rowwise=True, covariates=(), needs_magnitude=False, drop_needs=False):
    g = _group("softmax", "float16", "*", thr, statistic="op_score")
    cert = {"form": "operator", "method": "order_statistic", "normalisers": dict(Q), "rowwise": rowwise,
            "covariates": list(covariates), "needs_magnitude": needs_magnitude, "guarantee": "PAC: test"}
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
    return {k: st[k] for k in Q}


@pytest.mark.parametrize("bug", [0.0, 0.05])
def test_operator_check_values_thresholds_and_worst_element(bug):
    a, e = _softmax_pair(bug=bug)
    st = _expected(a, e)
    s = max(v / Q[k] for k, v in st.items())
    thr = 1.5 * s if bug == 0 else 0.5 * s
    r = tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(thr), magnitude="ref")
    assert r.passed == (bug == 0)
    assert r.statistics["op_score"] == pytest.approx(s, rel=1e-12)
    for k, v in st.items():
        assert r.statistics[k] == pytest.approx(v, rel=1e-9, abs=1e-300)  # row statistics need rowwise=True
        assert r.thresholds[k] == pytest.approx(thr * Q[k], rel=1e-15)
    assert set(r.failed) == ({k for k in r.statistics if r.statistics[k] > r.thresholds[k]})
    assert r.methods == {k: "order_statistic" for k in r.statistics}
    # the worst element: largest |d| / s_i, its error and its allowance thr * q_op_max * s_i
    sc = noise.noise_scale(e, dtype="float16").ravel()
    d = np.abs(a.astype(np.float64) - e).ravel()
    w = int(np.argmax(d / sc))
    assert r.worst_index == tuple(int(i) for i in np.unravel_index(w, e.shape))
    assert r.worst_error == d[w] and r.worst_actual == float(a.ravel()[w]) and r.worst_expected == e.ravel()[w]
    assert r.worst_allowed == pytest.approx(thr * Q["op_max"] * sc[w], rel=1e-12)
    assert r.n_exceeding == int(np.sum(d > thr * Q["op_max"] * sc))
    assert r.guarantee == "PAC: test"


def test_operator_check_rowwise_flag_and_op_are_used():
    a, e = _softmax_pair()
    flat = _expected(a, e, rowwise=False)
    rows = _expected(a, e, rowwise=True)
    assert math.isnan(flat["op_row_rms_max"]) and not math.isnan(rows["op_row_rms_max"])
    r = tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(100.0), magnitude="ref")
    assert r.statistics["op_row_rms_max"] == pytest.approx(rows["op_row_rms_max"], rel=1e-9)
    assert r.statistics["inv_row_sum"] == pytest.approx(rows["inv_row_sum"], rel=1e-9)


def test_operator_check_reduction_length_default_and_covariate():
    a, e = _softmax_pair()
    r1 = tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(100.0), magnitude="ref")
    assert r1.statistics["op_rms"] == pytest.approx(_expected(a, e, K=1.0)["op_rms"], rel=1e-9)
    t = _optable(100.0, covariates=["K"])
    r64 = tolstat.check(a, e, op="softmax", dtype="float16", table=t, magnitude="ref", covariates={"K": 64})
    assert r64.statistics["op_rms"] == pytest.approx(_expected(a, e, K=64.0)["op_rms"], rel=1e-9)
    assert r64.statistics["op_rms"] != r1.statistics["op_rms"]
    with pytest.raises(ValueError, match="needs the covariate K"):
        tolstat.check(a, e, op="softmax", dtype="float16", table=t, magnitude="ref")


def test_operator_check_magnitude_requirement():
    a, e = _softmax_pair()
    # calibrated without a magnitude: none needed
    assert tolstat.check(a, e, op="softmax", dtype="float16", table=_optable(100.0)).passed
    for t in (_optable(100.0, needs_magnitude=True), _optable(100.0, drop_needs=True)):  # default: needed
        with pytest.raises(ValueError, match="pass magnitude="):
            tolstat.check(a, e, op="softmax", dtype="float16", table=t)
