"""Mutants that survived the held-out sample (``--sample 15 --seed 18``) of the mutation run.

Each test checks a behaviour a plausible wrong implementation breaks, against an
independent reference (a closed form, numpy/scipy, or the documented definition).
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest

import tolstat
from table_helpers import group as _group, table as _table
from tolstat.calibration.bounds import Calibration, TailOptions
from tolstat.checks.checking import check_metrics
from tolstat.models.estimators import fit
from tolstat.models.estimators.evt import gpd_fit_zhang_stephens
from tolstat.models.estimators.orderstat import order_statistic_min_n
from tolstat.models.estimators.tail import group_topk
from tolstat.measure.metrics import as_array, error_metrics
from tolstat.models.scale import ScaleModel
from tolstat.models.statistics import get as get_statistic
from tolstat.calibration.table import load_table

from estimators_helpers import make_errors


# ------------------------------------------------------------------ bounds
def test_tail_options_provenance_uses_the_field_names():
    d = TailOptions(n_resamples=200, min_tail_runs=80, max_extrapolation=50.0, tail_fraction=0.2,
                    min_exceedances=40, bound="bootstrap").to_dict()
    assert d == {"n_resamples": 200, "min_tail_runs": 80, "max_extrapolation": 50.0, "tail_fraction": 0.2,
                 "min_exceedances": 40, "bound": "bootstrap"}


# ------------------------------------------------------------------ checks
def test_check_metrics_scores_elements_at_the_entry_dtype_not_the_metrics_dtype():
    # a baseline-relative scale: s = max(base_err, floor * eps(dtype) * ref_rms); the entry is
    # for float32 while the metrics were computed from float64 arrays (m.dtype = float64)
    g = _group("mm", "float32", "*", 4.0, statistic="max_score")
    g["scale"] = ScaleModel(form="baseline", baseline="base_err", floor=1.0).to_dict()
    ent = _table([g], "max_score").entry("mm", "float32", "*")
    a = np.array([1.0, 2.0, 3.0])
    e = np.array([1.0, 2.0 + 2.0**-20, 3.0])
    m = error_metrics(a, e)
    assert m.dtype == "float64"
    r = check_metrics(m, a, e, ent, {"base_err": 0.0})
    rms = math.sqrt(float(np.mean(e**2)))
    ref = 2.0**-20 / (float(np.finfo(np.float32).eps) * rms)  # about 3.9: the float64 eps would give 2e9
    assert r.statistics["max_score"] == pytest.approx(ref, rel=1e-12)
    assert r.passed


# ------------------------------------------------------------------ estimators._apply
def test_conformal_fit_of_a_group_with_a_single_run():
    # conformal rank ceil((n + 1)(1 - alpha)): alpha = 0.5 allows n = 1 (rank 1: the value itself)
    ds = make_errors({("a", "float32", "cpu"): [0.25], ("b", "float32", "cpu"): [0.5, 0.1, 0.3]})
    out = fit(ds, method="conformal", alpha=0.5)
    a = out.sel(op="a", dtype="float32", hardware="cpu")
    b = out.sel(op="b", dtype="float32", hardware="cpu")
    assert int(a["rank"]) == math.ceil(2 * 0.5) == 1 and float(a["threshold"]) == 0.25
    assert int(b["rank"]) == math.ceil(4 * 0.5) == 2 and float(b["threshold"]) == np.sort([0.5, 0.1, 0.3])[1]


# ------------------------------------------------------------------ estimators.evt
def _zhang_stephens_reference(x):
    """Zhang & Stephens (2009), written from the paper: returns (sigma, xi)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = x.size
    m = 20 + int(math.sqrt(n))
    xstar = x[int(n / 4 + 0.5) - 1]  # the first quartile
    if xstar <= 0:  # the quartile of a sample with many zeros: the mean instead
        xstar = x.mean()
    j = np.arange(1, m + 1)
    b = 1.0 / x[-1] + (1.0 - np.sqrt(m / (j - 0.5))) / (3.0 * xstar)
    k = -np.array([np.mean(np.log1p(-bj * x)) for bj in b])
    lik = n * (np.log(b / k) + k - 1.0)
    w = 1.0 / np.array([np.sum(np.exp(lik - lj)) for lj in lik])
    bhat = float(np.sum(b * w))
    khat = -float(np.mean(np.log1p(-bhat * x)))
    return khat / bhat, -khat


