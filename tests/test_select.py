"""select / ToleranceTable / split_budget / scale fitting: unit tests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tolstat
from tolstat.models.scale import fit_allclose, quantreg, quantreg_lp
from tolstat.calibration.bounds import Calibration, TailOptions
from tolstat.calibration.options import SelectOptions
from tolstat.calibration.selection import calibrate, select
from tolstat.calibration.table import ToleranceTable, load_table
from tolstat._base.inference import split_budget


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def _make(rng):
    s = float(rng.choice([1.0, 10.0, 100.0]))
    return tolstat.Inputs(args=(s * rng.standard_normal(64),), covariates={"scale": s})


@pytest.fixture(scope="module")
def ds():
    a = tolstat.collect(_kernel, _ref, _make, op="mul3", dtype="float16", runs=400, hardware="gpuA", seed=0,
                        options=tolstat.CollectOptions(progress=False))
    b = tolstat.collect(_kernel, _ref, _make, op="mul3", dtype="float16", runs=400, hardware="gpuB", seed=1,
                        options=tolstat.CollectOptions(progress=False))
    return tolstat.concat([a, b])


def test_split_budget():
    assert split_budget(0.01, 100, method="bonferroni") == pytest.approx(1e-4)
    assert split_budget(0.01, 100) == pytest.approx(1e-4)  # Bonferroni by default: a union bound
    s = split_budget(0.01, 100, method="sidak", independent=True)
    assert 1 - (1 - s) ** 100 == pytest.approx(0.01)
    assert s > 1e-4
    with pytest.raises(ValueError, match="not a union bound"):
        split_budget(0.01, 100, method="sidak")
    with pytest.raises(ValueError, match=r"suite_budget must be a probability in \[1e-09, 0.5\]"):
        split_budget(0.0, 3)
    with pytest.raises(ValueError, match="n_checks must be a positive integer, got 0"):
        split_budget(0.1, 0)
    with pytest.raises(ValueError, match="'bonferroni' or 'sidak', got 'holm'"):
        split_budget(0.1, 2, method="holm")


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5, float("nan"), "x"])
def test_bad_budget_and_confidence(ds, bad):
    with pytest.raises(ValueError, match="fp_budget"):
        select(ds, form=None, fp_budget=bad)
    with pytest.raises(ValueError, match="confidence"):
        select(ds, form=None, fp_budget=0.01, confidence=bad)


def test_bad_scores_are_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        calibrate([], 0.01)
    with pytest.raises(ValueError, match="NaN"):
        calibrate([1.0, np.nan] * 200, 0.01)
    with pytest.raises(ValueError, match="infinite"):
        calibrate([1.0, np.inf] * 200, 0.01)
    with pytest.raises(ValueError, match="statistic"):
        select(tolstat.from_pairs([(np.float16([1]), np.array([1.0]))], op="a", dtype="fp16"), form=None, fp_budget=0.1,
               statistic="mean")


def test_too_few_runs_names_the_minimum():
    x = np.random.default_rng(0).exponential(size=40)
    with pytest.raises(ValueError, match=r"n >= 299"):
        calibrate(x, 0.01, 0.95)
    with pytest.raises(ValueError, match=r"n >= 299"):
        calibrate(np.random.default_rng(0).exponential(size=100), 0.01, method="order_statistic")


def test_auto_records_method_and_reason(ds):
    t = select(ds, form=None, fp_budget=0.01)
    e = t.entry("mul3", "float16", "gpuA")
    st = e.statistics["max_abs"]
    assert st.method == "order_statistic" and "400 calibration units >= 299" in st.reason
    # budget 1e-3 with 400 runs: below the order statistic's 2995 for the group and for its pool
    # of 2 groups: refused, with the numbers; the default method never picks the tail model
    t2 = select(ds, fp_budget=1e-3, form="allclose", on_error="skip")
    meth = str(t2.data["method"].values[0, 0])
    reason = str(t2.data["reason"].values[0, 0])
    # every run here is correctly rounded (x * 3 rounded once): the exact path, its threshold
    # the resolution floor; what it promises is stated with the numbers
    assert meth == "exact" and "2995" in reason
    # asked for explicitly, the tail model is tried; on these few fp16 rounding levels the GPD
    # fit fails its KS test, so both groups are refused with the numbers
    t3 = select(ds, fp_budget=1e-3, form="allclose", on_error="skip", options=SelectOptions(method="evt"))
    for i, hw in enumerate(("gpuA", "gpuB")):
        assert str(t3.data["method"].values[i, 0]) == "refused"
        reason = str(t3.data["reason"].values[i, 0])
        assert reason.startswith(f"group (mul3, float16, {hw}) statistic max_score: ")
        for part in ("needs n >= 2995 runs for budget 0.001", "have n = 400", "the tail model was refused",
                     "a continuous GPD tail does not describe them", "Collect at least 2995 runs"):
            assert part in reason, (part, reason)
        assert np.isnan(t3.data["threshold"].values[i, 0])


def test_lookup_fallbacks_and_missing(ds):
    t = select(ds, form=None, fp_budget=0.01)
    assert t.entry("mul3", "fp16", "gpuA").fallback == "exact"
    with pytest.raises(KeyError, match="several hardware"):
        t.entry("mul3", "float16")
    with pytest.raises(KeyError, match=r"available groups: \(mul3, float16, gpuA\)"):
        t.entry("softmax", "float16", "gpuA")
    with pytest.raises(KeyError, match="available"):
        t.entry("mul3", "float16", "gpuC")
    pooled = select(ds, form=None, fp_budget=0.01, by=("op", "dtype"))
    e = pooled.entry("mul3", "float16", "gpuC")
    assert e.hardware == "*" and e.fallback == "any hardware" and e.n == 800


def test_json_round_trip_exact(ds, tmp_path):
    t = select(ds, fp_budget=0.02, form="allclose", statistic=("max_abs", "bias"))
    p = tmp_path / "t.json"
    t.to_json(p)
    d = json.loads(p.read_text())
    assert d["tolstat_table"] == 1 and d["groups"][0]["statistics"]["max_score"]["method"]
    t2 = load_table(p)
    assert t2.to_json() == t.to_json()
    for v in ("threshold", "estimate", "top_scores", "scale_atol", "scale_rtol"):
        np.testing.assert_array_equal(t2.data[v].values, t.data[v].values)
    e1, e2 = t.entry("mul3", "float16", "gpuB"), t2.entry("mul3", "float16", "gpuB")
    assert e1.scale == e2.scale
    assert e1.statistics["bias"].threshold == e2.statistics["bias"].threshold


def test_netcdf_round_trip(ds, tmp_path):
    t = select(ds, fp_budget=0.01, form="allclose")
    t.to_netcdf(tmp_path / "t.nc")
    t2 = load_table(tmp_path / "t.nc")
    assert t2.to_json() == t.to_json()


def test_load_table_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tolerance table at .*nope.json"):
        load_table(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ValueError, match="not a tolstat"):
        load_table(tmp_path / "x.json")
    (tmp_path / "y.json").write_text('{"tolstat_table": 99, "groups": []}')
    with pytest.raises(ValueError, match="schema 99"):
        load_table(tmp_path / "y.json")


def test_assert_close_kwargs(ds):
    t = select(ds, fp_budget=0.01, form="allclose", by=("op", "dtype"))
    kw = t.to_assert_close_kwargs()
    atol, rtol = kw[("mul3", "float16")]["atol"], kw[("mul3", "float16")]["rtol"]
    e = t.entry("mul3", "float16")
    c = e.statistics["max_score"].threshold
    assert atol == pytest.approx(c * e.scale.atol) and rtol == pytest.approx(c * e.scale.rtol)
    t_abs = select(ds, form=None, fp_budget=0.01, by=("op", "dtype"))
    assert t_abs.to_assert_close_kwargs()[("mul3", "float16")]["rtol"] == 0.0


def test_allclose_form_is_relative(ds):
    """Pure output rounding (x*3 in fp16): the fit is rtol-dominated, near fp16 unit roundoff."""
    t = select(ds, fp_budget=0.01, form="allclose")
    sc = t.entry("mul3", "float16", "gpuA").scale
    assert sc.rtol == pytest.approx(2.0**-11, rel=0.3)
    assert sc.atol < 1e-3 * sc.rtol * 100


def test_quantreg_reproduces_statsmodels():
    from statsmodels.regression.quantile_regression import QuantReg

    rng = np.random.default_rng(0)
    r = rng.uniform(0, 10, 3000)
    d = np.abs(rng.standard_normal(3000)) * (1e-3 + 5e-4 * r)
    X = np.column_stack([np.ones_like(r), r])
    # tolstat's quantreg = statsmodels QuantReg on column-rescaled data, scaled back
    ys, cs = d.max(), X.max(axis=0)
    ref = QuantReg(d / ys, X / cs).fit(q=0.9, max_iter=2000).params * ys / cs
    np.testing.assert_allclose(quantreg(d, X, 0.9), ref, rtol=1e-12)
    # statsmodels on the raw (badly scaled) data agrees to its IRLS tolerance
    np.testing.assert_allclose(QuantReg(d, X).fit(q=0.9).params, ref, rtol=1e-2)
    # the exact LP solution agrees with the IRLS solution
    np.testing.assert_allclose(quantreg_lp(d, X, 0.9), ref, rtol=2e-3)
    coef, names, notes = fit_allclose(d, r, 0.9)
    np.testing.assert_allclose(coef, ref, rtol=1e-12)
    assert names == ["atol", "rtol"] and notes == ""


@pytest.mark.parametrize("case", ["linear", "three columns", "ties and zeros", "few runs", "constant column",
                                  "iteration limit", "heavy tail"])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_quantreg_iterations_are_statsmodels_bit_for_bit(case, q):
    """The IRLS quantreg runs (statsmodels' iteration without its covariance and history)
    gives QuantReg's coefficients exactly, not only to a tolerance."""
    import warnings
    import zlib

    from statsmodels.regression.quantile_regression import QuantReg

    from tolstat.models.scale import _quantreg_irls

    rng = np.random.default_rng([zlib.crc32(case.encode()), int(q * 100)])
    n = 7 if case == "few runs" else 4000
    r = rng.uniform(0, 10, n)
    d = np.abs(rng.standard_normal(n)) * (1e-3 + 5e-4 * r)
    cols = [np.ones(n), r]
    if case == "three columns":
        cols.append(np.sqrt(r))
    if case == "constant column":
        cols.append(np.full(n, 2.0))
    if case == "ties and zeros":
        d = np.round(d * 2e3) / 2e3
    if case == "heavy tail":
        d = np.abs(rng.standard_cauchy(n)) * (1e-3 + 5e-4 * r)
    X = np.column_stack(cols)
    max_iter = 3 if case == "iteration limit" else 2000
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = QuantReg(d, X).fit(q=q, max_iter=max_iter).params
    np.testing.assert_array_equal(_quantreg_irls(d, X, q, max_iter=max_iter), want)


def test_negative_rtol_is_dropped():
    rng = np.random.default_rng(1)
    r = rng.uniform(0, 10, 2000)
    d = np.abs(rng.standard_normal(2000)) * (1e-2 - 5e-4 * r)
    coef, _, notes = fit_allclose(d, r, 0.9)
    assert coef[1] == 0.0 and "rtol" in notes and coef[0] > 0


def _noisy_kernel(x):
    """A correct kernel that is not correctly rounded: a zero-mean perturbation before rounding."""
    rng = np.random.default_rng(abs(hash(x.tobytes())) % 2**32)
    return (_ref(x) * (1 + rng.uniform(-2.0**-11, 2.0**-11, x.shape))).astype(np.float16)


def test_bias_statistic_catches_systematic_error():
    nds = tolstat.collect(_noisy_kernel, _ref, lambda r: tolstat.Inputs(args=(r.uniform(0.5, 1.0, 64),)),
                          op="mul3", dtype="float16", runs=800, hardware="gpuA", seed=0, options=tolstat.CollectOptions(progress=False))
    t = select(nds, form=None, fp_budget=0.01, statistic=("max_abs", "bias"), by=("op", "dtype"))
    e = t.entry("mul3", "float16")
    assert e.statistics["max_abs"].budget == pytest.approx(0.005)
    assert e.statistics["bias"].confidence == pytest.approx(0.975)
    from tolstat.checks.checking import check

    x = np.random.default_rng(5).uniform(0.5, 1.0, 64)  # |ref| in 1.5..3
    ref = _ref(x)
    bad = (ref * (1 + 2.0**-11)).astype(np.float16)  # one-ulp-ish systematic scale error
    r = check(bad, ref, op="mul3", dtype="float16", table=t)
    assert "bias" in r.failed
    assert r.statistics["max_abs"] <= r.thresholds["max_abs"]


def test_refused_groups_with_skip():
    small = tolstat.collect(_noisy_kernel, _ref, lambda r: tolstat.Inputs(args=(r.uniform(0.5, 1.0, 64),)),
                            op="mul3", dtype="float16", runs=40, hardware="gpuA", seed=0, options=tolstat.CollectOptions(progress=False))
    with pytest.raises(ValueError, match="40 calibration units < 299 needed"):
        select(small, form=None, fp_budget=0.01)
    t = select(small, form=None, fp_budget=0.01, on_error="skip")
    assert t.data["method"].values[0, 0] == "refused"
    with pytest.raises(KeyError, match="no max_abs threshold"):
        t.entry("mul3", "float16", "gpuA")


def test_table_requires_schema():
    with pytest.raises(ValueError, match=r"not a tolstat tolerance table \(schema None, expected 1\)"):
        ToleranceTable(__import__("xarray").Dataset())


def test_evt_beyond_data_is_marked(ds):
    x = np.random.default_rng(2).exponential(size=500)
    c = calibrate(x, 1e-4, 0.95, method="evt")
    assert c.method == "evt" and "beyond the data" in c.reason and c.threshold > x.max()
    assert math.isfinite(c.tail["xi"])


# --------------------------------------------------------------------------- options, provenance, seeds
# Options passed through, provenance, budget split, seeds, statistic entries.


def _ds(n=200, seed=0):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        e = rng.standard_normal(32)
        # a correct kernel that is not correctly rounded (a zero-mean perturbation first)
        pairs.append(((e * (1 + rng.uniform(-2.0**-24, 2.0**-24, 32))).astype(np.float32), e))
    return tolstat.from_pairs(pairs, op="add", dtype="float32", options=tolstat.CollectOptions(progress=False))


def test_select_passes_its_tail_options_to_each_group():
    ds = _ds()
    # budget 1e-3 at n = 200 needs the tail model (an order statistic needs n >= 2995)
    default = tolstat.select(ds, fp_budget=1e-3, form=None, options=SelectOptions(method="evt"))
    e = default.entry("add", "float32").statistics["max_abs"]
    assert e.method == "evt" and np.isfinite(e.threshold)
    strict = tolstat.select(ds, fp_budget=1e-3, form=None, on_error="skip",
                            options=SelectOptions(method="evt", tail=TailOptions(min_tail_runs=500)))
    reason = str(strict.data["reason"].values.ravel()[0])
    assert "500" in reason and not np.isfinite(float(strict.data["threshold"].values.ravel()[0]))


def _rowsum_ds(n=60):
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(n):
        x = rng.standard_normal((8, 32))
        a = x.astype(np.float16).sum(axis=1, dtype=np.float16).astype(np.float16)
        pairs.append((a, x.sum(axis=1), np.abs(x).sum(axis=1)))
    return tolstat.from_pairs(pairs, op="rowsum", dtype="float16", options=tolstat.CollectOptions(progress=False))


def test_operator_select_passes_pooling_and_on_error():
    ds = _rowsum_ds()  # 60 runs: too few for budget 0.01 (299 units) in one group
    pooled = tolstat.select(ds, fp_budget=0.01, on_error="skip")
    reason = str(pooled.data["reason"].values.ravel()[0])
    assert "its pool has 1 group(s) < min_pool" in reason and "pooling is off" not in reason
    unpooled = tolstat.select(ds, fp_budget=0.01, on_error="skip", options=SelectOptions(pooling=False))
    assert str(unpooled.data["reason"].values.ravel()[0]).endswith("pooling is off")
    with pytest.raises(tolstat.NotEnoughData, match="calibration units < 299 needed"):
        tolstat.select(ds, fp_budget=0.01)


def test_calibrate_budget_floor_and_labels_in_messages():
    from tolstat._base import validate as _validate
    from tolstat.calibration.selection import calibrate

    x = np.random.default_rng(1).exponential(size=400)
    with pytest.raises(ValueError, match="budget must be a probability"):
        calibrate(x, _validate.MIN_BUDGET / 8.5, 0.95)
    with pytest.raises(ValueError, match=r"^group \(a\): 1 calibration score\(s\) are NaN"):
        calibrate(np.append(x, np.nan), 0.01, 0.95, label="(a)")
    c = calibrate(x, 0.01, 0.95, method="conformal", label="(b)")
    assert c.method == "conformal"
    with pytest.raises(tolstat.NotEnoughData, match=r"^group \(b\): "):
        calibrate(x[:50], 0.01, 0.95, method="conformal", label="(b)")


def test_select_provenance_records_the_version_and_settings():
    ds = _ds(n=300)  # one dataset: its provenance carries a creation time
    t = tolstat.select(ds, fp_budget=0.05, form=None, options=SelectOptions(seed=3))
    prov = t.meta["provenance"]
    assert prov["tolstat_version"] == tolstat.__version__ and prov["function"] == "tolstat.select"
    assert prov["settings"]["seed"] == 3 and prov["n_runs"] == 300
    assert prov["settings"]["statistic"] == ["max_abs"]
    assert prov["errors_provenance"] == json.loads(ds.attrs["provenance"]) and prov["errors_provenance"]


def test_two_statistics_split_the_budget_by_the_union_bound_only():
    ds = _ds(n=300)
    t = tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"])
    assert {k: v.budget for k, v in t.entry("add", "float32").statistics.items()} == {"max_abs": 0.025, "bias": 0.025}
    assert t.meta["provenance"]["settings"]["statistic"] == ["max_abs", "bias"]
    # the statistics of one run are not independent: a Sidak split is refused
    with pytest.raises(ValueError, match="'sidak' is not a union bound"):
        tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"],
                       options=SelectOptions(budget_split="sidak"))


