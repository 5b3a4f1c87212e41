"""tolstat.compare on synthetic error tables where the truth is known."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import tolstat
from kernel_helpers import fp16_block_matmul
from tolstat.assess.comparison import CompareResult, compare
from tolstat.assess.folds import assign_folds
from tolstat.assess.rules import StudyRule, calibrate_and_score, make_rule

N_CASES = 1000
VARIANTS = 3  # runs per case: e.g. three kernel variants on the same inputs
P95 = {"name": "p95", "rule": "study", "factor": 1.0, "percentile": 95}


def _pairs(rng, n_cases, *, offset=0.0, scale=1e-3, case0=0, kind="correct"):
    """Runs of 4 elements with |d| ~ Exponential(scale) (float64: no rounding); +offset = a planted bug."""
    out = []
    for c in range(n_cases):
        for v in range(VARIANTS):
            # distinct references: runs with one reference would be one unit (the same inputs)
            e = 1.0 + rng.random(4)
            a = e + rng.exponential(scale, 4) + offset
            out.append((a, e, {"case": f"c{case0 + c}", "variant": f"v{v}", "kind": kind}))
    return out


def _ds(pairs, op="x"):
    return tolstat.from_pairs(pairs, op=op, dtype="float64", hardware="cpu", options=tolstat.CollectOptions(sample_size=8, progress=False))


@pytest.fixture(scope="module")
def correct():
    return _ds(_pairs(np.random.default_rng(1), N_CASES))


@pytest.fixture(scope="module")
def result(correct):
    bugs = _ds(_pairs(np.random.default_rng(2), 200, offset=0.1, kind="buggy"))
    return compare(correct, buggy=bugs, methods=["tolstat", "tolstat-max_abs", "tolstat-allclose", "study", P95,
                                                  {"name": "loose", "atol": 1.0, "rtol": 0.0}],
                   budgets=(0.01,), folds=5, cluster="case", progress=False)


def _row(res: CompareResult, method: str, budget: float) -> dict:
    (r,) = [r for r in res.rows if r["method"] == method and r["budget"] == budget]
    return r


def test_calibrated_method_is_not_reported_broken(result):
    # order-statistic thresholds: true held-out rate <= 1% (with 95% confidence per fold)
    for m in ("tolstat", "tolstat-allclose"):
        r = _row(result, m, 0.01)
        assert r["verdict"] in ("held", "consistent"), r
        assert r["fp_lo"] <= 0.01
        assert r["n_test"] == N_CASES * VARIANTS


def test_conservative_method_is_shown_to_hold(result):
    # atol = 1 is 100x beyond any correct error here: no false positive at all
    r = _row(result, "loose", 0.01)
    assert r["fp"] == 0 and r["verdict"] == "held" and r["fp_hi"] < 0.01


def test_sample_p95_is_reported_broken_at_1_percent(result):
    # the bare sample 95th percentile fails ~5% of correct runs: far above a 1% budget
    r = _row(result, "p95", 0.01)
    assert r["verdict"] == "broken", r
    assert 0.03 < r["fp_rate"] < 0.07
    assert r["fp_lo"] > 0.01
    assert bool(result.data["broken"].sel({"method": "p95"}).any())


def test_interval_is_scipy_clopper_pearson(result):
    from scipy.stats import binomtest

    d = result.data.sel({"method": "p95"}).sel(budget=0.01).isel(group=0)
    for f in range(5):
        ci = binomtest(int(d.fp[f]), int(d.n_test[f])).proportion_ci(0.95, method="exact")
        assert float(d.fp_lo[f]) == pytest.approx(ci.low, rel=1e-9, abs=1e-15)
        assert float(d.fp_hi[f]) == pytest.approx(ci.high, rel=1e-9)


@pytest.mark.parametrize("k, n", [(0, 10), (10, 10), (3, 1000), (152, 3000), (1, 2)])
def test_cp_matches_binomtest(k, n):
    from scipy.stats import binomtest

    from tolstat._base.inference import clopper_pearson as _cp

    ci = binomtest(k, n).proportion_ci(0.9, method="exact")
    lo, hi = _cp(k, n, 0.9)
    assert lo == pytest.approx(ci.low, rel=1e-9, abs=1e-15) and hi == pytest.approx(ci.high, rel=1e-9)


def test_recall_exact_on_planted_bugs(result):
    # an offset of 0.1 is ~15x above the 1%-quantile of correct errors: every bug is caught
    for m in ("tolstat", "tolstat-allclose", "study", "p95"):
        r = _row(result, m, 0.01)
        assert r["n_buggy"] == 600 and r["caught"] == 600 and r["recall"] == 1.0
    assert _row(result, "loose", 0.01)["caught"] == 0  # atol 1 lets the 0.1 offset through


def test_buggy_runs_identical_to_correct_have_recall_equal_to_fp(correct):
    # "buggy" copies of the correct runs, same cases: each lands in its twin's fold, so
    # it is flagged exactly when its twin is
    twin = correct.assign_coords(kind=("run", np.full(correct.sizes["run"], "buggy")))
    both = tolstat.concat([correct, twin])
    res = compare(both, methods=["tolstat", P95], budgets=(0.02,), folds=4, cluster="case", progress=False)
    for m in ("tolstat", "p95"):
        r = _row(res, m, 0.02)
        assert r["n_buggy"] == r["n_test"] == correct.sizes["run"]
        assert r["caught"] == r["fp"] > 0
    np.testing.assert_array_equal(res.data.caught.values, res.data.fp.values)


def test_clusters_never_straddle_folds(correct, result):
    case = correct["case"].values.astype(str)
    fold = result.run_fold
    for c in np.unique(case):
        assert np.unique(fold[case == c]).size == 1
    # each fold holds 1000/5 cases, i.e. 600 runs
    np.testing.assert_array_equal(np.bincount(fold), [N_CASES // 5 * VARIANTS] * 5)
    d = result.data.sel({"method": "tolstat"}).sel(budget=0.01).isel(group=0)
    np.testing.assert_array_equal(d.n_test.values, np.bincount(fold))
    np.testing.assert_array_equal(d.n_train.values, correct.sizes["run"] - np.bincount(fold))


def test_folds_deterministic_in_seed():
    u = np.repeat(np.arange(50).astype(str), 3)
    a, b, c = assign_folds(u, 5, 0), assign_folds(u, 5, 0), assign_folds(u, 5, 1)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    assert sorted(np.bincount(a).tolist()) == [30] * 5


def test_tightness_and_stability(result):
    d = result.data
    # loose rule: median of max|d| / 1 over held-out runs
    r = _row(result, "loose", 0.01)
    assert 0 < r["tightness"] < 0.01
    s = d.stability.sel({"method": "tolstat"}).sel(budget=0.01).values
    thr = d.threshold.sel({"method": "tolstat"}).sel(budget=0.01).values
    np.testing.assert_allclose(s, thr.max(-1) / thr.min(-1))
    assert np.all(s >= 1.0)
    # static rules: one threshold for every fold
    assert float(d.stability.sel({"method": "loose"}).max()) == 1.0


def test_study_threshold_is_1_5_p95_of_training_runs(correct, result):
    fold = result.run_fold
    train = correct.isel(run=np.flatnonzero(fold != 2))
    want = 1.5 * np.percentile(train.max_abs.values, 95)
    got = float(result.data.threshold.sel({"method": "study"}).sel(budget=0.01, fold=2).isel(group=0))
    assert got == pytest.approx(want, rel=1e-15)


def test_refused_group_is_recorded_not_raised(correct):
    small = _ds(_pairs(np.random.default_rng(3), 20), op="tiny")  # 60 runs: too few for 1e-3
    res = compare(tolstat.concat([correct, small]), methods=["tolstat", "study"], budgets=(1e-3,),
                  folds=3, progress=False)
    d = res.data.sel({"method": "tolstat"}).sel(group="tiny/float64/cpu", budget=1e-3)
    assert set(d.status.values.tolist()) == {"refused"}
    assert all("units" in str(r) for r in d.reason.values)
    assert int(d.n_test.sum()) == 0
    row = next(r for r in res.group_rows if r["method"] == "tolstat" and r["group"] == "tiny/float64/cpu")
    assert row["refused_folds"] == 3 and row["verdict"] == "no data"
    assert "not calibrated" in res.summary()
    # the study rule needs no minimum
    assert set(res.data.status.sel({"method": "study"}).values.ravel().tolist()) == {"ok"}


def test_summary_of_a_dataset_too_small_says_what_it_needs():
    small = _ds(_pairs(np.random.default_rng(4), 40), op="tiny")
    res = compare(small, methods=["tolstat", "study"], budgets=(1e-2, 1e-3), folds=3, progress=False)
    lines = res.summary().splitlines()
    rows = [ln for ln in lines if ln.startswith("tolstat ")]
    assert len(rows) == 2 and all("too few runs" in ln for ln in rows)
    assert not any("no data" in ln for ln in lines)
    note = next(ln for ln in lines if ln.startswith("too few runs:"))
    assert "(299 at 0.01, 2995 at 0.001)" in note and "--folds 10" in note
    # a static rule is scored on every run: its verdict is not "too few runs"
    assert "too few runs" not in next(ln for ln in lines if ln.startswith("study "))
    # the JSON keeps the neutral verdict of an empty interval
    assert {r["verdict"] for r in res.rows if r["method"] == "tolstat"} == {"no data"}


def test_calibrate_and_score_records_errors():
    class Boom(StudyRule):
        def fit(self, train, **kw):
            raise ValueError("not enough data: need 459 runs")

    ds = _ds(_pairs(np.random.default_rng(4), 10))
    out = calibrate_and_score(Boom(), ds, ds, budget=0.01)
    assert out.error == "not enough data: need 459 runs" and np.isnan(out.ratios).all()


def test_in_memory_and_dask_backed_agree(tmp_path, correct):
    p = tolstat.save(correct, tmp_path / "e.zarr")
    lazy = tolstat.open_errors(p, chunks={"run": 1000})
    assert lazy["sample_abs"].chunks is not None
    kw = dict(methods=["tolstat-allclose", "torch-defaults", "study"], budgets=(0.01,), folds=3,
              cluster="case", progress=False)
    a, b = compare(correct, **kw), compare(lazy, **kw)
    for v in ("threshold", "fp", "n_test", "tightness"):
        np.testing.assert_array_equal(a.data[v].values, b.data[v].values)


def test_results_round_trip(tmp_path, result):
    paths = result.write(tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["compare.json", "compare.nc", "summary.txt"]
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["summary"][0]["method"] == "tolstat"
    back = xr.open_dataset(tmp_path / "compare.nc", engine="h5netcdf").load()
    np.testing.assert_array_equal(back.fp.values, result.data.fp.values)
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.slow
def test_plots_written(tmp_path, result):
    pytest.importorskip("matplotlib")
    from tolstat.cli.plots import plot_compare

    paths = plot_compare(result, tmp_path)
    assert {"calibration.png", "recall_fp.png", "thresholds.png"} <= {p.name for p in paths}


@pytest.mark.parametrize("kw, match", [
    ({"budgets": (0.0,)}, r"budget must be a probability in \[1e-09, 0.5\]"),
    ({"budgets": (0.01, 0.01)}, "budgets must be distinct"),
    ({"folds": 1}, "folds must be an integer >= 2"),
    ({"confidence": 1.5}, "confidence must lie strictly"),
    ({"by": ("op",)}, "by must contain 'op' and 'dtype'"),
    ({"cluster": "nope"}, "cluster='nope' is not a label"),
    ({"methods": ["magic"]}, "unknown method 'magic'"),
    ({"methods": ["study", "study"]}, "distinct names"),
    ({"methods": [{"fp_budget": 0.1}]}, "set by compare itself"),
    ({"folds": 4000}, "folds=4000 but the correct runs have only"),
])
def test_bad_arguments(correct, kw, match):
    with pytest.raises(ValueError, match=match):
        compare(correct, progress=False, **kw)


def test_make_rule_forms():
    assert make_rule("tolstat-size_aware").options == {"form": "size_aware"}
    r = make_rule({"atol": 1e-2, "rtol": 1e-2})
    assert r.name == "atol=0.01,rtol=0.01" and r.tolerances["bfloat16"] == (1e-2, 1e-2)
    with pytest.raises(ValueError, match="unexpected keys"):
        make_rule({"atol": 1.0, "form": "allclose"})
    with pytest.raises(TypeError, match="a method must be a name"):
        make_rule(3)


def test_cli_compare(tmp_path, correct, capsys):
    from tolstat.cli.main import main

    p = tolstat.save(correct, tmp_path / "e.nc")
    out = tmp_path / "out"
    rc = main(["compare", str(p), "--budgets", "0.01,0.05", "--folds", "3", "--methods", "tolstat,study",
               "--cluster", "case", "-o", str(out), "--no-plots", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "tolstat" in text and "verdict" in text
    doc = json.loads((out / "compare.json").read_text())
    assert doc["settings"]["budgets"] == [0.01, 0.05] and doc["settings"]["folds"] == 3
    assert (out / "compare.nc").exists()


@pytest.mark.parametrize("args, match", [
    (["--budgets", "0.01,abc"], "--budgets"),
    (["--budgets", "2"], "budget must be a probability in"),
    (["--folds", "1"], "folds must be an integer"),
    (["--methods", "magic"], "unknown method"),
])
def test_cli_bad_arguments(tmp_path, correct, capsys, args, match):
    from tolstat.cli.main import main

    p = tolstat.save(correct.isel(run=slice(0, 60)), tmp_path / "e.nc")
    rc = main(["compare", str(p), "--no-progress", "--no-plots", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and match in err


@pytest.mark.parametrize("options", [{}, {"form": "allclose"}, {"form": "size_aware"},
                                     {"form": None, "statistic": ("max_abs", "bias")}])
def test_dataset_scores_equal_check_on_raw_outputs(options):
    """Scoring held-out runs from the dataset gives tolstat.check's ratio on the raw output."""
    from tolstat.assess.rules import SelectRule

    rng = np.random.default_rng(7)

    def pairs(n):
        out = []
        for _ in range(n):
            k = int(rng.choice([16, 64, 256]))
            x = rng.standard_normal((8, k)) * float(rng.choice([1.0, 10.0]))
            w = rng.standard_normal((k, 8))
            e = x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64)
            a = fp16_block_matmul(x, w)  # the same rounding on every machine
            out.append((a, e, {}, {"K": k}))
        return out

    def ds(p):
        return tolstat.from_pairs(p, op="mm", dtype="float16", hardware="cpu", options=tolstat.CollectOptions(progress=False))

    cal, test_pairs = pairs(400), pairs(40)
    fitted = SelectRule("t", **options).fit(ds(cal), budget=0.05, confidence=0.9, by=("op", "dtype", "hardware"))
    got = fitted.score(ds(test_pairs))
    want = [max(tolstat.check(a, e, op="mm", dtype="float16", table=fitted.table, hardware="cpu",
                              covariates=c).ratios.values()) for a, e, _, c in test_pairs]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # correctly rounded outputs have decision value 0 (tolstat.calibration.decision); the others do not
    assert np.isfinite(got).all() and (np.asarray(want) > 0).any()


