"""Unit tests of tolstat.calibration.engine: units, split, normalisers, score, thresholds and their labels."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests

from tolstat.calibration.certificate import UnreachableThresholdWarning
from tolstat.calibration.engine import CertifyOptions, certify
from tolstat.calibration.pooling import LEND_MAX_RAISE
from tolstat._base.util import NotEnoughData
from tolstat.calibration.units import collapse, fit_normalisers, fit_size, split_units
from tolstat.measure.noise import combined_score as score
from tolstat.models.estimators.orderstat import order_statistic_min_n, order_statistic_rank

#: a pool of different operators: each member scored with its own normalisers
OWN = CertifyOptions(pool_normalisers="own")


# --------------------------------------------------------------------------- units
def test_collapse_cluster_is_its_per_statistic_max():
    st = {"a": [1.0, 3.0, 2.0, 5.0], "b": [4.0, np.nan, 1.0, np.nan]}
    u = collapse(st, cluster=["x", "x", "y", "y"])
    assert u.n == 2 and u.n_runs == 4 and u.n_clusters == 2 and u.n_duplicates == 0
    np.testing.assert_array_equal(u.values, [[3.0, 4.0], [5.0, 1.0]])
    u2 = collapse({"a": [1.0, 2.0], "b": [np.nan, np.nan]}, cluster=[0, 0])
    assert u2.values[0, 0] == 2.0 and np.isnan(u2.values[0, 1])


def test_duplicates_need_identical_covariates_and_statistics():
    st = {"a": [1.0, 1.0, 1.0, 2.0]}
    # ties without covariates are not duplicates (a lattice has many)
    assert collapse(st).n == 4
    u = collapse(st, covariates={"seed": [0, 0, 1, 0]})
    assert u.n == 3 and u.n_duplicates == 1
    # -0.0 and 0.0 compare equal, NaN equals NaN
    u = collapse({"a": [0.0, -0.0, np.nan, np.nan]}, covariates=[[1], [1], [2], [2]])
    assert u.n_duplicates == 2


def test_duplicates_with_non_numeric_covariates():
    st = {"a": [1.0, 1.0, 1.0]}
    u = collapse(st, covariates={"shape": [(2, 3), (2, 3), (3, 2)], "dtype": ["f16", "f16", "f16"]})
    assert u.n == 2 and u.n_duplicates == 1
    res = certify({"a": np.r_[np.ones(3), np.zeros(300)]}, fp_budget=0.01,
                  covariates={"case": ["x", "x", "y"] + list(range(300))})
    assert res["all"].n_duplicates == 1 and res["all"].n_units == 302


def test_collapse_validates():
    with pytest.raises(ValueError, match="different numbers of runs"):
        collapse({"a": [1, 2], "b": [1]})
    with pytest.raises(ValueError, match="cluster has 1 labels for 2 runs"):
        collapse({"a": [1, 2]}, cluster=[0])
    with pytest.raises(ValueError, match="covariates have 3 runs"):
        collapse({"a": [1, 2]}, covariates=[1, 2, 3])



def test_collapse_of_one_run_is_one_unit_and_of_no_run_is_refused():
    u = collapse({"a": [2.5], "b": [np.nan]})
    assert (u.n, u.n_runs, u.n_duplicates, u.n_clusters, u.names) == (1, 1, 0, None, ("a", "b"))
    np.testing.assert_array_equal(u.values, [[2.5, np.nan]])
    u = collapse({"a": [2.5]}, cluster=["x"], covariates={"seed": [0]})
    assert (u.n, u.n_clusters) == (1, 1) and u.values.tolist() == [[2.5]]
    with pytest.raises(ValueError, match="^stats has no runs$"):
        collapse({"a": []})


# --------------------------------------------------------------------------- split
def test_fit_size_rules():
    assert fit_size(400, 1, 299) == 0  # one statistic: no run spent on normalisers
    assert fit_size(400, 3, 299) == 80  # 20%
    assert fit_size(30, 3, 299) == 10  # min_fit
    assert fit_size(5000, 3, 299) == 200  # max_fit
    # lowered so B keeps the units its own order statistic needs
    assert fit_size(320, 2, 299) == 21
    assert fit_size(305, 2, 299) == 6  # down to 1 unit rather than a refusal
    assert fit_size(299, 2, 299) == 60  # cannot reach 299 anyway: default size
    assert fit_size(2, 2, 299) == 1  # B keeps at least one unit
    with pytest.raises(ValueError, match="n_units must be >= 1"):
        fit_size(0, 2, 10)


def test_split_is_deterministic_and_disjoint():
    a1, b1 = split_units(50, 10, seed=3)
    a2, b2 = split_units(50, 10, seed=3)
    np.testing.assert_array_equal(a1, a2)
    assert a1.size == 10 and b1.size == 40 and not set(a1) & set(b1)
    a3, _ = split_units(50, 10, seed=4)
    assert not np.array_equal(a1, a3)
    with pytest.raises(ValueError, match="n_fit must lie in"):
        split_units(5, 6)


def test_normalisers_floor_and_quantile():
    v = np.array([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0], [0.0, np.nan]])
    q = fit_normalisers(v, quantile=0.5, resolution={"T0": 0.25, "T1": 7.0})
    assert q[0] == 0.25  # all zero -> the resolution
    assert q[1] == float(np.quantile([1.0, 2.0, 3.0], 0.5, method="higher"))
    assert fit_normalisers(np.zeros((3, 1)))[0] == 1.0  # no resolution -> 1


# --------------------------------------------------------------------------- score
def test_score_is_max_ratio_skipping_nan():
    s, which = score({"a": [1.0, np.nan, np.nan, np.inf], "b": [0.5, 2.0, np.nan, 0.0]},
                     {"a": 2.0, "b": 1.0}, which=True)
    np.testing.assert_array_equal(s[[0, 1, 3]], [0.5, 2.0, np.inf])
    assert np.isnan(s[2])
    assert list(which) == ["a", "b", "", "a"]
    assert float(score({"a": 3.0, "extra": 100.0}, {"a": 2.0})) == 1.5
    with pytest.raises(ValueError, match=r"lacks the normalised statistics \['b'\]"):
        score({"a": 1.0}, {"a": 1.0, "b": 1.0})
    with pytest.raises(ValueError, match="finite and > 0"):
        score({"a": 1.0}, {"a": 0.0})


# --------------------------------------------------------------------------- budgets
def test_holm_adjusts_the_finite_p_values_and_keeps_nan():
    from tolstat._base.inference import holm

    p = np.random.default_rng(0).random(17) ** 3
    with_nan = np.insert(p, [3, 9], np.nan)
    adj = holm(with_nan)
    assert np.isnan(adj[[3, 10]]).all()
    np.testing.assert_allclose(np.delete(adj, [3, 10]), multipletests(p, method="holm")[1])


# --------------------------------------------------------------------------- certify
def test_order_statistic_threshold_is_the_binomial_rank_of_B():
    rng = np.random.default_rng(1)
    t = {"m": np.abs(rng.standard_normal(500)), "r": rng.exponential(size=500)}
    c = certify(t, fp_budget=0.01, options=CertifyOptions(seed=5))["all"]
    assert c.method == "order_statistic" and c.n_fit == 100 and c.n_cal == 400
    u = collapse(t)
    iA, iB = split_units(500, 100, 5)
    q = fit_normalisers(u.values[iA], names=("m", "r"))
    s = np.sort(np.max(u.values[iB] / q, axis=1))
    r = int(order_statistic_rank(400, 0.99, 0.95)[0])
    assert c.rank == r and c.threshold == s[r - 1]
    assert c.normalisers == {"m": q[0], "r": q[1]}
    assert "PAC" in c.guarantee and "0.95" in c.guarantee
    import json

    d = json.loads(json.dumps(c.to_dict()))
    assert d["threshold"] == c.threshold and d["flags"] == [] and d["normalisers"] == c.normalisers
    # the same score function checks new runs
    assert bool(c.passes({"m": 0.0, "r": 0.0})) and not bool(c.passes({"m": 1e3, "r": 0.0}))


def test_one_statistic_uses_every_unit():
    x = np.random.default_rng(2).exponential(size=299)
    c = certify({"m": x}, fp_budget=0.01)["all"]
    assert c.n_fit == 0 and c.n_cal == 299
    # threshold in the statistic's units is the sample maximum (rank 299 of 299)
    assert c.threshold * c.normalisers["m"] == pytest.approx(x.max())


def test_refusal_names_group_and_units_needed():
    x = np.random.default_rng(3).exponential(size=100)
    with pytest.raises(NotEnoughData, match=r"group g: 100 calibration units < 299") as e:
        certify({"m": x}, np.full(100, "g"), fp_budget=0.01)
    assert e.value.n_needed == 299 and e.value.group == "g"
    assert isinstance(e.value, ValueError)
    res = certify({"m": x}, fp_budget=0.01, on_refusal="record")
    assert not res.groups and res.refused["all"].n_needed == 299
    with pytest.raises(NotEnoughData, match="group all"):
        res["all"]


def test_clusters_count_as_one_unit():
    rng = np.random.default_rng(4)
    case = np.repeat(np.arange(200), 3)
    x = np.repeat(rng.exponential(size=200), 3)
    with pytest.raises(NotEnoughData, match=r"200 calibration units < 299"):
        certify({"m": x}, fp_budget=0.01, cluster=case)
    c = certify({"m": x}, fp_budget=0.02, cluster=case)["all"]
    assert c.n_units == 200 and c.n_clusters == 200 and c.n_runs == 600
    assert "cluster" in c.guarantee


def test_exact_op_gets_the_floor_not_a_refusal():
    c = certify({"m": np.zeros(20), "r": np.zeros(20)}, fp_budget=0.01, floor={"m": 1.0, "r": 0.5})["all"]
    assert c.method == "exact" and c.threshold == 1.0 and "floor_raised" in c.flags
    # what it promises instead of the budget: the distribution-free bound of 20 exact units
    assert "not the budget 0.01" in c.guarantee
    assert f"<= {1 - 0.05 ** (1 / 20):.3g}" in c.guarantee
    # a correctly rounded output (every statistic at its floor) passes, more fails
    assert bool(c.passes({"m": 1.0, "r": 0.5})) and not bool(c.passes({"m": 1.01, "r": 0.0}))
    # enough exact units: the order statistic (0) raised to the floor
    c = certify({"m": np.zeros(400)}, fp_budget=0.01, floor=0.25)["all"]
    assert c.method == "order_statistic" and c.threshold * c.normalisers["m"] == 0.25


def test_floor_raises_threshold_in_statistic_units():
    x = np.random.default_rng(5).exponential(size=400) * 1e-3
    c = certify({"m": x}, fp_budget=0.01, floor=1.0)["all"]
    assert c.threshold * c.normalisers["m"] == pytest.approx(1.0) and "floor_raised" in c.flags


def test_unreachable_threshold_is_flagged_and_warned():
    rng = np.random.default_rng(6)
    t = {"m": np.abs(rng.standard_normal(400)), "bias": np.abs(rng.standard_normal(400))}
    with pytest.warns(UnreachableThresholdWarning, match="bias can reach"):
        c = certify(t, fp_budget=0.01, upper={"bias": 0.5})["all"]
    assert c.unreachable == ("bias",) and "unreachable:bias" in c.flags and "never_fails" not in c.flags
    with pytest.warns(UnreachableThresholdWarning, match="the check can never fail"):
        c = certify(t, fp_budget=0.01, upper={"bias": 0.5, "m": 0.5})["all"]
    assert "never_fails" in c.flags
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        certify(t, fp_budget=0.01, upper={"bias": 1e6})


def test_conformal_is_labelled_marginal():
    x = np.random.default_rng(7).exponential(size=150)
    c = certify({"m": x}, fp_budget=0.01, options=CertifyOptions(rule="conformal"))["all"]
    assert c.method == "conformal" and c.guarantee.startswith("marginal") and "no confidence level" in c.guarantee
    assert c.rank == math.ceil(151 * 0.99 - 1e-9)


def test_nan_statistic_left_out_and_infinite_refused():
    rng = np.random.default_rng(8)
    t = {"m": rng.exponential(size=400), "row": np.full(400, np.nan)}
    c = certify(t, fp_budget=0.01)["all"]
    assert set(c.normalisers) == {"m"} and c.n_fit == 0
    t["m"][3] = np.inf
    with pytest.raises(ValueError, match="infinite.*non-finite output"):
        certify(t, fp_budget=0.01)


@pytest.mark.parametrize("kw, msg", [
    (dict(fp_budget=0.0), "fp_budget must be a probability in"),
    (dict(fp_budget=0.01, confidence=1.0), "confidence must lie strictly"),
    (dict(fp_budget=0.01, on_refusal="skip"), "on_refusal must be"),
    (dict(fp_budget=0.01, floor={"zz": 1.0}), r"floor names unknown statistics \['zz'\]"),
    (dict(fp_budget=0.01, floor=-1.0), "floor must be >= 0"),
])
def test_certify_validates(kw, msg):
    with pytest.raises(ValueError, match=msg):
        certify({"m": np.ones(400)}, **kw)


def test_negative_statistics_refused():
    with pytest.raises(ValueError, match="nonnegative"):
        certify({"m": -np.ones(400)}, fp_budget=0.01)


# --------------------------------------------------------------------------- pooling
def _groups(rng, g=10, n=30, scale0=1.0):
    x = np.abs(rng.standard_normal(g * n))
    x[:n] *= scale0
    return {"m": x}, np.repeat([f"g{i}" for i in range(g)], n)


def test_pooling_with_two_statistics_spends_few_fitting_units():
    rng = np.random.default_rng(16)
    st = {"m": np.abs(rng.standard_normal(300)), "r": rng.exponential(size=300)}
    lab = np.repeat([f"g{i}" for i in range(10)], 30)
    res = certify(st, lab, fp_budget=0.01, options=CertifyOptions(fit_fraction=0.2))
    c = res["g0"]
    # 300 units, 299 needed: one unit fits the pool's shared normalisers
    assert c.n_scores == 299 and c.n_fit == 1 and res["g1"].n_fit == 0
    assert res["g0"].normalisers == res["g7"].normalisers
    res = certify(st, lab, fp_budget=0.02)  # room: min_fit = 10 units in all, one per group
    assert res["g0"].n_scores == 290 and all(res[g].n_fit == 1 for g in res.groups)


def test_pooling_gives_every_exchangeable_group_a_threshold():
    st, lab = _groups(np.random.default_rng(9))
    res = certify(st, lab, fp_budget=0.01)
    assert len(res.groups) == 10 and not res.refused
    c = res["g3"]
    assert c.method == "pooled_order_statistic" and len(c.pool) == 10 and c.n_scores == 300
    assert c.pool_p > 0.01 and "not proved" in c.guarantee
    assert c.threshold * c.normalisers["m"] == pytest.approx(st["m"].max())


def test_pooling_refuses_a_group_with_larger_scores():
    st, lab = _groups(np.random.default_rng(10), scale0=3.0)
    res = certify(st, lab, fp_budget=0.02, on_refusal="record")
    assert "g0" in res.refused and res.refused["g0"].n_needed == 149
    assert "not exchangeable" in str(res.refused["g0"])
    assert all("g0" not in c.pool for c in res.groups.values())
    assert len(res.groups) == 9


def test_pooling_respects_pool_by_and_min_pool():
    st, lab = _groups(np.random.default_rng(11))
    key = {f"g{i}": ("a" if i < 2 else "b") for i in range(10)}
    res = certify(st, lab, fp_budget=0.02, on_refusal="record", options=CertifyOptions(pool_by=key))
    assert set(res.refused) == {"g0", "g1"} and "min_pool" in str(res.refused["g0"])
    assert res["g5"].pool == tuple(f"g{i}" for i in range(2, 10))
    res = certify(st, lab, fp_budget=0.02, on_refusal="record", options=CertifyOptions(pooling=False))
    assert len(res.refused) == 10 and "pooling is off" in str(res.refused["g0"])


def test_large_group_keeps_its_own_threshold_and_lends_scores():
    rng = np.random.default_rng(12)
    x = np.abs(rng.standard_normal(400 + 9 * 30))
    lab = np.array(["big"] * 400 + [f"s{i // 30}" for i in range(270)])
    res = certify({"m": x}, lab, fp_budget=0.01)
    assert res["big"].method == "order_statistic" and res["big"].pool == ()
    assert res["s0"].method == "pooled_order_statistic" and "big" in res["s0"].pool


def test_exact_group_is_not_a_donor():
    rng = np.random.default_rng(13)
    x = np.concatenate([np.zeros(30), np.abs(rng.standard_normal(300))])
    lab = np.repeat([f"g{i}" for i in range(11)], 30)
    res = certify({"m": x}, lab, fp_budget=0.01, floor=0.5)
    assert res["g0"].method == "exact"
    assert "g0" not in res["g1"].pool and res["g1"].n_scores == 300


def test_a_group_all_zero_by_chance_lends_its_zeros_to_a_pool_of_its_law():
    """Ten groups of 30 units of one law whose units are 0 nine times in ten: one group all
    zeros is a chance event of that law. It is tested like every member and, kept, lends its
    zeros, so the pool has the 300 scores that budget 1 % needs (without them: 270, and every
    group was refused)."""
    rng = np.random.default_rng(29)
    law = lambda n: np.where(rng.random(n) < 0.9, 0.0, np.abs(rng.standard_normal(n)))  # noqa: E731
    x = np.concatenate([np.zeros(30)] + [law(30) for _ in range(9)])
    lab = np.repeat([f"g{i}" for i in range(10)], 30)
    res = certify({"m": x}, lab, fp_budget=0.01)
    assert res["g0"].method == "exact" and not res.refused
    assert all(res[f"g{i}"].method == "pooled_order_statistic" and "g0" in res[f"g{i}"].pool for i in range(1, 10))
    assert res["g1"].n_scores == 300
    # the order statistic of the pool: its largest score, which the zeros cannot lower
    c = res["g1"]
    assert c.rank == c.n_scores and c.threshold * c.normalisers["m"] == pytest.approx(x.max())


@pytest.mark.parametrize("scale,lends", [(1.8, True), (4.0, False), (0.2, False)])
def test_a_group_rejected_from_a_short_pool_lends_only_somewhat_higher_scores(scale, lends):
    """Ten groups of 30 units, one of them scaled: the test rejects it and it is refused. The
    nine others alone have 270 scores where budget 1 % needs 299. Higher scores can only raise
    their order statistic, so the 1.8x group lends its scores and the nine are pooled on 300.
    The 4x group would set their threshold at more than LEND_MAX_RAISE times their own largest
    score (a tolerance loosened by its tail), and the 0.2x group's lower scores could lower
    it: neither lends, and the nine are refused."""
    rng = np.random.default_rng(31)
    x = np.concatenate([scale * np.abs(rng.standard_normal(30))] + [np.abs(rng.standard_normal(30)) for _ in range(9)])
    lab = np.repeat([f"g{i}" for i in range(10)], 30)
    res = certify({"m": x}, lab, fp_budget=0.01, on_refusal="record")
    assert "g0" in res.refused and "not exchangeable" in str(res.refused["g0"])
    if lends:
        assert sorted(res.groups) == [f"g{i}" for i in range(1, 10)]
        c = res["g1"]
        assert c.n_scores == 300 and "g0" in c.pool and "rejected for higher scores" in c.guarantee
        assert c.threshold * c.normalisers["m"] == pytest.approx(x.max())
        assert x.max() <= LEND_MAX_RAISE * x[30:].max()
    else:
        assert len(res.refused) == 10 and "270 scores from 9 groups" in str(res.refused["g1"])


def test_a_pool_still_short_with_its_lenders_is_refused():
    """Six groups of 30 units, one of them 1.8x: with its scores the pool has 180, still fewer
    than the 299 that budget 1 % needs, so nothing is lent and every group is refused."""
    rng = np.random.default_rng(31)
    x = np.concatenate([1.8 * np.abs(rng.standard_normal(30))] + [np.abs(rng.standard_normal(30)) for _ in range(5)])
    lab = np.repeat([f"g{i}" for i in range(6)], 30)
    res = certify({"m": x}, lab, fp_budget=0.01, on_refusal="record")
    assert len(res.refused) == 6 and not res.groups


@pytest.mark.slow
def test_pooled_threshold_promise_in_simulation_3x_group():
    """Non-exchangeable group (3x larger): refused, or its threshold keeps the promise."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from _certify_sim import run_cell

    c = run_cell("light (half-normal)", 30, 1e-2, groups=10, repeats=100, scale0=3.0)
    assert c.refused >= 0.9 * c.repeats, c
    # a refusal promises nothing, so it is no violation: over all calibrations the rate of
    # thresholds whose true FP exceeds the budget stays within 1 - confidence + 2 MC s.e.
    lim = 0.05 + 2 * math.sqrt(0.05 * 0.95 / c.repeats)
    assert c.violations / c.repeats <= lim, c


