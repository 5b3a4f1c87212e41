"""Mutants of ``tolstat.models.estimators._apply`` (``fit``, ``group_values``) the other tests do not kill."""

from __future__ import annotations

import numpy as np
import pytest

from estimators_helpers import make_errors
from tolstat.models.estimators import fit, group_values
from tolstat.models.estimators.bootstrap import bootstrap_quantile_distribution
from tolstat.models.estimators.evt import gev_fit_mle


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