def test_zhang_stephens_with_a_zero_lower_quartile_uses_the_mean():
    rng = np.random.default_rng(1)
    y = np.concatenate([np.zeros(40), rng.exponential(2.0, 60)])  # 40% zeros: quartile 0
    got = gpd_fit_zhang_stephens(y)
    sigma, xi = _zhang_stephens_reference(y)
    assert got.sigma == pytest.approx(sigma, rel=1e-9)
    assert got.xi == pytest.approx(xi, rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------ estimators.orderstat
def _min_n_reference(p, g):
    """The documented definition: the smallest n >= 1 with 1 - p**n >= g (linear search)."""
    n = 1
    while 1.0 - p**n < g:
        n += 1
    return n


@pytest.mark.parametrize("p, g", [
    # g a few ulps above 1 - p**m: the closed-form start ceil(ln(1-g)/ln p - 1e-9) is m, one too low
    (0.5, 1.0 - 0.5**5 + 1e-15), (0.9, 1.0 - 0.9**20 + 1e-15), (0.99, 1.0 - 0.99**59 + 1e-15),
    # g = 1 - p**m near 1: ln(1-g) has lost digits and the start is m + 1, one too high
    (0.9, 1.0 - 0.9**144), (0.7, 1.0 - 0.7**53), (0.8, 1.0 - 0.8**76),
    # ordinary levels
    (0.95, 0.95), (0.99, 0.95), (0.5, 0.5),
])
def test_order_statistic_min_n_is_the_smallest_n_of_the_definition(p, g):
    assert order_statistic_min_n(p, g) == _min_n_reference(p, g)


# ------------------------------------------------------------------ estimators.tail
def test_group_topk_of_float32_values_chunked_keeps_float32():
    pytest.importorskip("dask")
    rng = np.random.default_rng(0)
    pairs = [(e.astype(np.float32), e) for e in rng.standard_normal((30, 16))]
    ds = tolstat.from_pairs(pairs, op="add", dtype="float32")
    s32 = ds["max_abs"].astype(np.float32)
    lazy = group_topk(ds, s32.chunk({"run": 4}), 5)  # 8 blocks: merged by selection
    assert lazy.dtype == np.float32
    ref = np.sort(s32.values)[::-1][:5]
    np.testing.assert_array_equal(lazy.values.ravel(), ref)


# ------------------------------------------------------------------ metrics
def test_as_array_of_a_dlpack_only_bfloat16_object_keeps_its_bits():
    torch = pytest.importorskip("torch")

    class DLPackOnly:  # exposes DLPack but no __array__ (and is not a torch object)
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    t = torch.tensor([1.0, 1.5, -2.0, 3.140625], dtype=torch.bfloat16)
    a = as_array(DLPackOnly(t), name="actual")
    assert str(a.dtype) == "bfloat16"
    np.testing.assert_array_equal(a.view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))


# ------------------------------------------------------------------ selection
def test_select_passes_its_seed_to_the_scale_fit_subsample():
    def kernel(x):
        return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)

    def ref(x):
        return x.astype(np.float16).astype(np.float64) * 3.0

    ds = tolstat.collect(kernel, ref, lambda r: tolstat.Inputs(args=(r.standard_normal((8, 8)),)),
                         op="mul3", dtype="float16", runs=120, hardware="cpu", seed=0, progress=False)
    opts = tolstat.models.ScaleOptions(max_points=200)  # 7680 elements: a seeded subsample of 200
    from tolstat.calibration.units import split_units

    models = {}
    for seed in (3, 4):
        t = tolstat.select(ds, fp_budget=0.05, form="allclose", scale=opts, seed=seed, method="order_statistic")
        ent = t.entry("mul3", "float16", "cpu")
        models[seed] = ent.scale.to_dict()
        # fitted on the engine's fitting part A (24 of 120 units, split with the same seed)
        n_fit = ent.certificate["n_fit"]
        assert n_fit == 24
        iA, _ = split_units(120, n_fit, seed)
        assert models[seed] == opts.fit(ds.isel(run=iA), "allclose", seed=seed).to_dict()
    assert models[3] != models[4]  # the subsample (and so the fit) depends on the seed


def _calibration(reason="order statistic"):
    tail = {"u": 1.0, "sigma": 0.5, "xi": 0.1, "zeta": 0.1, "gof_p": 0.4}
    return Calibration(threshold=2.0, estimate=1.5, budget=0.01, confidence=0.95, method="order_statistic",
                       reason=reason, n=400, tail=tail, top=np.array([3.0, 2.5]))


def test_stat_dict_keeps_tail_and_appends_to_the_reason():
    from tolstat.calibration.selection import _Plan, _stat_dict

    plan = _Plan(0.01, 0.95, "auto", ["max_abs"], "max_abs", None, ["max_abs"], 0.01, 0.95,
                 ("op", "dtype", "hardware"), "bonferroni", "raise")
    cal = _calibration()
    d = _stat_dict(cal, plan, 3)
    assert d["tail"] == cal.tail and d["top_scores"] == [3.0, 2.5]
    assert d["reason"] == ("order statistic; 3 run(s) had a truncated Pareto front: "
                           "their scores are lower bounds")
    assert _stat_dict(cal, plan, 0)["reason"] == "order statistic"


# ------------------------------------------------------------------ statistics
class _ZeroScale:
    """A user scale model (ScaleLike) whose scale is 0 at the second element."""

    def scale(self, ref_abs, cov=None, dtype=None):
        s = np.ones_like(np.asarray(ref_abs, dtype=np.float64))
        s[1] = 0.0
        return s


def test_max_score_elements_with_a_zero_scale_are_inf_without_a_warning():
    m = error_metrics(np.array([1.0, 2.5, 3.0]), np.array([1.0, 2.0, 3.5]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no divide-by-zero RuntimeWarning
        elem = get_statistic("max_score").elements(m, _ZeroScale(), {}, "float64")
    np.testing.assert_array_equal(elem, [0.0, np.inf, 0.5])


# ------------------------------------------------------------------ table
def test_load_table_of_a_netcdf_file_missing_a_variable_names_it(tmp_path):
    t = _table([_group("add", "float32", "gpu", 0.5)])
    p = os.fspath(tmp_path / "t.nc")
    t.data.drop_vars("reason").to_netcdf(p, engine="h5netcdf")
    with pytest.raises(ValueError, match=r"missing variable\(s\) \['reason'\]"):
        load_table(p)