def test_n_needed_is_enough_with_two_statistics():
    rng = np.random.default_rng(14)

    def t(n):
        return {"m": rng.exponential(size=n), "r": rng.exponential(size=n)}

    with pytest.raises(NotEnoughData, match="group all") as e:
        certify(t(299), fp_budget=0.01)
    need = e.value.n_needed
    assert need == order_statistic_min_n(0.99, 0.95) + 1
    c = certify(t(need), fp_budget=0.01)["all"]
    assert c.n_cal == 299 and c.n_fit == 1
    with pytest.raises(NotEnoughData, match="group all"):
        certify(t(need - 1), fp_budget=0.01)


def test_group_labels_must_be_one_per_run():
    with pytest.raises(ValueError, match="one label per run"):
        certify({"m": np.ones(4)}, [("a", "b")] * 4, fp_budget=0.5)


def test_undeclared_clusters_break_the_promise_declared_ones_do_not():
    """100 cases x 3 identical variants: counted as 300 runs the threshold under-covers."""
    rng = np.random.default_rng(15)
    case = np.repeat(np.arange(100), 3)
    viol = refused = 0
    R = 200
    for i in range(R):
        x = np.repeat(np.abs(rng.standard_normal(100)), 3)
        c = certify({"m": x}, fp_budget=0.02, options=CertifyOptions(seed=i))["all"]  # undeclared: n = 300 >= 149
        viol += stats.halfnorm.sf(c.threshold * c.normalisers["m"]) > 0.02
        res = certify({"m": x}, fp_budget=0.02, cluster=case, on_refusal="record")
        refused += "all" in res.refused
    # with 100 independent units the max keeps the 0.98-quantile only with prob 1 - 0.98**100 = 0.87
    assert viol / R > 0.05 + 2 * math.sqrt(0.05 * 0.95 / R)
    assert refused == R  # declared: 100 units < 149 needed