def test_operator_select_uses_the_seed_to_split_fit_and_calibration_units():
    ds = _rowsum_ds(n=150)  # budget 0.05: 59 calibration units are enough
    c = [tolstat.select(ds, fp_budget=0.05, options=SelectOptions(seed=s)).entry("rowsum", "float16").certificate
         for s in (0, 1)]
    assert c[0]["n_fit"] == c[1]["n_fit"] and c[0]["n_cal"] == c[1]["n_cal"]
    assert c[0]["normalisers"] != c[1]["normalisers"]  # other units fitted the normalisers
    again = tolstat.select(ds, fp_budget=0.05, options=SelectOptions(seed=1)).entry("rowsum", "float16").certificate
    assert again["normalisers"] == c[1]["normalisers"]  # and the same seed gives the same split


def test_sidak_split_is_the_exact_independent_share():
    a, m = 0.05, 4
    s = split_budget(a, m, method="sidak", independent=True)
    assert s == pytest.approx(1.0 - (1.0 - a) ** (1.0 / m), rel=1e-14)
    assert 1.0 - (1.0 - s) ** m == pytest.approx(a, rel=1e-13)  # m independent checks: total budget a


def test_select_passes_its_seed_to_the_scale_fit_subsample():
    def kernel(x):
        return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)

    def ref(x):
        return x.astype(np.float16).astype(np.float64) * 3.0

    ds = tolstat.collect(kernel, ref, lambda r: tolstat.Inputs(args=(r.standard_normal((8, 8)),)),
                         op="mul3", dtype="float16", runs=120, hardware="cpu", seed=0, options=tolstat.CollectOptions(progress=False))
    opts = tolstat.models.ScaleOptions(max_points=200)  # 7680 elements: a seeded subsample of 200
    from tolstat.calibration.units import split_units

    models = {}
    for seed in (3, 4):
        t = tolstat.select(ds, fp_budget=0.05, form="allclose",
                           options=SelectOptions(scale=opts, seed=seed, method="order_statistic"))
        ent = t.entry("mul3", "float16", "cpu")
        models[seed] = ent.scale.to_dict()
        # fitted on the engine's fitting part A (24 of 120 units, split with the same seed)
        n_fit = ent.certificate["n_fit"]
        assert n_fit == 24
        iA, _ = split_units(120, n_fit, seed)
        assert models[seed] == opts.fit(ds.isel(run=iA), "allclose", seed=seed).to_dict()
    assert models[3] != models[4]  # the subsample (and so the fit) depends on the seed


