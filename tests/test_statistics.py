"""One definition per statistic: calibration (datasets) and checks (pairs) agree."""

from __future__ import annotations

import numpy as np
import pytest

import tolstat
from tolstat.measure.metrics import metric_covariates
from tolstat.models import statistics
from tolstat.measure.metrics import error_metrics


@pytest.fixture(scope="module")
def pairs():
    rng = np.random.default_rng(3)
    out = []
    for i in range(40):
        x = rng.standard_normal((8, 16)) * (1 + i % 4)
        k = (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)
        r = x.astype(np.float16).astype(np.float64) * 3.0
        out.append((k, r, {}, {"K": float(16 + i % 3)}))
    return out


@pytest.fixture(scope="module")
def ds(pairs):
    return tolstat.from_pairs(pairs, op="mul3", dtype="float16", hardware="cpu", sample_size=4096)


def test_registry_names_and_fields():
    assert statistics.STATISTICS == ("max_abs", "max_ulp", "max_rel", "max_score", "bias", "op_score")
    assert statistics.MAX_STATISTICS == ("max_abs", "max_ulp", "max_rel")
    for name in statistics.STATISTICS:
        s = statistics.get(name)
        assert s.name == name and s.unit and s.description and s.needs
    with pytest.raises(ValueError, match="unknown statistic 'nope'"):
        statistics.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        statistics.register(statistics.get("max_abs"))
    with pytest.raises(ValueError, match="needs element_scores"):
        statistics.Statistic("x", "max", "u", "d", ("max_abs",), from_dataset=lambda ds, m: None)


@pytest.mark.parametrize("name", ["max_abs", "max_ulp", "max_rel", "bias"])
def test_dataset_value_equals_pair_value(name, pairs, ds):
    """The calibration value of each run equals the check value of the same pair."""
    st = statistics.get(name)
    from_ds = st.run_scores(ds).scores
    from_pairs = [st.value(error_metrics(k, r, dtype="float16")) for k, r, _, _ in pairs]
    np.testing.assert_allclose(from_ds, from_pairs, rtol=1e-12, atol=0)


def test_max_score_dataset_equals_pair(pairs, ds):
    model = tolstat.models.scale.fit_scale(ds, "size_aware", size_covariate="K")
    st = statistics.get("max_score")
    from_ds = st.run_scores(ds, model).scores
    from_pairs = []
    for k, r, _, cov in pairs:
        m = error_metrics(k, r, dtype="float16")
        from_pairs.append(st.value(m, model, metric_covariates(m, cov), "float16"))
    np.testing.assert_allclose(from_ds, from_pairs, rtol=1e-12)
    with pytest.raises(ValueError, match="needs a noise-scale model"):
        st.run_scores(ds, None)


def test_metric_covariates_match_dataset(pairs, ds):
    for i, (k, r, _, _) in enumerate(pairs[:5]):
        cov = metric_covariates(error_metrics(k, r, dtype="float16"), {"K": 2.0})
        assert cov["ref_rms"] == float(ds.ref_rms.values[i])
        assert cov["ref_max_abs"] == float(ds.ref_max_abs.values[i])
        assert cov["K"] == 2.0


def test_check_uses_the_registry(ds, mul3):
    """A check's statistic equals the registry's value and the table's allclose pair."""
    t = tolstat.select(ds, form=None, fp_budget=0.3, statistic=("max_rel", "bias"))
    k, ref = mul3
    x = np.random.default_rng(9).standard_normal((8, 16))
    r = tolstat.check(k(x), ref(x), op="mul3", dtype="float16", table=t)
    m = error_metrics(k(x), ref(x), dtype="float16")
    from tolstat.calibration.decision import pair_value

    # the decision values: the registry's statistics, 0 for a correctly rounded output
    assert r.statistics["max_rel"] == pair_value(m, "max_rel")
    assert r.statistics["bias"] == pair_value(m, "bias")
    if not r.correctly_rounded:
        assert r.statistics["max_rel"] == statistics.get("max_rel").value(m)
    c = t.entry("mul3", "float16").statistics["max_rel"].threshold
    assert (r.atol, r.rtol) == statistics.get("max_rel").allclose_pair(c, "float16")


def test_run_scores_unpacks(ds):
    res = tolstat.models.scale.run_scores(ds, None, "max_abs")
    scores, n_inexact = res
    assert scores is res.scores and n_inexact == 0
