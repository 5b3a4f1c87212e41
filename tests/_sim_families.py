"""Run-level error families with known distributions, for the selection simulations."""

from __future__ import annotations

import numpy as np
from scipy import stats

M_MAX = 1000  # elements per run of the "max of normals" family


def _maxnorm_sf(x):
    return -np.expm1(M_MAX * np.log(np.clip(2 * stats.norm.cdf(x) - 1, 1e-300, 1)))


def _maxnorm_isf(q):
    return stats.norm.ppf((1 + (1 - q) ** (1 / M_MAX)) / 2)


#: name -> (sampler(rng, size), survival function P(X > x), isf(q) = true (1-q)-quantile)
FAMILIES = {
    "halfnormal": (lambda r, n: np.abs(r.standard_normal(n)), stats.halfnorm.sf, stats.halfnorm.isf),
    "exponential": (lambda r, n: r.exponential(size=n), stats.expon.sf, stats.expon.isf),
    "lognormal": (lambda r, n: r.lognormal(0.0, 0.5, n), lambda x: stats.lognorm.sf(x, 0.5),
                  lambda q: stats.lognorm.isf(q, 0.5)),
    "abs_t3_heavy": (lambda r, n: np.abs(r.standard_t(3, n)), lambda x: 2 * stats.t.sf(x, 3),
                     lambda q: stats.t.isf(q / 2, 3)),
    "beta_bounded": (lambda r, n: r.beta(2.0, 5.0, n), lambda x: stats.beta.sf(x, 2, 5),
                     lambda q: stats.beta.isf(q, 2, 5)),
    "max_of_1000_normals": (lambda r, n: _maxnorm_isf(r.random(n)), _maxnorm_sf, _maxnorm_isf),
    # ULP-like lattice: P(X > x) for integer support
    "lattice_poisson2": (lambda r, n: r.poisson(2.0, n).astype(float),
                         lambda x: stats.poisson.sf(np.floor(x), 2.0),
                         lambda q: stats.poisson.isf(q, 2.0)),
}
