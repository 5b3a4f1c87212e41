"""One definition per statistic: calibration (datasets) and checks (pairs) agree."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import tolstat
from tolstat.measure import noise
from tolstat.measure.metrics import metric_covariates
from tolstat.models import statistics
from tolstat.models.statistics import RunScores, Statistic, get, pair_op_statistics
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
    return tolstat.from_pairs(pairs, op="mul3", dtype="float16", hardware="cpu", options=tolstat.CollectOptions(sample_size=4096))


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
    model = tolstat.models.scale.fit_scale(ds, "size_aware", tolstat.models.scale.ScaleOptions(size_covariate="K"))
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


def test_run_scores_is_a_record_not_a_pair(ds):
    res = tolstat.models.scale.run_scores(ds, None, "max_abs")
    assert res.scores.shape == (ds.sizes["run"],) and res.n_inexact == 0
    with pytest.raises(TypeError):
        iter(res)


# --------------------------------------------------------------------------- definitions
# Run scores, values and allowances against numpy definitions.


def _pairs(seed=0, runs=5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(runs):
        e = rng.standard_normal(64) * 3.0
        a = (e + rng.normal(0.01, 1e-3, 64)).astype(np.float32)  # biased: bias score >> 1
        out.append((a, e))
    return out


@pytest.mark.parametrize("name", ["max_abs", "max_rel", "bias"])
def test_run_scores_of_the_plain_statistics_are_the_numpy_definitions(name):
    pairs = _pairs()
    ds = tolstat.from_pairs(pairs, op="add", dtype="float32", options=tolstat.CollectOptions(progress=False))
    res = get(name).run_scores(ds)
    scores, n_inexact = res.scores, res.n_inexact
    d = [a.astype(np.float64) - e for a, e in pairs]
    if name == "max_abs":
        ref = [np.max(np.abs(x)) for x in d]
    elif name == "max_rel":
        ref = [np.max(np.abs(x) / np.maximum(np.abs(e), np.finfo(np.float32).tiny)) for x, (_, e) in zip(d, pairs)]
    else:
        ref = [math.sqrt(x.size) * abs(x.mean()) / np.abs(x).mean() for x in d]
    np.testing.assert_allclose(scores, ref, rtol=1e-12, atol=0)
    assert n_inexact == 0 and isinstance(get(name).run_scores(ds), RunScores)


def _custom(kind, by_dtype):
    if kind == "run":
        return Statistic(name="t", kind="run", unit="-", description="-", needs=(),
                         from_dataset=lambda ds, model=None: RunScores(np.zeros(1)),
                         from_metrics=lambda m, model, cov, dt: by_dtype[dt])
    return Statistic(name="t", kind="max", unit="-", description="-", needs=(),
                     from_dataset=lambda ds, model=None: RunScores(np.zeros(1)),
                     element_scores=lambda m, model, cov, dt: np.full(m.abs.shape, by_dtype[dt]))


@pytest.mark.parametrize("kind", ["run", "max"])
def test_value_passes_the_dtype_and_defaults_to_the_metrics_dtype(kind):
    s = _custom(kind, {"float16": 16.0, "float32": 32.0})
    m = error_metrics(np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0]))
    assert m.dtype == "float32"
    assert s.value(m) == 32.0
    assert s.value(m, dtype="float16") == 16.0


def test_statistic_kinds_and_their_required_callables():
    fd = lambda ds, model=None: RunScores(np.zeros(1))  # noqa: E731
    Statistic(name="m", kind="max", unit="-", description="-", needs=(), from_dataset=fd,
              element_scores=lambda m, model, cov, dt: m.abs)  # a max statistic needs no from_metrics
    with pytest.raises(ValueError, match="run statistic 't' needs from_metrics"):
        Statistic(name="t", kind="run", unit="-", description="-", needs=(), from_dataset=fd)
    with pytest.raises(ValueError, match="run statistic 's' needs from_metrics"):
        Statistic(name="s", kind="score", unit="-", description="-", needs=(), from_dataset=fd)
    with pytest.raises(ValueError, match="max statistic 'x' needs element_scores"):
        Statistic(name="x", kind="max", unit="-", description="-", needs=(), from_dataset=fd)
    with pytest.raises(ValueError, match="Statistic.kind must be"):
        Statistic(name="y", kind="mean", unit="-", description="-", needs=(), from_dataset=fd)


def _matmul_pairs(n=4, seed=5, exact_runs=()):
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        a = rng.standard_normal((8, 32)).astype(np.float16)
        b = rng.standard_normal((32, 16)).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        out = ref.astype(np.float16)  # correctly rounded
        if i not in exact_runs:  # accumulated in float16: not correctly rounded
            out = np.zeros((8, 16), np.float16)
            for k in range(32):
                out = (out + a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float16)
        mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
        pairs.append((out, ref, mag, {}, {"K": 32.0}))
    return pairs


def test_op_score_of_a_dataset_is_max_of_statistic_over_normaliser_with_exact_runs_zero():
    pairs = _matmul_pairs(exact_runs=(1,))
    ds = tolstat.from_pairs(pairs, op="matmul", dtype="float16", options=tolstat.CollectOptions(progress=False))
    q = {"op_max": 2.0, "op_rms": 0.5}
    res = get("op_score").run_scores(ds, {"normalisers": q})
    scores, n_inexact = res.scores, res.n_inexact
    direct = [noise.run_statistics(o, r, dtype="float16", magnitude=m, K=32) for o, r, m, _, _ in pairs]
    ref = [max(d["op_max"] / 2.0, d["op_rms"] / 0.5) for d in direct]
    ref[1] = 0.0  # a correctly rounded run scores 0
    np.testing.assert_allclose(scores, ref, rtol=1e-12, atol=0)
    assert scores[0] > 0 and n_inexact == 0
    with pytest.raises(ValueError, match="statistic 'op_score' needs a noise-scale model"):
        get("op_score").run_scores(ds)


def test_pair_op_statistics_passes_rowwise():
    out, ref, mag, _, _ = _matmul_pairs(n=1)[0]
    m = error_metrics(out, ref, dtype="float16")
    plain = pair_op_statistics(out, ref, m, dtype="float16", magnitude=mag, K=32.0)
    rows = pair_op_statistics(out, ref, m, dtype="float16", magnitude=mag, K=32.0, rowwise=True)
    want = noise.record_statistics(out, ref, dtype="float16", magnitude=mag, K=32.0, rowwise=True)
    assert rows == want and rows != plain


def test_max_score_elements_are_error_over_scale_and_zero_for_exact_elements():
    from tolstat.models.scale import ScaleModel

    model = ScaleModel(form="allclose", atol=0.5, rtol=0.25)
    e = np.array([0.0, 2.0, 4.0, 1.0])
    a = np.array([0.0, 3.0, 4.0, 2.0])  # errors 0, 1 (exactly), 0, 1
    m = error_metrics(a, e)
    s = 0.5 + 0.25 * np.abs(e)
    np.testing.assert_array_equal(get("max_score").elements(m, model), np.where(a == e, 0.0, np.abs(a - e) / s))
    assert get("max_score").value(m, model) == 1.0 / 0.75
    with pytest.raises(ValueError, match="statistic 'max_score' needs a noise-scale model"):
        get("max_score").elements(m)


def test_allowed_passes_the_dtype_and_defaults_to_the_metrics_dtype():
    s = Statistic(name="t", kind="max", unit="-", description="-", needs=(),
                  from_dataset=lambda ds, model=None: RunScores(np.zeros(1)),
                  element_scores=lambda m, model, cov, dt: m.abs,
                  allowance=lambda m, c, model, cov, dt: np.full(m.abs.shape, c * {"float16": 2.0, "float32": 3.0}[dt]))
    m = error_metrics(np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0]))
    np.testing.assert_array_equal(s.allowed(m, 0.5), [1.5, 1.5])
    np.testing.assert_array_equal(s.allowed(m, 0.5, dtype="float16"), [1.0, 1.0])
    assert get("max_ulp").allowed(m, 0.5) is None  # no |d| form


def test_max_score_allclose_needs_a_model_and_scales_its_pair():
    from tolstat.models.scale import ScaleModel

    with pytest.raises(ValueError, match="statistic 'max_score' needs a noise-scale model"):
        get("max_score").allclose_pair(2.0, "float32")
    at, rt = get("max_score").allclose_pair(2.0, "float32", ScaleModel(form="allclose", atol=0.5, rtol=0.25))
    assert (at, rt) == (1.0, 0.5)


def test_max_score_run_scores_name_the_missing_covariate_and_those_present():
    from tolstat.models.scale import ScaleModel

    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal(8).astype(np.float32), rng.standard_normal(8), None, {}, {"K": 1.0, "M": 2.0})
             for _ in range(3)]
    ds = tolstat.from_pairs(pairs, op="x", dtype="float32", options=tolstat.CollectOptions(progress=False))
    model = ScaleModel(form="allclose", atol=1e-7, linear={"N": 1.0})
    with pytest.raises(ValueError, match=r"covariate 'N' is not in the dataset \(have \['ref_max_abs', 'ref_rms', "
                                         r"'n_elements', 'K', 'M'\]\)"):
        get("max_score").run_scores(ds, model)


def test_max_score_run_scores_ignore_the_padding_of_smaller_runs():
    from tolstat.models.scale import ScaleModel

    rng = np.random.default_rng(2)
    pairs = []
    for size in (8, 4, 6):  # unequal runs: the smaller ones are NaN-padded in the sample
        e = rng.standard_normal(size)
        pairs.append(((e + rng.normal(0, 1e-3, size)).astype(np.float32), e))
    ds = tolstat.from_pairs(pairs, op="x", dtype="float32", options=tolstat.CollectOptions(progress=False))
    assert ds["n_sample"].values.tolist() == [8, 4, 6]
    model = ScaleModel(form="allclose", atol=1e-4, rtol=1e-3)
    scores = get("max_score").run_scores(ds, model).scores
    ref = [np.max(np.abs(a.astype(np.float64) - e) / (1e-4 + 1e-3 * np.abs(e))) for a, e in pairs]
    np.testing.assert_allclose(scores, ref, rtol=1e-12, atol=0)


def test_plain_run_scores_factory():
    # the registry builds its from_dataset callables at import; this calls the factory itself
    from tolstat.models.statistics import _plain_run

    ds = tolstat.from_pairs(_pairs(), op="add", dtype="float32", options=tolstat.CollectOptions(progress=False))
    res = _plain_run("max_abs")(ds)
    np.testing.assert_array_equal(res.scores, ds["max_abs"].values.astype(np.float64))
    assert res.n_inexact == 0 and res.scores.dtype == np.float64


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
        elem = get("max_score").elements(m, _ZeroScale(), {}, "float64")
    np.testing.assert_array_equal(elem, [0.0, np.inf, 0.5])


def test_max_score_of_an_exact_element_with_zero_scale_is_zero_without_a_warning():
    m = error_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.5]))  # element 1 exact: 0 / 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 'invalid value' RuntimeWarning
        elem = get("max_score").elements(m, _ZeroScale(), {}, "float64")
    np.testing.assert_array_equal(elem, [0.0, 0.0, 0.5])


def test_a_non_finite_output_scores_inf_in_calibration_as_in_a_check_even_where_its_scale_overflows():
    """A run with one non-finite output element has max_score inf from the dataset, as the
    pair's value, also where the noise scale at that element is inf (inf / inf is no score)."""
    from tolstat.models.scale import ScaleModel

    rng = np.random.default_rng(5)
    pairs = []
    for i in range(6):
        r = rng.uniform(2.0, 4.0, 16).astype(np.float16).astype(np.float64)
        k = r.astype(np.float16)
        k[3] = np.nextafter(k[3], np.float16(np.inf))
        if i in (1, 4):
            k[7] = np.inf if i == 1 else -np.inf  # exactly one non-finite element
        pairs.append((k, r))
    ds = tolstat.from_pairs(pairs, op="mul3", dtype="float16", hardware="cpu",
                            options=tolstat.CollectOptions(progress=False))
    assert ds["n_nonfinite"].values.tolist() == [0, 1, 0, 0, 1, 0]
    st = get("max_score")
    for model in (ScaleModel(form="allclose", atol=1e-3, rtol=1e-3),
                  ScaleModel(form="allclose", atol=0.0, rtol=1e308)):  # s = rtol * |ref| = inf
        with np.errstate(over="ignore"):
            from_ds = st.run_scores(ds, model).scores
            from_pairs = [st.value(error_metrics(k, r, dtype="float16"), model, {}, "float16") for k, r in pairs]
        np.testing.assert_array_equal(from_ds, from_pairs)
        assert from_ds[1] == from_ds[4] == np.inf and np.isfinite(from_ds[[0, 2, 3, 5]]).all()