def _calibration(reason="order statistic"):
    tail = {"u": 1.0, "sigma": 0.5, "xi": 0.1, "zeta": 0.1, "gof_p": 0.4}
    return Calibration(threshold=2.0, estimate=1.5, budget=0.01, confidence=0.95, method="order_statistic",
                       reason=reason, n=400, tail=tail, top=np.array([3.0, 2.5]))


def test_stat_dict_keeps_tail_and_appends_to_the_reason():
    from tolstat.calibration.selection import _Plan, _stat_dict

    plan = _Plan(0.01, 0.95, "auto", ["max_abs"], "max_abs", None, ["max_abs"], 0.01, 0.95,
                 ("op", "dtype", "hardware"), "bonferroni", "raise")
    cal = _calibration()
    d = _stat_dict(cal, plan, 3)
    assert d["tail"] == cal.tail and d["top_scores"] == [3.0, 2.5]
    assert d["reason"] == ("order statistic; 3 run(s) had a truncated Pareto front: "
                           "their scores are lower bounds")
    assert _stat_dict(cal, plan, 0)["reason"] == "order statistic"


def test_select_provenance_records_the_budget_split():
    rng = np.random.default_rng(10)
    pairs = [(e.astype(np.float32), e) for e in rng.standard_normal((160, 16))]  # n >= 146 for a = 0.025
    ds = tolstat.from_pairs(pairs, op="add", dtype="float32", options=tolstat.CollectOptions(progress=False))
    t = tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"],
                       options=SelectOptions(budget_split="bonferroni"))
    settings = t.meta["provenance"]["settings"]
    assert settings["budget_split"] == "bonferroni" and t.meta["budget_split"] == "bonferroni"
    assert settings["fp_budget"] == 0.05 and settings["statistic"] == ["max_abs", "bias"]
    ent = t.entry("add", "float32")
    assert [ent.statistics[s].budget for s in ("max_abs", "bias")] == [0.05 / 2, 0.05 / 2]


