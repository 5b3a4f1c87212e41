"""The peers' rules of tolstat evaluate and compare: torch dynamo's ``same``, FlashAttention's
2x-eager rule and gpucheck's defaults, each decision checked where it is known in closed form."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tolstat
from tolstat.assess.rules import (PEER_VARIABLES, DynamoSameRule, EagerBaseline, FlashAttentionRule, GpucheckRule,
                                  dynamo_multiplier, make_rule)

BY = ("op", "dtype")


def _one_run(dtype: str = "float16", n: int = 2000, covariates: dict | None = None, actual=None, ref=None,
             **peer: float):
    """A one-run error dataset (``n`` elements) with the given peer variables (others 0)."""
    a = np.zeros(n, dtype=np.float16) if actual is None else actual
    e = np.zeros(n) if ref is None else ref
    item = (a, e, {}, covariates or {}) if covariates else (a, e)
    ds = tolstat.from_pairs([item], op="x", dtype=dtype, options=tolstat.CollectOptions(progress=False))
    vals = {k: 0.0 for k in PEER_VARIABLES}
    vals.update(peer)
    return ds.assign({k: ("run", np.array([v])) for k, v in vals.items()})


def _score(rule, ds) -> float:
    return float(rule.fit(None, budget=0.01, confidence=0.95, by=BY).score(ds)[0])


# --------------------------------------------------------------------------- dynamo same
def test_dynamo_rmse_exactly_m_times_eager_passes_and_a_little_more_fails():
    rule = DynamoSameRule(tol=0.0, multiplier=2.0)  # no absolute term, allclose only for equal outputs
    e = 1e-2
    assert _score(rule, _one_run(peer_rmse=2 * e, peer_eager_rmse=e, peer_eager_close=0.5)) <= 1.0
    assert _score(rule, _one_run(peer_rmse=2.01 * e, peer_eager_rmse=e, peer_eager_close=0.5)) > 1.0
    assert _score(rule, _one_run(peer_rmse=e, peer_eager_rmse=e, peer_eager_close=0.5)) == pytest.approx(0.5)


def test_dynamo_default_multiplier_and_absolute_term():
    # fp16 and bf16 outputs get 3 (torch's 'same' for half types), fp32 2 unless small or tol >= 2e-2
    assert dynamo_multiplier("float16", 5000, 1e-3) == 3.0 and dynamo_multiplier("bfloat16", 5000, 1e-3) == 3.0
    assert dynamo_multiplier("float32", 5000, 1e-3) == 2.0
    assert dynamo_multiplier("float32", 999, 1e-3) == 3.0 and dynamo_multiplier("float32", 5000, 2e-2) == 3.0
    rule = DynamoSameRule(tol=1e-3)
    e = 1e-2
    bound = 3.0 * e + 1e-3 / 10.0
    assert _score(rule, _one_run(peer_rmse=bound, peer_eager_rmse=e, peer_eager_close=1.0)) == 1.0
    assert _score(rule, _one_run(peer_rmse=3.01 * e + 1e-4, peer_eager_rmse=e, peer_eager_close=1.0)) > 1.0
    # an exact eager kernel: only the absolute term tol/10 is left
    assert _score(rule, _one_run(peer_rmse=1e-4, peer_eager_rmse=0.0, peer_eager_close=1.0)) == 1.0
    assert _score(rule, _one_run(peer_rmse=1.01e-4, peer_eager_rmse=0.0, peer_eager_close=1.0)) > 1.0


def test_dynamo_allclose_to_eager_passes_first():
    rule = DynamoSameRule(tol=1e-3)
    # |out - eager| <= tol (1 + |out|) everywhere: passes whatever the RMSE
    assert _score(rule, _one_run(peer_rmse=1.0, peer_eager_rmse=1e-3, peer_eager_close=1e-3)) == 1.0
    assert _score(rule, _one_run(peer_rmse=1.0, peer_eager_rmse=1e-3, peer_eager_close=1.001e-3)) > 1.0
    # NaN output: allclose fails (equal_nan=False) and the RMSE is NaN
    assert _score(rule, _one_run(peer_rmse=math.nan, peer_eager_rmse=1e-3, peer_eager_close=math.inf)) == math.inf


def _peer_variables_numpy(eager, ref, out, dtype):
    """The peer variables by their numpy expressions, term by term (the definition the
    one-pass kernel of EagerBaseline must equal, bit for bit)."""
    from tolstat._base.dtypes import round_to_format

    e = np.asarray(eager).astype(np.float64)
    r = np.asarray(ref, dtype=np.float64)
    lp = round_to_format(r, dtype).astype(np.float64)
    a = np.asarray(out).astype(np.float64)

    def rmse(x):
        d = (r - x).ravel()
        return float(np.sqrt(np.dot(d, d) / d.size)) if d.size else 0.0

    def max_abs_lp(x):
        if np.isfinite(x).all() and np.isfinite(lp).all():
            return float(np.abs(x - lp).max()) if x.size else 0.0
        v = np.abs(np.where(x == lp, 0.0, x - lp))
        return 0.0 if not v.size else (math.inf if np.isnan(v).any() else float(v.max()))

    close = np.abs(e - a) / (1.0 + np.abs(a))
    if not (np.isfinite(a).all() and np.isfinite(e).all()):
        close = np.where(e == a, 0.0, np.where(np.isfinite(e) & np.isfinite(a), close, np.inf))
    return {"peer_rmse": rmse(a), "peer_eager_rmse": rmse(e), "peer_eager_max_abs_lp": max_abs_lp(e),
            "peer_eager_close": float(close.max()) if close.size else 0.0, "peer_max_abs_lp": max_abs_lp(a)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("special", ["none", "nan_out", "inf_both", "inf_eager", "nan_ref", "inf_ref", "neg_zero"])
@pytest.mark.parametrize("shape", [(0,), (1,), (7, 33), (4, 5, 6)])
def test_eager_baseline_variables_equal_their_numpy_expressions(dtype, special, shape):
    from tolstat._base.dtypes import round_to_format

    rng = np.random.default_rng([len(shape), len(special), len(dtype)])
    ref = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
    eager = round_to_format(ref * (1 + 1e-3 * rng.standard_normal(shape)), dtype)
    out = round_to_format(ref * (1 + 1e-2 * rng.standard_normal(shape)), dtype)
    if out.size:
        flat_o, flat_e, flat_r = out.reshape(-1), eager.reshape(-1), ref.reshape(-1)
        if special == "nan_out":
            flat_o[-1] = np.nan
        elif special == "inf_both":
            flat_o[0] = flat_e[0] = -np.inf
        elif special == "inf_eager":
            flat_e[0] = np.inf
        elif special == "nan_ref":
            flat_r[0] = np.nan
        elif special == "inf_ref":
            flat_r[0] = np.inf
            flat_o[0] = np.inf
        elif special == "neg_zero":
            flat_o[:] = -0.0
            flat_e[:] = 0.0
            flat_r[:] = 0.0
    out_t = np.asfortranarray(out) if out.ndim > 1 else out  # a non-C-ordered output is compared element by element
    got = EagerBaseline(eager, ref, dtype).variables(out_t)
    want = _peer_variables_numpy(eager, ref, out, dtype)
    for k, v in want.items():
        assert (math.isnan(v) and math.isnan(got[k])) or (got[k] == v and math.copysign(1, got[k]) == math.copysign(1, v)), (k, got[k], v)


def test_eager_baseline_variables_in_closed_form():
    ref = np.zeros(1000)
    eager = np.full(1000, 2.0**-10, dtype=np.float16)
    base = EagerBaseline(eager, ref, "float16")
    out = np.full(1000, 2.0**-9, dtype=np.float16)  # exactly twice the eager error everywhere
    v = base.variables(out)
    assert v["peer_eager_rmse"] == 2.0**-10 and v["peer_rmse"] == 2.0**-9
    assert v["peer_eager_max_abs_lp"] == 2.0**-10 and v["peer_max_abs_lp"] == 2.0**-9
    assert v["peer_eager_close"] == pytest.approx(2.0**-10 / (1 + 2.0**-9))
    # FlashAttention's rounding term at out_ref = 0: 2 |fl(fl(0 + 0.3) - 0.3)| in float16
    third = np.float32(0.3)
    want = 2 * abs(float(np.float16(np.float32(np.float16(third)) - third)))
    assert v["peer_fa_atol"] == want > 0
    assert base.variables(eager)["peer_eager_close"] == 0.0 and base.variables(eager)["peer_rmse"] == 2.0**-10
    nan = out.copy()
    nan[3] = np.nan
    v = base.variables(nan)
    assert math.isnan(v["peer_rmse"]) and v["peer_max_abs_lp"] == math.inf and v["peer_eager_close"] == math.inf
    # equal infinities are close (torch.isclose), an infinity against a finite value is not
    inf_e = eager.copy()
    inf_e[0] = np.inf
    inf_o = out.copy()
    inf_o[0] = np.inf
    assert EagerBaseline(inf_e, ref, "float16").variables(inf_o)["peer_eager_close"] < 1
    assert EagerBaseline(eager, ref, "float16").variables(inf_o)["peer_eager_close"] == math.inf
    with pytest.raises(ValueError, match="shape"):
        base.variables(out[:10])


def test_dynamo_on_eager_baseline_outputs():
    ref = np.zeros(1000)
    eager = np.full(1000, 2.0**-10, dtype=np.float16)
    ds = [_one_run(**EagerBaseline(eager, ref, "float16").variables(np.full(1000, x, dtype=np.float16)))
          for x in (2.0**-9, 2.0**-8)]
    rule = DynamoSameRule(tol=0.0, multiplier=2.0)
    assert _score(rule, ds[0]) == 1.0  # 2x the eager RMSE
    assert _score(rule, ds[1]) == 2.0  # 4x


# --------------------------------------------------------------------------- FlashAttention
def test_flash_attention_twice_eager_plus_rounding_term():
    rule = FlashAttentionRule()
    e, atol = 3e-3, 1e-4
    assert _score(rule, _one_run(peer_max_abs_lp=2 * e + atol, peer_eager_max_abs_lp=e, peer_fa_atol=atol)) == 1.0
    assert _score(rule, _one_run(peer_max_abs_lp=2.01 * e + atol, peer_eager_max_abs_lp=e, peer_fa_atol=atol)) > 1
    # an exact eager kernel: the rounding term alone (the tests' fix for a zero baseline error)
    assert _score(rule, _one_run(peer_max_abs_lp=atol, peer_eager_max_abs_lp=0.0, peer_fa_atol=atol)) == 1.0
    assert _score(rule, _one_run(peer_max_abs_lp=0.0, peer_eager_max_abs_lp=0.0, peer_fa_atol=0.0)) == 0.0
    assert _score(rule, _one_run(peer_max_abs_lp=1e-9, peer_eager_max_abs_lp=0.0, peer_fa_atol=0.0)) == math.inf
    assert _score(FlashAttentionRule(factor=3.0),
                  _one_run(peer_max_abs_lp=3 * e + atol, peer_eager_max_abs_lp=e, peer_fa_atol=atol)) == 1.0


def test_eager_relative_rules_name_the_missing_variables():
    ds = tolstat.from_pairs([(np.float16([1.0]), np.array([1.0]))], op="x", dtype="float16",
                            options=tolstat.CollectOptions(progress=False))
    for rule in (DynamoSameRule(), FlashAttentionRule()):
        with pytest.raises(ValueError, match="EagerBaseline"):
            rule.fit(None, budget=0.01, confidence=0.95, by=BY).score(ds)
    with pytest.raises(ValueError):
        DynamoSameRule(tol=-1.0)
    with pytest.raises(ValueError):
        FlashAttentionRule(factor=0.0)


# --------------------------------------------------------------------------- gpucheck
@pytest.mark.parametrize("dtype, K, want", [
    ("float16", 512, 2.0**-6 / (1e-2 * 2.0)),     # atol 1e-2 x sqrt(512/128) = 2e-2: passes
    ("float16", 128, 2.0**-6 / 1e-2),             # the base: fails
    ("float16", 1, 2.0**-6 / 1e-2),               # K = 1 (pointwise): no k_dim, the base
    ("float16", None, 2.0**-6 / 1e-2),            # no K covariate: the base
    ("float16", 32, 2.0**-6 / (1e-2 * 0.5)),      # K < 128 narrows atol (gpucheck has no floor)
    ("bfloat16", 128, 2.0**-6 / 5e-2),            # bf16 base 5e-2
])
def test_gpucheck_atol_scales_with_sqrt_k(dtype, K, want):
    dt = np.float16 if dtype == "float16" else tolstat.corpus.np_dtype("bfloat16")
    a = np.full(8, 2.0**-6).astype(dt)  # |d| = 2^-6 against a zero reference (rtol x 0 = 0)
    ds = _one_run(dtype, covariates=None if K is None else {"K": K}, actual=a, ref=np.zeros(8))
    got = _score(GpucheckRule(), ds)
    assert (got > 1) == (want > 1)
    assert got == pytest.approx(want) if want <= 1 else got >= want * (1 - 1e-12)


def test_gpucheck_rtol_is_not_scaled():
    # |d| = 2^-6 at |ref| = 1: threshold atol x 2 + rtol x 1 = 2e-2 + 1e-2 (K = 512)
    ds = _one_run(covariates={"K": 512}, actual=np.full(4, 1.0 + 2.0**-6, dtype=np.float16), ref=np.ones(4))
    assert _score(GpucheckRule(), ds) == pytest.approx(2.0**-6 / 3e-2)


# --------------------------------------------------------------------------- in evaluate and compare
@pytest.fixture(scope="module")
def tiny():
    from tolstat.assess.evaluation import EvalConfig, evaluate

    return evaluate(EvalConfig.preset("tiny", ops=["gelu", "matmul"]), progress=False)


def test_evaluate_lists_the_peers(tiny, tmp_path):
    from tolstat.assess.evaluation import write_outputs

    names = [m.name for m in tiny.methods]
    for peer in ("dynamo same", "flash-attn 2x eager", "gpucheck"):
        assert peer in names and peer in tiny.table()
    assert not tiny.skipped.keys() & {"dynamo same", "flash-attn 2x eager", "gpucheck"}
    write_outputs(tiny, tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    rows = {r["method"]: r for r in doc["summary"]}
    assert {"dynamo same", "flash-attn 2x eager", "gpucheck"} <= rows.keys()
    rules = {m["name"]: m["rule"] for m in doc["methods"]}
    assert "rmse" in rules["dynamo same"] and "0.3" in rules["flash-attn 2x eager"]
    assert "sqrt(K/128)" in rules["gpucheck"]


def test_corpus_runs_carry_the_plain_variants_errors(tiny):
    """Each run's peer variables are its own and the plain variant's on the same inputs."""
    from tolstat.assess.corpus_runs import eager_variant

    cal = tiny.calibration
    assert eager_variant("matmul") == "tiled_bk32" and eager_variant("gelu") == "erf"
    for v in PEER_VARIABLES:
        assert np.isfinite(cal[v].values).all(), v
    # the run's RMSE is its own: between its mean and its max abs error (misaligned runs would not be)
    rmse = cal.peer_rmse.values
    assert (cal.mean_abs.values <= rmse * (1 + 1e-12)).all() and (rmse <= cal.max_abs.values * (1 + 1e-12)).all()
    var = cal.variant.values.astype(str)
    plain = np.array([eager_variant(op) == v for op, v in zip(cal.op.values.astype(str), var)])
    np.testing.assert_array_equal(rmse[plain], cal.peer_eager_rmse.values[plain])
    assert (cal.peer_eager_close.values[plain] == 0).all()
    # the runs of one case share the eager kernel's errors
    for op in ("gelu", "matmul"):
        sel = (cal.op.values == op) & (cal.dtype.values == "float16")
        case = cal.case.values[sel]
        e = cal.peer_eager_rmse.values[sel]
        for c in np.unique(case)[:5]:
            assert np.unique(e[case == c]).size == 1


def test_compare_scores_the_peers_with_the_same_rules(tiny):
    """compare's FP of a peer on correct runs is the share its own score flags (data-free: every fold
    is scored by the one rule)."""
    cal = tiny.calibration
    names = ["dynamo-same", "flash-attention", "gpucheck"]
    res = tolstat.compare(cal, methods=names, budgets=(0.1,), folds=2, progress=False)
    assert [str(m) for m in res.data["method"].values] == names
    rows = {r["method"]: r for r in res.rows}
    for name in names:
        direct = make_rule(name).fit(None, budget=0.1, confidence=0.95, by=BY).score(cal)
        assert not np.isnan(direct).any()  # inf: an output over a zero bound (see docs/evaluation.md)
        assert rows[name]["fp"] == int((direct > 1).sum()), name
