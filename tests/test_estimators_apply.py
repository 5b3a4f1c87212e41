"""fit(): grouping, outputs, dask path and bad inputs."""

import json
import math

import numpy as np
import pytest

from estimators_helpers import make_errors
from scipy import stats

from tolstat.models.estimators import (
    bootstrap_quantile_bound,
    bootstrap_quantile_distribution,
    bootstrap_return_level_bound,
    fit,
    gev_fit_mle,
    group_values,
    pot_fit,
    quantile,
)


@pytest.fixture(scope="module")
def ds():
    rng = np.random.default_rng(0)
    return make_errors({
        ("matmul", "float16", "cpu"): rng.exponential(1.0, 400),
        ("matmul", "float32", "cpu"): rng.exponential(2.0, 350),
        ("softmax", "float16", "cpu"): rng.exponential(0.5, 300),
    })


def test_group_values_layout(ds):
    da, present = group_values(ds, "max_abs")
    assert da.dims == ("op", "dtype", "hardware", "obs")
    assert present.sel(op="softmax", dtype="float32").item() is False
    v = da.sel(op="matmul", dtype="float32", hardware="cpu").values
    np.testing.assert_array_equal(v[~np.isnan(v)], ds.max_abs.values[400:750])
    rel, _ = group_values(ds, "sample_rel")
    expect = ds.sample_abs / np.maximum(ds.sample_ref, ds.rel_floor)
    got = rel.sel(op="softmax", dtype="float16", hardware="cpu").values
    np.testing.assert_allclose(got[~np.isnan(got)], expect.values[750:][~np.isnan(expect.values[750:])])



def test_group_values_of_no_runs_is_a_named_error(ds):
    with pytest.raises(ValueError, match="error dataset has no runs"):
        group_values(ds.isel(run=slice(0, 0)), "max_abs")


@pytest.mark.parametrize("method,opts", [
    ("empirical", {"p": [0.5, 0.99]}),
    ("order_statistic", {"p": 0.99, "confidence": 0.9}),
    ("conformal", {"alpha": 0.01}),
    ("gpd", {"q": 1e-4}),
    ("gev", {"q": 0.01}),
    ("bootstrap", {"p": 0.99, "n_resamples": 200}),
])
def test_fit_methods(ds, method, opts):
    out = fit(ds, method=method, **opts)
    assert set(out.threshold.dims) >= {"op", "dtype", "hardware"}
    assert out.attrs["method"] == method and "tolstat_version" in out.attrs
    absent = out.sel(op="softmax", dtype="float32", hardware="cpu")
    assert absent.n.item() == 0 and np.all(np.isnan(absent.threshold.values))
    th = out.threshold.sel(op="matmul", dtype="float16", hardware="cpu")
    assert np.all(np.isfinite(th.values))
    x = ds.max_abs.values[:400]
    xs = np.sort(x)
    if method == "empirical":
        np.testing.assert_array_equal(th.values, np.quantile(x, [0.5, 0.99]))
    elif method == "order_statistic":  # smallest r with binom.cdf(r - 1, n, p) >= confidence
        r = np.arange(1, 401)
        r0 = int(r[stats.binom.cdf(r - 1, 400, 0.99) >= 0.9][0])
        assert th.item() == xs[r0 - 1] and r0 < 400
    elif method == "conformal":  # ceil((n + 1)(1 - alpha))-th smallest
        assert th.item() == xs[int(np.ceil(401 * 0.99)) - 1]
    elif method == "gpd":  # the POT fit of this group alone
        assert th.item() == pytest.approx(pot_fit(x, 1e-4)["return_level"], rel=1e-12)
    elif method == "bootstrap":
        assert th.item() >= np.quantile(x, 0.99)  # an upper bound of the estimate


def test_fit_dask_equals_eager(ds):
    a = fit(ds, method="empirical", statistic="sample_abs", p=[0.9, 0.999])
    b = fit(ds, method="empirical", statistic="sample_abs", p=[0.9, 0.999], chunks={"op": 1})
    assert b.threshold.chunks is not None
    np.testing.assert_array_equal(a.threshold.values, b.threshold.compute().values)
    c = fit(ds, method="gpd", statistic="sample_abs", chunks={"dtype": 1})
    np.testing.assert_array_equal(fit(ds, method="gpd", statistic="sample_abs").threshold.values,
                                  c.threshold.values)


