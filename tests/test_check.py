"""check / CheckResult / assert_close."""

from __future__ import annotations

import numpy as np
import pytest

import tolstat
from tolstat.checks import CheckResult, assert_close, check
from tolstat.selection import select


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


@pytest.fixture(scope="module")
def table():
    ds = tolstat.collect(_kernel, _ref, lambda r: tolstat.Inputs(args=(r.standard_normal((8, 8)),)),
                         op="mul3", dtype="float16", runs=600, hardware="cpu", seed=0, progress=False)
    return select(ds, fp_budget=0.01, form="allclose")


def test_correct_output_passes(table):
    x = np.random.default_rng(1).standard_normal((8, 8))
    r = check(_kernel(x), _ref(x), op="mul3", dtype="fp16", table=table)
    assert isinstance(r, CheckResult) and r.passed and bool(r)
    assert r.ratios["max_score"] <= 1 and 0 < r.probabilities["max_score"] <= 1
    assert r.atol > 0 and r.rtol > 0
    assert_close(_kernel(x), _ref(x), op="mul3", dtype="float16", table=table)


def test_message_content(table):
    x = np.random.default_rng(2).standard_normal((8, 8))
    out = _kernel(x)
    out[3, 5] = out[3, 5] + np.float16(0.25)
    with pytest.raises(AssertionError) as ei:
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
    with pytest.raises(TypeError):
        check(x, x, op="mul3", dtype="float16", table={"atol": 1})


def test_size_aware_needs_covariate():
    def k(x):
        return np.cumsum(x.astype(np.float16), axis=-1, dtype=np.float16)[:, -1]

    def ref(x):
        return x.astype(np.float16).astype(np.float64).sum(axis=-1)

    def mk(r):
        K = int(r.choice([16, 64]))
        return tolstat.Inputs(args=(r.standard_normal((8, K)),), covariates={"K": K})

    ds = tolstat.collect(k, ref, mk, op="sum", dtype="float16", runs=400, hardware="cpu", progress=False)
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
    t = select(ds, fp_budget=0.05, form="baseline", scale=tolstat.ScaleOptions(floor=4.0))
    ent = t.entry("b", "float16")
    x = rng.standard_normal(32)
    e = x.astype(np.float16).astype(np.float64) * 3.0
    out = (e + rng.standard_normal(32) * 1e-3).astype(np.float16)
    r = check(out, e, op="b", dtype="float16", table=t, covariates={"baseline_max_abs": 0.0})
    assert np.isfinite(r.statistics["max_score"]) and ent.scale.form == "baseline"