@pytest.mark.parametrize("kw, err, msg", [
    (dict(method="max"), ValueError,
     r"^SelectOptions\.method must be one of \('auto', 'order_statistic', 'conformal', 'evt'\), got 'max'"),
    (dict(scale={"quantile": 0.9}), TypeError, r"^SelectOptions\.scale must be a ScaleOptions, got dict"),
    (dict(scale=None), TypeError, r"^SelectOptions\.scale must be a ScaleOptions, got NoneType"),
    (dict(tail=tolstat.models.ScaleOptions()), TypeError, r"^SelectOptions\.tail must be a TailOptions, got ScaleOptions"),
    (dict(budget_split="holm"), ValueError, r"^SelectOptions\.budget_split must be 'bonferroni' or 'sidak', got 'holm'"),
    (dict(pooling="yes"), TypeError, r"^SelectOptions\.pooling must be True or False, got 'yes'"),
    (dict(seed=-3), ValueError, r"^SelectOptions\.seed must be an integer >= 0, got -3"),
    (dict(seed=True), ValueError, r"^SelectOptions\.seed must be an integer >= 0, got True"),
])
def test_select_options_validate_their_fields(kw, err, msg):
    with pytest.raises(err, match=msg):
        SelectOptions(**kw)


def test_select_takes_its_settings_only_as_select_options(ds):
    with pytest.raises(TypeError, match=r"^options must be a SelectOptions, got dict"):
        select(ds, form=None, fp_budget=0.01, options={"method": "evt"})
    from tolstat.calibration.engine import CertifyOptions

    with pytest.raises(TypeError, match=r"^options must be a SelectOptions, got CertifyOptions"):
        select(ds, form=None, fp_budget=0.01, options=CertifyOptions())
    with pytest.raises(TypeError, match="unexpected keyword argument 'method'"):
        select(ds, form=None, fp_budget=0.01, method="evt")  # the settings live in SelectOptions
    assert tolstat.SelectOptions is SelectOptions and tolstat.calibration.SelectOptions is SelectOptions
    assert "SelectOptions" in tolstat.__all__