def test_fold_thresholds_from_mergeable_per_fold_topk(correct, result):
    """One pass of per-fold top-k gives every fold's training order-statistic bound by merging.

    The order-statistic thresholds compare reports equal the bound computed from the top-k
    of the other folds, merged (tolstat.models.estimators.tail: group_topk + topk_order_statistic_bound).
    """
    from tolstat.models.estimators.tail import group_topk, topk_order_statistic_bound

    fold = result.run_fold
    ds = correct.assign_coords(fold=("run", fold.astype(str)))
    k = 200
    per_fold = group_topk(ds, "max_abs", k, by=("op", "dtype", "hardware", "fold"))
    for f in range(5):
        others = [str(o) for o in range(5) if o != f]
        parts = per_fold.sel(fold=others)
        merged = -np.sort(-parts.values.reshape(-1, parts.sizes["fold"] * k), axis=-1)[:, :k]
        n = int(parts.n.sum())
        bound = topk_order_statistic_bound(merged, n, p=0.99, confidence=0.95)
        got = float(result.data.threshold.sel({"method": "tolstat-max_abs"}).sel(budget=0.01, fold=f).isel(group=0))
        assert got == float(bound[0])


@pytest.mark.parametrize("op", ["nn/scale3", "a/b/c"])
def test_op_names_with_a_slash_are_compared_like_any_other(op):
    rng = np.random.default_rng(4)
    # 150 cases, two folds: 75 units calibrate each fold, enough at a 5% budget (59)
    res = compare(_ds(_pairs(rng, 150), op=op), buggy=_ds(_pairs(rng, 20, offset=0.1, kind="buggy"), op=op),
                  methods=["tolstat-allclose", "study"], budgets=(0.05,), folds=2, cluster="case", progress=False)
    for m in ("tolstat-allclose", "study"):
        r = _row(res, m, 0.05)
        assert r["n_test"] == 450 and r["recall"] > 0.9, r

