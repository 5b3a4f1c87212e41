"""pytest-benchmark cases for the estimator kernels (run: pytest benchmarks/ --benchmark-only).

Not collected by the test suite (it lives outside tests/).
"""

import numpy as np
import pytest
from scipy import stats

from tolstat.models.estimators import bootstrap_quantile_bound, gpd_fit_mle, quantile_groups


@pytest.fixture(scope="module")
def x20k():
    return np.abs(np.random.default_rng(0).standard_normal(20_000))


@pytest.fixture(scope="module")
def gpd50k():
    return stats.genpareto.rvs(-0.2, size=50_000, random_state=np.random.default_rng(1))


@pytest.fixture(scope="module")
def groups():
    return np.random.default_rng(2).standard_normal((200, 100_000))


def test_bca_tolstat(benchmark, x20k):
    bootstrap_quantile_bound(x20k, 0.999, n_resamples=1000)  # compile
    benchmark(bootstrap_quantile_bound, x20k, 0.999, n_resamples=1000, method="bca")


def test_percentile_scipy(benchmark, x20k):
    stat = lambda a, axis: np.quantile(a, 0.999, axis=axis)
    benchmark.pedantic(stats.bootstrap, args=((x20k,), stat),
                       kwargs=dict(n_resamples=1000, method="percentile", alternative="less"), rounds=1)


def test_gpd_tolstat(benchmark, gpd50k):
    gpd_fit_mle(gpd50k)
    benchmark(gpd_fit_mle, gpd50k)


def test_gpd_scipy(benchmark, gpd50k):
    benchmark.pedantic(stats.genpareto.fit, args=(gpd50k,), kwargs=dict(floc=0), rounds=3)


def test_group_quantiles_tolstat(benchmark, groups):
    quantile_groups(groups, [0.99, 0.999])
    benchmark(quantile_groups, groups, [0.99, 0.999])


def test_group_quantiles_numpy_loop(benchmark, groups):
    benchmark.pedantic(lambda: [np.quantile(r, [0.99, 0.999]) for r in groups], rounds=2)
