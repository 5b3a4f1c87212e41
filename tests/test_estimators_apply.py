"""fit(): grouping, outputs, dask path and bad inputs."""

import numpy as np
import pytest

from estimators_helpers import make_errors
from scipy import stats

from tolstat.models.estimators import fit, group_values, pot_fit, quantile


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