@pytest.fixture
def covariate_statistic():
    """A user statistic of kind "run" that reads a run covariate and the dtype (removed after the test)."""
    name = "weighted_max_abs"

    def from_metrics(m, model, cov, dtype):
        return float(cov["w"]) * float(np.max(m.abs)) * (2.0 if dtype == "float16" else 1.0)

    statistics.register(Statistic(
        name=name, kind="run", unit="output units", description="2 w max|d| (float16)", needs=("max_abs",),
        from_dataset=lambda ds, model: RunScores(np.asarray(ds["max_abs"].values, dtype=np.float64), 0),
        from_metrics=from_metrics))
    try:
        yield name
    finally:
        statistics.REGISTRY.pop(name)


def test_a_registered_run_statistic_is_checked_with_the_check_covariates_and_dtype(covariate_statistic):
    from table_helpers import group, stat, table

    name = covariate_statistic
    t = table([group("mul3", "float16", "*", 1.0, extra={name: stat(0.01)})], extra=(name,))
    x = np.random.default_rng(2).standard_normal(16)
    k = (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)
    r = x.astype(np.float16).astype(np.float64) * 3.0
    k[5] = np.nextafter(k[5], np.float16(np.inf))  # not correctly rounded (that would be 0)
    d = float(np.max(np.abs(k.astype(np.float64) - r)))
    assert d > 0
    for w, passes in ((0.25 * 0.01 / d, True), (4.0 * 0.01 / d, False)):
        res = tolstat.check(k, r, op="mul3", dtype="float16", table=t, covariates={"w": w})
        assert res.statistics[name] == 2.0 * w * d
        assert res.passed == passes and (name in res.failed) == (not passes)


def test_bias_score_is_the_float64_formula_whatever_the_dtype_of_the_element_count():
    """``sqrt(N) * |mean(d)| / mean(|d|)`` in float64: an element count held in a narrow
    dtype (a float32 or int16 column, a uint8 count) gives the same score as an int."""
    want = math.sqrt(3.0) * 0.5 / 1.0
    assert statistics.bias_score(-0.5, 1.0, 3) == want
    for n in (np.float32(3), np.int16(3)):
        got = statistics.bias_score(-0.5, 1.0, n)
        assert got.dtype == np.float64 and got == want, n.dtype
    got = statistics.bias_score(-0.5, 1.0, np.array([3, 200], dtype=np.uint8))
    np.testing.assert_array_equal(got, [want, math.sqrt(200.0) * 0.5])
    # all errors 0: 0; a non-finite mean error: inf
    np.testing.assert_array_equal(statistics.bias_score([0.0, 0.5], [0.0, np.inf], np.int16(4)), [0.0, np.inf])