# --------------------------------------------------------------------------- sparse groups (own pool)
def _sparse_pool(rng, k_pos=(7, 2, 0), heavy_last=False):
    """Nine groups of 100 units with 30-100 % inexact units and sparse groups with exactly
    ``k_pos`` inexact units (the rest exact: every statistic 0)."""
    cols, labels = [], []
    pis = np.linspace(0.3, 1.0, 9)
    for g, pi in enumerate(pis):
        t = np.abs(rng.standard_normal((100, 2))) * [1.0, 3.0] * 10.0 ** rng.uniform(-1, 1)
        t[rng.random(100) >= pi] = 0.0
        cols.append(t)
        labels += [f"g{g}"] * 100
    for j, k in enumerate(k_pos):
        t = np.zeros((100, 2))
        t[rng.choice(100, k, replace=False)] = np.abs(rng.standard_normal((k, 2))) * [1.0, 3.0]
        cols.append(t)
        labels += [f"sparse{j}"] * 100
    m = np.vstack(cols)
    return {"T0": m[:, 0], "T1": m[:, 1]}, np.array(labels)


def test_sparse_group_is_tested_on_its_few_scores_and_keeps_its_own_bound():
    from tolstat.calibration.certificate import _max_bound
    from tolstat.calibration.pooling import _can_refuse, _pool_p_shape

    st, lab = _sparse_pool(np.random.default_rng(21))
    res = certify(st, lab, fp_budget=0.01, on_refusal="record", options=OWN)
    c = res["sparse0"]  # 7 inexact units: enough to bound its level; a few in its part B
    assert c.method == "pooled_order_statistic" and "weakly_tested" in c.flags
    assert "fewer than min_test_units = 8" in c.guarantee and "distribution-free" in c.guarantee
    # the threshold is at least every one of its own calibration scores (under its own normalisers)
    m = np.column_stack([st["T0"], st["T1"]])[lab == "sparse0"]
    _, iB = split_units(100, c.n_fit, 0)
    own = np.max(m[iB] / np.array([c.normalisers["T0"], c.normalisers["T1"]]), axis=1)
    assert c.threshold >= own.max() and c.n_cal == iB.size
    assert f"the rate is <= {_max_bound(c.n_cal, 0.95):.3g}" in c.guarantee
    # the own bound is the order statistic's: the largest of n certifies exactly that budget
    n = c.n_cal
    assert (1 - _max_bound(n, 0.95)) ** n == pytest.approx(0.05)
    assert order_statistic_rank(n, 1 - _max_bound(n, 0.95) * 1.001, 0.95)[0] <= n
    # 2 inexact units: refused (too few to test, or to bound its level); none: exact, the floor
    assert re.search("too few (inexact units|for the tail test)", str(res.refused["sparse1"]))
    assert res["sparse2"].method == "exact"
    # every group with enough positive scores is tested as before (no flag)
    assert all("weakly_tested" not in res[f"g{g}"].flags for g in range(9) if f"g{g}" in res.groups)
    # the test "can refuse" one score only if a single extreme score could reach pool_alpha after Holm
    rest = np.abs(np.random.default_rng(0).standard_normal(900))
    assert not _can_refuse(np.ones(1), rest, _pool_p_shape, 12, 0.01)
    assert _can_refuse(np.ones(3), rest, _pool_p_shape, 12, 0.01)
    assert not _can_refuse(np.ones(0), rest, _pool_p_shape, 12, 0.01)


