"""Tests written for the survivors of the documented seed-17 sample re-run on the current
source (``benchmarks/results/mutation.md``): option checks, defaults, scalar return types,
integer inputs and the ULP distance of every format against an independent count."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from scipy import stats

from tolstat.calibration.bounds import TailOptions
from tolstat.models.estimators import evt, quantile_groups
from tolstat.measure.metrics import ulp_distance


def test_tail_options_extrapolation_bound_is_one():
    assert TailOptions(max_extrapolation=1.5).max_extrapolation == 1.5
    assert TailOptions(max_extrapolation=1.0).max_extrapolation == 1.0
    with pytest.raises(ValueError, match=r"^TailOptions\.max_extrapolation must be >= 1, got 0\.99$"):
        TailOptions(max_extrapolation=0.99)


def test_tail_options_tail_fraction_error_names_the_field():
    with pytest.raises(ValueError, match=r"^TailOptions\.tail_fraction must lie strictly between 0 and 1, got 1\.5$"):
        TailOptions(tail_fraction=1.5)


def test_gev_fit_groups_default_level_is_one_in_a_hundred():
    x = stats.genextreme.rvs(-0.1, loc=3.0, scale=0.5, size=(2, 200), random_state=4)
    params, n = evt.gev_fit_groups(x)
    f = {k: j for j, k in enumerate(evt.GEV_FIELDS)}
    assert list(n) == [200, 200]
    for row in params:
        # scipy's shape c is -xi; the return level of exceedance probability 0.01
        rl = stats.genextreme.isf(0.01, -row[f["xi"]], loc=row[f["mu"]], scale=row[f["sigma"]])
        assert row[f["return_level"]] == pytest.approx(rl, rel=1e-9)


def test_gpd_return_level_of_scalars_is_a_float():
    r = evt.gpd_return_level(1.0, 0.5, 0.2, 0.1, 0.001)
    assert isinstance(r, float)
    assert r == pytest.approx(stats.genpareto.isf(0.001 / 0.1, 0.2, loc=1.0, scale=0.5), rel=1e-12)
    v = evt.gpd_return_level([1.0, 2.0], 0.5, 0.2, 0.1, 0.001)
    assert isinstance(v, np.ndarray) and v.shape == (2,)


def test_fits_and_quantiles_of_integer_samples_equal_the_float_ones():
    xi = np.random.default_rng(5).integers(1, 1000, size=(2, 300))
    xf = xi.astype(np.float64)
    np.testing.assert_array_equal(evt.pot_fit_groups(xi, 0.001)[0], evt.pot_fit_groups(xf, 0.001)[0])
    assert evt.gev_fit_mle(xi[0]) == evt.gev_fit_mle(xf[0])
    np.testing.assert_array_equal(quantile_groups(xi, [0.5, 0.99])[0],
                                  np.quantile(xf, [0.5, 0.99], axis=1).T)
    # float32 samples are fitted in float64 (the kernels' arithmetic), like their float64 values
    x32 = (np.random.default_rng(8).pareto(3.0, size=(2, 300)) + 1.0).astype(np.float32)
    np.testing.assert_array_equal(evt.pot_fit_groups(x32, 0.001)[0],
                                  evt.pot_fit_groups(x32.astype(np.float64), 0.001)[0])
    assert evt.gev_fit_mle(x32[0]) == evt.gev_fit_mle(x32[0].astype(np.float64))
    wide = np.random.default_rng(7).integers(0, 10**6, size=(2, 3000))  # the radix path (>= 1024 values)
    np.testing.assert_array_equal(quantile_groups(wide, [0.1, 0.999])[0],
                                  np.quantile(wide.astype(np.float64), [0.1, 0.999], axis=1).T)


def _ordered(v: np.ndarray, bits: int) -> np.ndarray:
    """Sign-magnitude bit patterns mapped to integers in value order (independent of tolstat)."""
    u = v.astype(np.int64)
    sign = 1 << (bits - 1)
    return np.where(u & sign, -(u & (sign - 1)), u)


@pytest.mark.parametrize("name, np_dt, uint, bits", [
    ("float16", np.float16, np.uint16, 16),
    ("bfloat16", ml_dtypes.bfloat16, np.uint16, 16),
    ("float32", np.float32, np.uint32, 32),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, np.uint8, 8),
])
def test_ulp_distance_counts_representable_values(name, np_dt, uint, bits):
    rng = np.random.default_rng(6)
    e64 = rng.standard_normal(400) * 4.0
    exp_rn = e64.astype(np_dt)
    steps = rng.integers(-3, 4, size=e64.size)
    a_bits = (_ordered(exp_rn.view(uint), bits) + steps)
    a_bits = np.where(a_bits < 0, (-a_bits) | (1 << (bits - 1)), a_bits).astype(uint)
    actual = a_bits.view(np_dt)
    finite = np.isfinite(actual.astype(np.float64))
    want = np.abs(_ordered(actual.view(uint), bits) - _ordered(exp_rn.view(uint), bits)).astype(np.float64)
    got = ulp_distance(actual, e64, name)
    np.testing.assert_array_equal(got[finite], want[finite])
    assert finite.sum() > 300


def test_as_array_prefers_array_protocol_over_dlpack():
    """An object with both protocols is read through ``__array__`` (numpy's own conversion),
    so a DLPack export that numpy cannot import is never tried."""
    from tolstat.measure.metrics import as_array

    class Both:
        def __array__(self, dtype=None, copy=None):
            return np.array([1.0, 2.5], dtype=np.float32)

        def __dlpack__(self, *args, **kwargs):
            raise BufferError("not exportable")

        def __dlpack_device__(self):
            return (1, 0)

    got = as_array(Both(), name="actual")
    assert got.dtype == np.float32 and got.tolist() == [1.0, 2.5]