def test_select_provenance_settings_keep_their_keys_and_values():
    ds = _ds(n=300)
    t = tolstat.select(ds, fp_budget=0.05, form=None, by=("op", "dtype"),
                       options=SelectOptions(seed=4, pooling=False, tail=TailOptions(min_tail_runs=60)))
    settings = t.meta["provenance"]["settings"]
    assert settings == {"fp_budget": 0.05, "confidence": 0.95, "method": "auto", "statistic": ["max_abs"],
                        "form": None, "by": ["op", "dtype"], "budget_split": "bonferroni", "seed": 4,
                        "cluster": None, "pooling": False, "tail": TailOptions(min_tail_runs=60).to_dict(),
                        "scale": tolstat.models.ScaleOptions().to_dict()}
    default = tolstat.select(ds, fp_budget=0.05, form=None, by=("op", "dtype"))
    again = tolstat.select(ds, fp_budget=0.05, form=None, by=("op", "dtype"), options=SelectOptions())
    assert default.meta["provenance"]["settings"] == again.meta["provenance"]["settings"]
    np.testing.assert_array_equal(default.data["threshold"].values, again.data["threshold"].values)


def test_rules_and_shift_pass_select_settings_as_select_options():
    from tolstat.assess.rules import _select_kwargs

    opts = tolstat.models.ScaleOptions(quantile=0.9)
    assert _select_kwargs({"form": None, "cluster": "case"}) == {"form": None, "cluster": "case"}
    assert _select_kwargs({"form": "allclose", "method": "evt", "seed": 2, "scale": opts, "tail": None}) == {
        "form": "allclose", "options": SelectOptions(method="evt", seed=2, scale=opts)}
    assert _select_kwargs({"options": SelectOptions(seed=5), "pooling": False}) == {
        "options": SelectOptions(seed=5, pooling=False)}