def test_sparse_group_far_heavier_than_the_pool_is_refused():
    rng = np.random.default_rng(22)
    st, lab = _sparse_pool(rng, k_pos=(0,))
    rows = np.flatnonzero(lab == "sparse0")
    iA, iB = split_units(100, 33, 0)  # the split of a small group pooling with its own normalisers
    assert certify(st, lab, fp_budget=0.01, on_refusal="record", options=OWN)["sparse0"].method == "exact"
    normal, huge = np.r_[iA[:3], iB[:3]], iB[3:6]  # 6 inexact units at one level, 3 of B far beyond it
    for k, c in (("T0", 1.0), ("T1", 3.0)):
        st[k][rows[normal]] = c * np.abs(rng.standard_normal(6))
        st[k][rows[huge]] = c * 1e4
    res = certify(st, lab, fp_budget=0.01, on_refusal="record", options=OWN)
    assert "sparse0" in res.refused and "heavier upper tail" in str(res.refused["sparse0"])


def test_sparse_group_threshold_is_raised_to_its_own_largest_score():
    """One of a sparse group's few part-B scores far beyond the others: the tail test (on 5
    scores) cannot refuse it, and the pooled threshold (its level bounded by the second
    largest of 11 inexact units) lies below that score; the threshold is raised to it, so
    the group's own distribution-free bound holds."""
    rng = np.random.default_rng(23)
    st, lab = _sparse_pool(rng, k_pos=(0,))
    rows = np.flatnonzero(lab == "sparse0")
    iA, iB = split_units(100, 33, 0)
    pos = np.r_[iA[:6], iB[:5]]
    for k, c in (("T0", 1.0), ("T1", 3.0)):
        st[k][rows[pos]] = c * (0.5 + rng.random(11))
        st[k][rows[iB[4]]] = c * 1e3
    res = certify(st, lab, fp_budget=0.01, on_refusal="record", options=OWN)
    c = res["sparse0"]
    assert "weakly_tested" in c.flags and "raised to its own largest calibration score" in c.reason
    assert c.threshold == pytest.approx(1e3 * 3.0 / c.normalisers["T1"])