def test_fit_bad_inputs():
    rng = np.random.default_rng(1)
    # a group that exists but is all NaN
    bad = make_errors({("a", "float16", "cpu"): rng.random(100), ("b", "float16", "cpu"): np.full(5, np.nan)})
    with pytest.raises(ValueError, match="op='b'.*no valid"):
        fit(bad, method="empirical")
    neg = make_errors({("a", "float16", "cpu"): rng.random(100) - 0.5})
    with pytest.raises(ValueError, match="negative"):
        fit(neg, method="empirical")
    small = make_errors({("a", "float16", "cpu"): rng.random(100)})
    with pytest.raises(ValueError, match="need n >= 299"):
        fit(small, method="order_statistic", p=0.99, confidence=0.95)
    with pytest.raises(ValueError, match="need n >= 99"):
        fit(make_errors({("a", "float16", "cpu"): rng.random(50)}), method="conformal", alpha=0.01)
    with pytest.raises(ValueError, match="unknown option"):
        fit(small, method="empirical", confidence=0.9)
    with pytest.raises(ValueError, match="method"):
        fit(small, method="magic")
    with pytest.raises(ValueError, match="statistic"):
        fit(small, method="empirical", statistic="max_foo")
    inf = make_errors({("a", "float16", "cpu"): np.r_[rng.random(99), np.inf]})
    with pytest.raises(ValueError, match="infinite"):
        fit(inf, method="gpd")
    # the empirical quantile does not refuse infinite data: it equals numpy's, inf and the
    # NaN of 'linear' interpolation next to inf included
    xi = inf.max_abs.values
    with np.errstate(invalid="ignore"):
        want = np.quantile(xi, [0.5, 0.99, 1.0])
    got = fit(inf, method="empirical", p=[0.5, 0.99, 1.0]).threshold.values.ravel()
    assert np.isinf(want[1]) and np.isnan(want[2])  # the cases are what they claim to be
    np.testing.assert_array_equal(got, want)


def test_all_zero_errors_give_zero_threshold():
    z = make_errors({("a", "float16", "cpu"): np.zeros(400)})
    for method, opts in [("empirical", {"p": 0.999}), ("order_statistic", {}), ("conformal", {}),
                         ("gpd", {}), ("gev", {}), ("bootstrap", {"n_resamples": 50}),
                         ("bootstrap", {"n_resamples": 50, "target": "return_level"})]:
        out = fit(z, method=method, **opts)
        assert np.all(out.threshold.values == 0.0), method


def test_fit_matches_kernel_on_samples(ds):
    out = fit(ds, method="empirical", statistic="sample_ulp", p=0.99)
    x = ds.sample_ulp.values[400:750].ravel()
    assert out.threshold.sel(op="matmul", dtype="float32", hardware="cpu").item() == quantile(
        x[~np.isnan(x)], 0.99)


# --------------------------------------------------------------------------- fit and group_values
# Definitions, settings passed through, absent groups, dask.
# References: the documented definitions and direct calls of the estimator each method wraps.


def test_sample_rel_divides_by_the_larger_of_reference_and_rel_floor():
    ds = make_errors({("a", "float32", "cpu"): np.linspace(1.0, 2.0, 5)}, sample_size=4)
    ref = ds["sample_ref"].values.copy()
    ref[0, 1] = 0.0  # a zero reference: the run's rel_floor is the denominator
    floor = np.full(ds.sizes["run"], 1e-3)
    ds = ds.assign(sample_ref=(("run", "sample"), ref), rel_floor=("run", floor))
    da, present = group_values(ds, "sample_rel")
    expect = ds["sample_abs"].values / np.maximum(ref, floor[:, None])  # documented definition
    got = da.values.reshape(-1, da.sizes["obs"])[0]
    np.testing.assert_array_equal(got[~np.isnan(got)], expect.ravel()[~np.isnan(expect.ravel())])
    assert got[1] == ds["sample_abs"].values[0, 1] / 1e-3


def test_a_group_with_one_run_is_present_and_an_absent_group_is_not():
    ds = make_errors({("a", "float32", "cpu"): [0.5], ("b", "float16", "gpu"): [0.1, 0.2]})
    da, present = group_values(ds, "max_abs")
    assert bool(present.sel(op="a", dtype="float32", hardware="cpu"))
    assert bool(present.sel(op="b", dtype="float16", hardware="gpu"))
    assert not bool(present.sel(op="a", dtype="float16", hardware="cpu"))
    assert int(present.sum()) == 2