@pytest.fixture(scope="module")
def one_far_run():
    """300 correct fp16 runs (with magnitudes: the operator statistics) of which run 7 has
    1e4 times the usual error: it sets the threshold of every form at budget 0.01."""
    rng = np.random.default_rng(0)
    pairs = []
    for i in range(300):
        e = rng.standard_normal(32)
        d = rng.standard_normal(32) * 2.0 ** -11 * np.abs(e) * (1e4 if i == 7 else 1.0)
        pairs.append(((e + d).astype(np.float16), e, np.abs(e)))
    return tolstat.from_pairs(pairs, op="mm", dtype="float16", options=tolstat.CollectOptions(progress=False))


@pytest.mark.parametrize("form", ["operator", "allclose", None])
def test_select_options_accept_outliers_holds_for_every_form(one_far_run, form):
    import warnings

    from tolstat.calibration.certificate import OutlierRunWarning

    def flags(table):
        (group,) = table.groups
        return set(table.entry(*group).certificate["flags"])

    with pytest.warns(OutlierRunWarning):
        assert "outlier" in flags(tolstat.select(one_far_run, fp_budget=0.01, form=form))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OutlierRunWarning)
        table = tolstat.select(one_far_run, fp_budget=0.01, form=form, options=SelectOptions(accept_outliers=True))
    assert "outlier_accepted" in flags(table) and "outlier" not in flags(table)
