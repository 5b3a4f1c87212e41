"""Mutants of ``tolstat.calibration.engine`` that survived the held-out sample (``--sample 40 --seed 31``).

Each test checks a documented behaviour of the certified thresholds against an
independent reference: the documented definition (the seeded split of
:func:`tolstat.calibration.units.split_units`, "a third of a small group's units" for own pools,
the resolution rule of the normalisers), a closed form (the smallest number of inexact
units that bounds a median at the stated confidence), or the stated wording of a
guarantee and of the errors that name their argument.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tolstat.calibration.certificate import UnreachableThresholdWarning
from tolstat.calibration.engine import certify
from tolstat.calibration.units import collapse, fit_normalisers


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


# ------------------------------------------------------------------ errors name the argument
def test_stats_errors_name_the_stats_argument():
    with pytest.raises(ValueError, match=r"^stats: statistics have different numbers of runs"):
        collapse({"a": [1.0, 2.0], "b": [1.0]})


def test_pool_alpha_is_validated_by_name():
    with pytest.raises(ValueError, match=r"^pool_alpha must lie strictly between 0 and 1, got 0\.0"):
        certify({"m": np.ones(400)}, fp_budget=0.01, pool_alpha=0.0)


# ------------------------------------------------------------------ normalisers and the floor
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


# ------------------------------------------------------------------ unreachable statistics
def test_one_unreachable_statistic_is_not_reported_as_a_check_that_never_fails():
    rng = np.random.default_rng(6)
    t = {"m": np.abs(rng.standard_normal(400)), "bias": np.abs(rng.standard_normal(400))}
    with pytest.warns(UnreachableThresholdWarning,
                      match=r"bias can reach .*\): those statistics can never fail the check$") as rec:
        c = certify(t, fp_budget=0.01, upper={"bias": 0.5})["all"]
    assert not any("the check can never fail" in str(w.message) for w in rec)
    assert "never_fails" not in c.flags and "those statistics can never fail the check" in c.reason


# ------------------------------------------------------------------ own pools
def test_own_pool_fits_a_third_of_a_small_groups_units_on_its_inexact_units():
    """``pool_normalisers="own"``: a small group's normalisers come from a third of its
    units (docs/guarantees.md), its inexact ones only, whatever ``fit_size`` would give
    (20 units of 100 here), and even with a quantile below the maximum."""
    rng = np.random.default_rng(41)
    m, lab = _own_pool(rng, exact_share=0.4)
    st = {"T0": m[:, 0], "T1": m[:, 1]}
    res = certify(st, lab, fp_budget=0.01, pool_normalisers="own", norm_quantile=0.5, on_refusal="record")
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
    res = certify({"T0": m[:, 0]}, lab, fp_budget=0.01, pool_normalisers="own", on_refusal="record")
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
    res = certify({"T0": m[:, 0], "T1": m[:, 1]}, lab, fp_budget=0.01, pool_normalisers="own",
                  on_refusal="record")
    assert set(res.refused) == {"sparse"} and len(res) == 10
    err = res.refused["sparse"]
    assert err.group == "sparse" and str(err).startswith("group sparse: 67 calibration units < 299 needed")
    assert "too few inexact units to bound its level" in str(err)
