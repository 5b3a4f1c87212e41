"""The pool's exchangeability tests computed against the rest of the pool from one sort
(:class:`tolstat.calibration.pooling._RestTests`) equal the reference tests on the rest
built explicitly (scipy's Anderson-Darling, Mann-Whitney and Fisher tests)."""

import numpy as np
import pytest

from tolstat.calibration.pooling import _can_refuse, _pool_p, _pool_p_shape, _RestTests


def _pools(rng):
    yield "continuous", {f"g{i}": rng.standard_normal(30) for i in range(12)}
    yield "heavier tail", {**{f"g{i}": np.abs(rng.standard_normal(40)) for i in range(8)},
                           "t2": np.abs(rng.standard_t(2, 40))}
    yield "shifted", {**{f"g{i}": rng.standard_normal(25) for i in range(6)}, "s": rng.standard_normal(25) + 1.5}
    yield "lattice with ties", {f"g{i}": rng.integers(0, 6, 20).astype(float) for i in range(10)}
    yield "many zeros", {f"g{i}": np.where(rng.random(30) < 0.6, 0.0, rng.exponential(1.0, 30))
                         for i in range(7)}
    yield "unequal sizes", {f"g{i}": rng.lognormal(0, 1, n) for i, n in enumerate((9, 12, 50, 200, 31))}
    yield "few distinct", {"a": np.zeros(10), "b": np.r_[np.zeros(9), 1.0], "c": np.zeros(12)}
    yield "tiny groups", {f"g{i}": rng.standard_normal(n) for i, n in enumerate((3, 5, 8, 9, 2, 40))}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pool_tests_against_the_rest_equal_the_reference_tests(seed):
    rng = np.random.default_rng(seed)
    for name, scores in _pools(rng):
        members = list(scores)
        rt = _RestTests(scores, members)
        for gn in members:
            rest = np.concatenate([scores[h] for h in members if h != gn])
            x = scores[gn]
            assert rt.pool_p(gn) == pytest.approx(_pool_p(x, rest), rel=1e-9, abs=1e-12), (name, gn)
            assert rt.shape_p(gn) == pytest.approx(_pool_p_shape(x, rest), rel=1e-9, abs=1e-12), (name, gn)
            ref_extreme = _pool_p_shape(np.full(x.size, float(np.max(rest)) + 1.0), rest)
            assert rt.shape_p(gn, extreme=True) == pytest.approx(ref_extreme, rel=1e-9, abs=1e-12), (name, gn)
            assert (len(members) * rt.shape_p(gn, extreme=True) <= 0.01) == _can_refuse(
                x, rest, _pool_p_shape, len(members), 0.01), (name, gn)


def test_pool_tests_of_a_large_pool_match_scipy_to_rounding():
    rng = np.random.default_rng(7)
    scores = {f"g{i}": rng.gamma(2.0, 1.0, 30) for i in range(300)}
    scores["odd"] = rng.gamma(2.0, 1.0, 30) * 3.0
    members = list(scores)
    rt = _RestTests(scores, members)
    for gn in ("g0", "g150", "odd"):
        rest = np.concatenate([scores[h] for h in members if h != gn])
        assert rt.pool_p(gn) == pytest.approx(_pool_p(scores[gn], rest), rel=1e-9)
    assert rt.pool_p("odd") < 0.01 < rt.pool_p("g0")