def test_order_statistic_too_few_runs_names_the_options_and_ranks_are_integers():
    rng = np.random.default_rng(0)
    small = make_errors({("a", "float16", "cpu"): rng.random(100)})
    with pytest.raises(ValueError, match=r'n = 100 values, too few for method .order_statistic. with '
                                         r'\{"p": 0.99, "confidence": 0.95\}: need n >= 299'):
        fit(small, method="order_statistic", p=0.99, confidence=0.95)
    ok = make_errors({("a", "float16", "cpu"): rng.random(300)})
    out = fit(ok, method="order_statistic", p=0.99, confidence=0.95)
    assert out["rank"].dtype == np.int64 and int(out["rank"].item()) == 300  # binom: rank n at n = 299..300


def test_gev_block_size_takes_maxima_of_whole_blocks_and_drops_the_rest():
    rng = np.random.default_rng(3)
    x = rng.gumbel(size=100) + 5.0  # errors are nonnegative
    y = rng.gumbel(size=61) + 5.0  # a smaller group: NaN-padded to 100 in the grid
    ds = make_errors({("a", "float32", "cpu"): x, ("b", "float32", "cpu"): y})
    out = fit(ds, method="gev", block_size=3, q=0.05)
    for op, v in (("a", x), ("b", y)):
        m = v.size // 3
        ref = gev_fit_mle(v[: 3 * m].reshape(m, 3).max(axis=1), q=0.05)  # whole blocks; the rest dropped
        got = out.sel(op=op, dtype="float32", hardware="cpu")
        assert float(got["threshold"]) == pytest.approx(ref["return_level"], rel=1e-9)
        assert float(got["mu"]) == pytest.approx(ref["mu"], rel=1e-9)


def test_bootstrap_fit_passes_its_confidence():
    x = np.random.default_rng(4).exponential(size=200)
    ds = make_errors({("a", "float32", "cpu"): x})
    out = fit(ds, method="bootstrap", p=0.9, confidence=0.8, interval="percentile", n_resamples=300, seed=7)
    tb = bootstrap_quantile_distribution(x, 0.9, n_resamples=300, seed=7)
    assert float(out["threshold"].item()) == np.quantile(tb, 0.8)
    assert float(out["level"].item()) == 0.8


def test_gev_block_maxima_same_through_dask():
    rng = np.random.default_rng(5)
    ds = make_errors({("a", "float32", "cpu"): rng.gumbel(size=40) + 5.0,
                      ("b", "float32", "cpu"): rng.gumbel(size=29) + 5.0})
    eager = fit(ds, method="gev", block_size=2, q=0.05)
    lazy = fit(ds, method="gev", block_size=2, q=0.05, chunks={"op": 1}).compute()
    np.testing.assert_array_equal(lazy["threshold"].values, eager["threshold"].values)


def test_gpd_fit_of_an_absent_group_has_zero_exceedances():
    rng = np.random.default_rng(6)
    ds = make_errors({("a", "float32", "cpu"): rng.exponential(size=80),
                      ("b", "float16", "cpu"): rng.exponential(size=80)})
    out = fit(ds, method="gpd", q=1e-3)
    absent = out.sel(op="a", dtype="float16", hardware="cpu")
    assert not bool(absent["present"]) and int(absent["n_exceed"]) == 0 and np.isnan(float(absent["threshold"]))
    present = out.sel(op="a", dtype="float32", hardware="cpu")
    assert int(present["n_exceed"]) == 30  # max(30, ceil(0.1 * 80)) largest values exceed u
    assert out["n_exceed"].dtype == np.int64


def test_group_values_present_is_named():
    ds = make_errors({("a", "float32", "cpu"): [0.5, 0.25]})
    da, present = group_values(ds, "max_abs")
    assert da.name == "max_abs" and present.name == "present" and present.dims == ("op", "dtype", "hardware")


def test_gpd_and_rank_fits_same_through_dask():
    pytest.importorskip("dask")
    rng = np.random.default_rng(11)
    ds = make_errors({("a", "float32", "cpu"): rng.exponential(size=320),
                      ("b", "float32", "cpu"): rng.exponential(size=300)})
    for method, kw in (("gpd", {"q": 1e-4}), ("order_statistic", {"p": 0.99})):
        eager = fit(ds, method=method, **kw)
        lazy = fit(ds, method=method, chunks={"op": 1}, **kw).compute()
        for v in eager.data_vars:
            np.testing.assert_array_equal(lazy[v].values, eager[v].values)
    lazy = fit(ds, method="order_statistic", p=0.99, chunks={"op": 1})
    assert lazy["rank"].chunks is not None  # the rank stays lazy like the thresholds
    assert lazy["rank"].compute().values.tolist() == fit(ds, method="order_statistic", p=0.99)["rank"].values.tolist()