# --------------------------------------------------------------------------- errors, normalisers, own pools
# Errors by name, normalisers and floors, unreachable statistics, own pools.
# References: the documented seeded split of ``split_units``, "a third of a small group's units"
# for own pools, the resolution rule of the normalisers, the closed form of the smallest number
# of inexact units that bounds a median, and the stated wording of guarantees and errors.


def _seeded_split(n: int, n_fit: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The documented split: ``numpy.random.default_rng([seed, n]).permutation(n)``, first
    ``n_fit`` indices fit, the rest calibrate (both sorted)."""
    perm = np.random.default_rng([seed, n]).permutation(n)
    return np.sort(perm[:n_fit]), np.sort(perm[n_fit:])


def _own_pool(rng: np.random.Generator, n: int = 100, groups: int = 9, exact_share: float = 0.0):
    """``groups`` groups of ``n`` units, two statistics at a random scale per group; a share
    of each group's units exactly zero (correctly rounded runs)."""
    cols, labels = [], []
    for g in range(groups):
        t = np.abs(rng.standard_normal((n, 2))) * [1.0, 3.0] * 10.0 ** rng.uniform(-1, 1)
        t[rng.random(n) < exact_share] = 0.0
        cols.append(t)
        labels += [f"g{g}"] * n
    return np.vstack(cols), np.array(labels)


def test_stats_errors_name_the_stats_argument():
    with pytest.raises(ValueError, match=r"^stats: statistics have different numbers of runs"):
        collapse({"a": [1.0, 2.0], "b": [1.0]})


def test_pool_alpha_is_validated_by_name():
    with pytest.raises(ValueError, match=r"^CertifyOptions\.pool_alpha must lie strictly between 0 and 1, got 0\.0"):
        CertifyOptions(pool_alpha=0.0)


@pytest.mark.parametrize("kw, msg", [
    (dict(rule="evt"), r"^CertifyOptions\.rule must be one of \('order_statistic', 'conformal'\), got 'evt'"),
    (dict(pool_alpha=2), r"^CertifyOptions\.pool_alpha must lie strictly between 0 and 1, got 2\.0"),
    (dict(pool_alpha="x"), r"^CertifyOptions\.pool_alpha must be a number in \(0, 1\)"),
    (dict(pool_normalisers="mine"), r"^CertifyOptions\.pool_normalisers must be 'shared' or 'own', got 'mine'"),
    (dict(min_pool=1), r"^CertifyOptions\.min_pool must be an integer >= 2, got 1"),
    (dict(seed=-1), r"^CertifyOptions\.seed must be an integer >= 0, got -1"),
    (dict(min_test_units=2.5), r"^CertifyOptions\.min_test_units must be an integer >= 1, got 2\.5"),
    (dict(min_fit=20, max_fit=10), r"^CertifyOptions needs min_fit <= max_fit, got min_fit=20, max_fit=10"),
    (dict(fit_fraction=1.0), r"^CertifyOptions\.fit_fraction must lie in \[0, 1\), got 1\.0"),
    (dict(norm_quantile=0.0), r"^CertifyOptions\.norm_quantile must lie in \(0, 1\], got 0\.0"),
])
def test_certify_options_validate_their_fields(kw, msg):
    with pytest.raises(ValueError, match=msg):
        CertifyOptions(**kw)


def test_certify_options_pooling_is_a_flag():
    with pytest.raises(TypeError, match=r"^CertifyOptions\.pooling must be True or False, got 1"):
        CertifyOptions(pooling=1)


def test_certify_options_must_be_certify_options():
    with pytest.raises(TypeError, match=r"^options must be a CertifyOptions, got dict"):
        certify({"m": np.ones(400)}, fp_budget=0.01, options={"seed": 1})
    with pytest.raises(TypeError, match="unexpected keyword argument 'seed'"):
        certify({"m": np.ones(400)}, fp_budget=0.01, seed=1)  # the settings live in CertifyOptions


def test_certify_default_options_are_certify_options():
    rng = np.random.default_rng(3)
    t = {"m": np.abs(rng.standard_normal(400)), "r": rng.exponential(size=400)}
    a, b = certify(t, fp_budget=0.01)["all"], certify(t, fp_budget=0.01, options=CertifyOptions())["all"]
    assert (a.threshold, a.normalisers, a.n_fit) == (b.threshold, b.normalisers, b.n_fit)
    opts = CertifyOptions()
    assert (opts.rule, opts.pooling, opts.pool_by, opts.pool_alpha, opts.min_pool, opts.min_test_units,
            opts.pool_normalisers, opts.seed, opts.fit_fraction, opts.min_fit, opts.max_fit, opts.norm_quantile) == (
        "order_statistic", True, None, 0.01, 3, 8, "shared", 0, 0.2, 10, 200, 1.0)


def test_normaliser_of_a_statistic_without_positive_value_is_its_positive_resolution_else_one():
    # documented: "the resolution floor of the statistic if positive, else 1"
    v = np.array([[0.0, 0.0, 2.0], [0.0, np.nan, 5.0]])
    q = fit_normalisers(v, resolution={"T0": 0.0, "T1": 0.5, "T2": 0.25})
    np.testing.assert_array_equal(q, [1.0, 0.5, 5.0])


def test_exact_op_normalisers_are_the_floors():
    # "floor ... Also the normaliser of a statistic that is zero on the whole fitting part"
    floors = {"m": 1.0, "r": 0.5}
    c = certify({"m": np.zeros(20), "r": np.zeros(20)}, fp_budget=0.01, floor=floors)["all"]
    assert c.normalisers == floors
    # the floor on S is then max_j floor_j / q_j = 1
    assert c.floor == max(floors[k] / c.normalisers[k] for k in floors) == 1.0


def test_exact_guarantee_states_what_passes_and_what_fails():
    c = certify({"m": np.zeros(20)}, fp_budget=0.01, floor=0.25)["all"]
    assert c.method == "exact"
    assert "a correctly rounded output passes and any error above the floor fails" in c.guarantee
    # ... and the certificate does what it states
    assert bool(c.passes({"m": 0.25})) and not bool(c.passes({"m": 0.2500001}))


def test_one_unreachable_statistic_is_not_reported_as_a_check_that_never_fails():
    rng = np.random.default_rng(6)
    t = {"m": np.abs(rng.standard_normal(400)), "bias": np.abs(rng.standard_normal(400))}
    with pytest.warns(UnreachableThresholdWarning,
                      match=r"bias can reach .*\): those statistics can never fail the check$") as rec:
        c = certify(t, fp_budget=0.01, upper={"bias": 0.5})["all"]
    assert not any("the check can never fail" in str(w.message) for w in rec)
    assert "never_fails" not in c.flags and "those statistics can never fail the check" in c.reason


def test_own_pool_fits_a_third_of_a_small_groups_units_on_its_inexact_units():
    """``pool_normalisers="own"``: a small group's normalisers come from a third of its
    units (docs/guarantees.md), its inexact ones only, whatever ``fit_size`` would give
    (20 units of 100 here), and even with a quantile below the maximum."""
    rng = np.random.default_rng(41)
    m, lab = _own_pool(rng, exact_share=0.4)
    st = {"T0": m[:, 0], "T1": m[:, 1]}
    res = certify(st, lab, fp_budget=0.01, on_refusal="record",
                  options=CertifyOptions(pool_normalisers="own", norm_quantile=0.5))
    assert res.groups, res.refused
    n_fit = 100 // 3
    iA, iB = _seeded_split(100, n_fit)
    for gname, c in res.groups.items():
        assert (c.n_fit, c.n_cal) == (n_fit, 100 - n_fit)
        a = m[lab == gname][iA]
        a = a[a.max(axis=1) > 0]  # the inexact units of part A
        want = {k: float(np.quantile(a[:, j], 0.5, method="higher")) for j, k in enumerate(("T0", "T1"))}
        assert c.normalisers == want


def test_own_pool_with_one_statistic_still_fits_its_own_normaliser_on_a_third():
    rng = np.random.default_rng(42)
    m, lab = _own_pool(rng)
    res = certify({"T0": m[:, 0]}, lab, fp_budget=0.01, on_refusal="record", options=OWN)
    assert res.groups, res.refused
    iA, _ = _seeded_split(100, 33)
    for gname, c in res.groups.items():
        assert c.n_fit == 33
        # one statistic: the score is the statistic itself (q = 1), in the units a check compares
        assert c.normalisers == {"T0": 1.0}
    # shared normalisers (the default) spend no unit on them with one statistic
    res = certify({"T0": m[:, 0]}, lab, fp_budget=0.01, on_refusal="record")
    assert all(c.n_fit == 0 for c in res.groups.values())


def test_own_pool_refuses_a_group_whose_level_cannot_be_bounded_by_name():
    """Five inexact units of 100: the tail test can still refuse three part-B scores, but the
    median of the group's level has no distribution-free upper bound at confidence
    ``1 - (1 - 0.95) / 3`` from fewer than ``ceil(log2(3 / 0.05)) = 6`` units
    (``0.5**n <= (1 - confidence) / 3``): the group is refused, under its own name."""
    rng = np.random.default_rng(43)
    m, lab = _own_pool(rng)
    iA, iB = _seeded_split(100, 33)
    sparse = np.zeros((100, 2))
    pos = np.r_[iA[:2], iB[:3]]
    sparse[pos] = np.abs(rng.standard_normal((5, 2))) * [1.0, 3.0]
    m, lab = np.vstack([m, sparse]), np.r_[lab, ["sparse"] * 100]
    need = math.ceil(math.log2(3 / (1 - 0.95)))
    assert need == 6 and pos.size < need
    res = certify({"T0": m[:, 0], "T1": m[:, 1]}, lab, fp_budget=0.01, on_refusal="record",
                  options=OWN)
    assert set(res.refused) == {"sparse"} and len(res) == 10
    err = res.refused["sparse"]
    assert err.group == "sparse" and str(err).startswith("group sparse: 67 calibration units < 299 needed")
    assert "too few inexact units to bound its level" in str(err)


def test_unit_values_are_float64_whatever_the_dtype_of_the_statistics():
    """collapse reads float32 and integer statistics as float64 (Units.values' dtype), and
    certify certifies them exactly as their float64 values."""
    x = (np.random.default_rng(8).exponential(size=(600, 2)) * 0.1).astype(np.float32)
    for stats in ({"a": x[:, 0], "b": x[:, 1]}, {"n": np.arange(5, dtype=np.int64)}):
        u = collapse(stats)
        assert u.values.dtype == np.float64
        np.testing.assert_array_equal(u.values, np.column_stack([np.asarray(v, np.float64) for v in stats.values()]))
    want = certify({"a": x[:, 0].astype(np.float64), "b": x[:, 1].astype(np.float64)}, fp_budget=0.01)["all"]
    got = certify({"a": x[:, 0], "b": x[:, 1]}, fp_budget=0.01)["all"]
    assert got.threshold == want.threshold and got.normalisers == want.normalisers


def test_group_codes_as_a_categorical_certify_as_their_labels():
    import pandas as pd

    rng = np.random.default_rng(21)
    names = ["b", "a", "c", "unused"]  # categories out of order, one without runs
    codes = np.concatenate([np.full(400, 1), rng.integers(0, 3, 900), np.full(40, 2)])
    stats = {"T0": np.abs(rng.standard_normal(codes.size)), "T1": rng.gamma(2.0, size=codes.size)}
    stats["T1"][codes == 2] = np.nan
    kw = dict(fp_budget=0.01, confidence=0.95, on_refusal="record")
    want = certify(stats, np.array(names, dtype=object)[codes], **kw)
    got = certify(stats, pd.Categorical.from_codes(codes, categories=names), **kw)
    assert list(got.groups) == list(want.groups) and list(got.refused) == list(want.refused)
    for k, c in want.groups.items():
        assert got.groups[k].threshold == c.threshold and got.groups[k].normalisers == c.normalisers
    with pytest.raises(ValueError, match="missing label"):
        certify(stats, pd.Categorical.from_codes(np.where(codes == 2, -1, codes), categories=names), **kw)