def test_fit_attributes_record_method_and_sorted_settings():
    ds = make_errors({("a", "float32", "cpu"): np.random.default_rng(12).exponential(size=300)})
    out = fit(ds, method="order_statistic", p=0.99, confidence=0.9)
    assert out.attrs["method"] == "order_statistic"
    assert out.attrs["settings"] == json.dumps({"confidence": 0.9, "p": 0.99})  # keys sorted


def test_bootstrap_fit_of_the_return_level_passes_its_seed():
    x = np.random.default_rng(13).exponential(size=400)
    ds = make_errors({("a", "float32", "cpu"): x})
    out = fit(ds, method="bootstrap", target="return_level", q=1e-4, n_resamples=200, seed=11,
              interval="percentile")
    ref = bootstrap_return_level_bound(x, 1e-4, n_resamples=200, seed=11, method="percentile")
    assert float(out["threshold"].item()) == ref.bound
    assert ref.bound != bootstrap_return_level_bound(x, 1e-4, n_resamples=200, seed=0, method="percentile").bound


def test_group_values_of_float32_samples_are_float64():
    ds = make_errors({("a", "float32", "cpu"): [0.5, 0.25, 0.125]}, sample_size=2)  # no NaN padding
    ds["sample_abs"] = ds["sample_abs"].astype(np.float32)
    da, present = group_values(ds, "sample_abs")
    assert da.dtype == np.float64 and bool(present.all())
    np.testing.assert_array_equal(da.values.ravel(), ds["sample_abs"].values.astype(np.float64).ravel())


def test_fit_output_marks_present_groups():
    rng = np.random.default_rng(14)
    ds = make_errors({("a", "float32", "cpu"): rng.exponential(size=300), ("b", "float16", "cpu"): rng.exponential(size=300)})
    out = fit(ds, method="order_statistic", p=0.99)
    assert out["present"].dtype == bool and out["present"].dims == ("op", "dtype", "hardware")
    assert out["present"].sel(hardware="cpu").values.tolist() == [[False, True], [True, False]]  # dtype: float16, float32


def test_conformal_fit_of_a_group_with_a_single_run():
    # conformal rank ceil((n + 1)(1 - alpha)): alpha = 0.5 allows n = 1 (rank 1: the value itself)
    ds = make_errors({("a", "float32", "cpu"): [0.25], ("b", "float32", "cpu"): [0.5, 0.1, 0.3]})
    out = fit(ds, method="conformal", alpha=0.5)
    a = out.sel(op="a", dtype="float32", hardware="cpu")
    b = out.sel(op="b", dtype="float32", hardware="cpu")
    assert int(a["rank"]) == math.ceil(2 * 0.5) == 1 and float(a["threshold"]) == 0.25
    assert int(b["rank"]) == math.ceil(4 * 0.5) == 2 and float(b["threshold"]) == np.sort([0.5, 0.1, 0.3])[1]


def test_gev_block_maxima_with_an_absent_group():
    # op a is calibrated in float32 only and op b in float16 only: (a, float16) and
    # (b, float32) are absent groups (all NaN) of the fitted grid
    rng = np.random.default_rng(7)
    x = rng.gumbel(size=40) + 5.0
    y = rng.gumbel(size=31) + 5.0
    ds = make_errors({("a", "float32", "cpu"): x, ("b", "float16", "cpu"): y})
    out = fit(ds, method="gev", block_size=2, q=0.05)
    for op, dt, v in (("a", "float32", x), ("b", "float16", y)):
        m = v.size // 2
        ref = gev_fit_mle(v[: 2 * m].reshape(m, 2).max(axis=1), q=0.05)
        assert float(out.sel(op=op, dtype=dt, hardware="cpu")["threshold"]) == pytest.approx(
            ref["return_level"], rel=1e-9)
    for op, dt in (("a", "float16"), ("b", "float32")):
        assert np.isnan(float(out.sel(op=op, dtype=dt, hardware="cpu")["threshold"]))


@pytest.mark.parametrize("qm", ["lower", "higher", "nearest"])
def test_bootstrap_fit_passes_its_quantile_method(qm):
    x = np.random.default_rng(8).exponential(size=100)  # (n - 1) p = 89.1: the methods differ
    ds = make_errors({("a", "float32", "cpu"): x})
    assert len({float(np.quantile(x, 0.9, method=m)) for m in ("linear", "lower", "higher")}) == 3
    out = fit(ds, method="bootstrap", p=0.9, quantile_method=qm, n_resamples=200, seed=3)
    assert float(out["estimate"].item()) == np.quantile(x, 0.9, method=qm)
    ref = bootstrap_quantile_bound(x, 0.9, n_resamples=200, seed=3, quantile_method=qm)
    assert float(out["threshold"].item()) == ref.bound
