"""``inputs=`` and ``params=`` everywhere: the operator statistics from the op's own arguments.

End to end through the public API on torch CPU kernels: ``from_pairs`` with ``inputs``
items -> the default ``select`` (operator form) -> ``check(..., inputs=, params=)``, the
same numbers as the hand-computed magnitude and ``K``; ``collect`` of a known op; the
pytest plugin's fixture and recorder; and the errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import tolstat

torch = pytest.importorskip("torch")
F = torch.nn.functional

HW = "cpu:test"
OPTS = tolstat.CollectOptions(sample_size=64, progress=False)
EPS = 1e-5


# ----------------------------------------------------------------------- kernels
def _splitk(a, b, chunk=16):
    """A correct fp16 matmul: split-K with float16 partial sums, so that its outputs carry
    rounding noise (one float32 pass would round most outputs correctly)."""
    m, k = a.shape
    parts = torch.bmm(a.float().reshape(m, k // chunk, chunk).transpose(0, 1),
                      b.float().reshape(k // chunk, chunk, -1)).half()
    out = parts[0]
    for p in parts[1:]:
        out = (out.float() + p.float()).half()
    return out


def _mm(g, k, bug=1.0):
    """A correct (``bug=1``) fp16 matmul and its float64 reference."""
    a = torch.randn(24, k, generator=g).half()
    b = torch.randn(k, 16, generator=g).half()
    out = (_splitk(a, b).float() * bug).half()
    return a, b, out, a.double() @ b.double()


def _same_stats(x, y):
    """The statistics of two check results are the same numbers (NaN where both are NaN)."""
    assert x.keys() == y.keys()
    for k in x:
        assert x[k] == y[k] or (np.isnan(x[k]) and np.isnan(y[k])), (k, x[k], y[k])


def _ln(g, n, eps=EPS, kernel_eps=None):
    """An fp16 layer_norm (float32 compute) and its float64 reference; ``kernel_eps``: a bug."""
    x = (torch.randn(8, n, generator=g) * 2 + 0.5).half()
    w = (1 + 0.1 * torch.randn(n, generator=g)).half()
    b = (0.1 * torch.randn(n, generator=g)).half()
    ke = eps if kernel_eps is None else kernel_eps
    out = F.layer_norm(x.float(), (n,), w.float(), b.float(), ke).half()
    ref = F.layer_norm(x.double(), (n,), w.double(), b.double(), eps)
    return (x, (n,), w, b), {"eps": eps}, out, ref


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Small torch kernels run ~30x faster on one thread than oversubscribed on shared cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _abs64(t):
    return np.abs(t.double().numpy())


@pytest.fixture(scope="module")
def mm_pairs():
    g = torch.Generator().manual_seed(0)
    return [_mm(g, int(k)) for k in np.resize([16, 64, 256], 300)]


@pytest.fixture(scope="module")
def mm_data(mm_pairs):
    items = [{"actual": out, "expected": ref, "inputs": (a, b)} for a, b, out, ref in mm_pairs]
    return tolstat.from_pairs(items, op="matmul", dtype="float16", hardware=HW, options=OPTS)


@pytest.fixture(scope="module")
def mm_table(mm_data):
    return tolstat.select(mm_data, fp_budget=0.01)


@pytest.fixture(scope="module")
def ln_table():
    g = torch.Generator().manual_seed(1)
    items = []
    for n in np.resize([32, 128], 120):
        inputs, params, out, ref = _ln(g, int(n))
        items.append({"actual": out, "expected": ref, "inputs": inputs, "params": params})
    ds = tolstat.from_pairs(items, op="layer_norm", dtype="float16", hardware=HW, options=OPTS)
    assert "op_row_rms_max" in ds and np.isfinite(ds["op_row_rms_max"].values).all()  # row-wise
    return tolstat.select(ds, fp_budget=0.05)  # 120 units certify 5%


# ----------------------------------------------------------------------- from_pairs -> select -> check
def test_from_pairs_with_inputs_stores_operator_statistics_and_K(mm_data, mm_pairs):
    assert "op_max" in mm_data and np.isfinite(mm_data["op_max"].values).all()
    assert list(mm_data["K"].values[:3]) == [16.0, 64.0, 256.0]
    # exactly the dataset of hand-computed magnitudes and K
    hand = [{"actual": out, "expected": ref, "magnitude": _abs64(a) @ _abs64(b),
             "covariates": {"K": a.shape[1]}} for a, b, out, ref in mm_pairs]
    ds = tolstat.from_pairs(hand, op="matmul", dtype="float16", hardware=HW, options=OPTS)
    for name in [*tolstat.measure.noise.statistic_names("matmul"), "K", "max_abs"]:
        np.testing.assert_array_equal(ds[name].values, mm_data[name].values, err_msg=name)


def test_default_select_uses_the_operator_form(mm_table, ln_table):
    for table, op in ((mm_table, "matmul"), (ln_table, "layer_norm")):
        ent = table.entry(op, "float16", HW)
        assert ent.operator and ent.max_statistic == "op_score", op
        assert ent.certificate["form"] == "operator" and ent.certificate["covariates"] == ["K"]
    assert ln_table.entry("layer_norm", "float16", HW).certificate["rowwise"] is True
    assert mm_table.entry("matmul", "float16", HW).certificate["rowwise"] is False


def test_matmul_check_with_inputs_passes_correct_and_fails_buggy_runs(mm_table):
    g = torch.Generator().manual_seed(100)
    for k in (16, 64, 256, 64, 16, 256):
        a, b, out, ref = _mm(g, k)
        r = tolstat.check(out, ref, op="matmul", dtype="float16", table=mm_table, inputs=(a, b), hardware=HW)
        assert r.passed, r.message()
    a, b, out, ref = _mm(g, 64, bug=1.01)
    r = tolstat.check(out, ref, op="matmul", dtype="float16", table=mm_table, inputs=(a, b), hardware=HW)
    assert not r.passed
    with pytest.raises(AssertionError, match="FAILED"):
        tolstat.assert_close(out, ref, op="matmul", dtype="float16", table=mm_table, inputs=(a, b), hardware=HW)


def test_check_with_inputs_compares_the_hand_computed_values_exactly(mm_table):
    g = torch.Generator().manual_seed(5)
    for bug in (1.0, 1.01):
        a, b, out, ref = _mm(g, 256, bug=bug)
        r = tolstat.check(out, ref, op="matmul", dtype="float16", table=mm_table, inputs=(a, b), hardware=HW)
        hand = tolstat.check(out, ref, op="matmul", dtype="float16", table=mm_table, hardware=HW,
                             covariates={"K": 256}, options=tolstat.CheckOptions(magnitude=_abs64(a) @ _abs64(b)))
        assert not r.correctly_rounded and r.statistics["op_max"] > 0
        _same_stats(r.statistics, hand.statistics)
        assert r.passed == hand.passed == (bug == 1.0)
        assert (r.worst_index, r.worst_allowed, r.n_exceeding) == (hand.worst_index, hand.worst_allowed,
                                                                   hand.n_exceeding)
        # the |ref| scale is another convention than the table's (|A| @ |B| from the inputs): refused
        with pytest.raises(ValueError, match="another scale"):
            tolstat.check(out, ref, op="matmul", dtype="float16", table=mm_table, hardware=HW,
                          covariates={"K": 256}, options=tolstat.CheckOptions(magnitude="ref"))


def test_layer_norm_check_with_inputs_and_params(ln_table):
    g = torch.Generator().manual_seed(200)
    for n in (32, 128, 32):
        inputs, params, out, ref = _ln(g, n)
        r = tolstat.check(out, ref, op="layer_norm", dtype="float16", table=ln_table, inputs=inputs,
                          params=params, hardware=HW)
        assert r.passed, r.message()
    inputs, params, out, ref = _ln(g, 128, kernel_eps=1e-1)  # eps moved
    r = tolstat.check(out, ref, op="layer_norm", dtype="float16", table=ln_table, inputs=inputs, params=params,
                      hardware=HW)
    assert not r.passed


def test_scale_form_takes_K_from_the_inputs(mm_data, mm_pairs):
    table = tolstat.select(mm_data, fp_budget=0.05, form="size_aware")
    assert "K" in table.entry("matmul", "float16", HW).scale.covariates
    a, b, out, ref = mm_pairs[2]
    r = tolstat.check(out, ref, op="matmul", dtype="float16", table=table, inputs=(a, b), hardware=HW)
    hand = tolstat.check(out, ref, op="matmul", dtype="float16", table=table, covariates={"K": 256}, hardware=HW)
    _same_stats(r.statistics, hand.statistics)
    assert r.passed == hand.passed
    with pytest.raises(ValueError, match="K"):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=table, hardware=HW)


# ----------------------------------------------------------------------- collect
def _mm_kernel(a, b):
    return _splitk(a, b)


def _mm_reference(a, b):
    return a.double() @ b.double()


def _mm_inputs(rng):
    k = int(rng.choice([16, 64]))
    return tolstat.Inputs(args=(torch.from_numpy(rng.standard_normal((12, k))).half(),
                                torch.from_numpy(rng.standard_normal((k, 8))).half()))


def _mm_hand_inputs(rng):
    inp = _mm_inputs(rng)
    return tolstat.Inputs(args=inp.args, covariates={"K": inp.args[0].shape[1]})


def _mm_magnitude(a, b):
    return _abs64(a) @ _abs64(b)


def test_collect_of_a_known_op_derives_the_operator_statistics(tmp_path):
    kw = dict(op="matmul", dtype="float16", runs=6, hardware=HW)
    auto = tolstat.collect(_mm_kernel, _mm_reference, _mm_inputs, options=OPTS, **kw)
    hand = tolstat.collect(_mm_kernel, _mm_reference, _mm_hand_inputs, **kw,
                           options=tolstat.CollectOptions(sample_size=64, progress=False, magnitude=_mm_magnitude))
    names = [*tolstat.measure.noise.statistic_names("matmul"), "K", "max_abs", "sample_abs"]
    assert np.isfinite(auto["op_max"].values).all()
    for name in names:
        np.testing.assert_array_equal(auto[name].values, hand[name].values, err_msg=name)
    streamed = tolstat.collect(_mm_kernel, _mm_reference, _mm_inputs, options=OPTS,
                               store=tmp_path / "mm.zarr", **kw)
    for name in names:
        np.testing.assert_array_equal(streamed[name].values, auto[name].values, err_msg=name)
    off = tolstat.collect(_mm_kernel, _mm_reference, _mm_inputs, **kw,
                          options=tolstat.CollectOptions(sample_size=64, progress=False, op_model=False))
    assert "op_max" not in off and "K" not in off


def test_collect_of_an_unknown_op_keeps_plain_runs_unless_asked():
    kw = dict(op="my_unknown_op", dtype="float16", runs=2, hardware=HW)
    ds = tolstat.collect(_mm_kernel, _mm_reference, _mm_inputs, options=OPTS, **kw)
    assert "op_max" not in ds and ds.sizes["run"] == 2
    with pytest.raises(KeyError, match=r"tolstat\.ops\.register"):
        tolstat.collect(_mm_kernel, _mm_reference, _mm_inputs, **kw,
                        options=tolstat.CollectOptions(progress=False, op_model=True))
    with pytest.raises(ValueError, match="op_model=True.*magnitude"):
        tolstat.collect(_mm_kernel, _mm_reference, _mm_inputs, op="matmul", dtype="float16", runs=2,
                        options=tolstat.CollectOptions(progress=False, op_model=True, magnitude="ref"))
    with pytest.raises(TypeError, match="CollectOptions.op_model must be True, False or None, got 'yes'"):
        tolstat.CollectOptions(op_model="yes")


# ----------------------------------------------------------------------- errors
def test_errors_name_the_argument(mm_table, mm_pairs):
    a, b, out, ref = mm_pairs[1]
    kw = dict(op="matmul", dtype="float16", table=mm_table, hardware=HW)
    with pytest.raises(ValueError, match=r"pass inputs= \(and params=\).*CheckOptions\(magnitude=\.\.\.\)"):
        tolstat.check(out, ref, **kw)
    with pytest.raises(ValueError, match="either inputs=.*or CheckOptions\\(magnitude=...\\), not both"):
        tolstat.check(out, ref, inputs=(a, b), options=tolstat.CheckOptions(magnitude=_abs64(a) @ _abs64(b)), **kw)
    with pytest.raises(ValueError, match=r"covariates K=65 but the inputs of 'matmul' give K=64"):
        tolstat.check(out, ref, inputs=(a, b), covariates={"K": 65}, **kw)
    assert tolstat.check(out, ref, inputs=(a, b), covariates={"K": 64}, **kw).passed  # agreeing K is fine
    with pytest.raises(ValueError, match="params=.*needs inputs="):
        tolstat.check(out, ref, params={"eps": 1.0}, **kw)
    with pytest.raises(TypeError, match="inputs must be a tuple or list"):
        tolstat.check(out, ref, inputs=a, **kw)
    with pytest.raises(ValueError, match=r"inputs of 'matmul' give an output of shape \(24, 24\)"):
        tolstat.check(out, ref, inputs=(a, a.T), **kw)
    with pytest.raises(TypeError, match="options must be a tolstat.CheckOptions"):
        tolstat.check(out, ref, options={"allow_nan": True}, **kw)


def test_unknown_op_with_inputs_names_how_to_register(mm_pairs):
    a, b, out, ref = mm_pairs[0]
    with pytest.raises(KeyError, match=r"tolstat\.ops\.register"):
        tolstat.from_pairs([{"actual": out, "expected": ref, "inputs": (a, b)}], op="my_mm", dtype="float16")


def test_unknown_op_with_inputs_in_check_raises_whatever_the_form(mm_pairs):
    from table_helpers import group, table

    a, b, out, ref = mm_pairs[0]
    t = table([group("my_mm", "float16", HW, 1.0, top=[1.0])])  # a plain max_abs group
    assert tolstat.check(out, ref, op="my_mm", dtype="float16", table=t, hardware=HW).passed
    with pytest.raises(KeyError, match=r"tolstat\.ops\.register"):
        tolstat.check(out, ref, op="my_mm", dtype="float16", table=t, hardware=HW, inputs=(a, b))


def test_from_pairs_refuses_mixed_and_contradictory_items(mm_pairs):
    (a, b, out, ref), (a2, b2, out2, ref2) = mm_pairs[:2]
    kw = dict(op="matmul", dtype="float16", options=OPTS)
    with_inputs = {"actual": out, "expected": ref, "inputs": (a, b)}
    with pytest.raises(ValueError, match=r"pair 1 has no operator statistics but pair 0 has them: give a "
                                         r"magnitude for every run or for none \(inputs give one\)"):
        tolstat.from_pairs([with_inputs, {"actual": out2, "expected": ref2}], **kw)
    with pytest.raises(ValueError, match="pair 0: give 'inputs'.*or 'magnitude', not both"):
        tolstat.from_pairs([{**with_inputs, "magnitude": _abs64(a) @ _abs64(b)}], **kw)
    with pytest.raises(ValueError, match=r"run 0: covariate K=3 but the inputs of 'matmul' give K=16"):
        tolstat.from_pairs([{**with_inputs, "covariates": {"K": 3}}], **kw)
    with pytest.raises(ValueError, match="pair 0: 'params' needs 'inputs'"):
        tolstat.from_pairs([{"actual": out, "expected": ref, "params": {}}], **kw)
    with pytest.raises(ValueError, match=r"pair 0: unknown key\(s\) \['input'\]"):
        tolstat.from_pairs([{"actual": out, "expected": ref, "input": (a, b)}], **kw)
    with pytest.raises(ValueError, match="pair 0: inputs give the operator statistics; CollectOptions.magnitude"):
        tolstat.from_pairs([with_inputs], op="matmul", dtype="float16",
                           options=tolstat.CollectOptions(progress=False, magnitude="ref"))
    with pytest.raises(ValueError, match="pair 1: CollectOptions.op_model=True but the pair has no inputs"):
        tolstat.from_pairs([with_inputs, (out2, ref2)], op="matmul", dtype="float16",
                           options=tolstat.CollectOptions(progress=False, op_model=True))


def test_check_options_validate_their_fields():
    with pytest.raises(ValueError, match="CheckOptions.magnitude must be an array or 'ref', got 'abs'"):
        tolstat.CheckOptions(magnitude="abs")
    with pytest.raises(TypeError, match="CheckOptions.magnitude must be an array.*got <function"):
        tolstat.CheckOptions(magnitude=_mm_magnitude)
    with pytest.raises(TypeError, match="CheckOptions.allow_nan must be True or False, got 'no'"):
        tolstat.CheckOptions(allow_nan="no")
    with pytest.raises(ValueError, match="CheckOptions.hardware_policy must be None or one of .*got 'closest'"):
        tolstat.CheckOptions(hardware_policy="closest")
    with pytest.raises(AttributeError):
        tolstat.CheckOptions().allow_nan = True  # frozen


# ----------------------------------------------------------------------- pytest plugin
pytest_plugins = ["pytester"]

SUITE = """
import torch

def _mm(seed, bug=1.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(24, 64, generator=g).half()
    b = torch.randn(64, 16, generator=g).half()
    parts = torch.bmm(a.float().reshape(24, 4, 16).transpose(0, 1), b.float().reshape(4, 16, 16)).half()
    out = parts[0]
    for p in parts[1:]:
        out = (out.float() + p.float()).half()
    return a, b, (out.float() * bug).half(), a.double() @ b.double()

def test_good(tolstat_check):
    for seed in (11, 12):
        a, b, out, ref = _mm(seed)
        r = tolstat_check(out, ref, op="matmul", dtype="float16", inputs=(a, b))
        assert r is None or r.passed  # None: record-only mode

def test_bad(tolstat_check):
    a, b, out, ref = _mm(13, bug=1.01)
    tolstat_check(out, ref, op="matmul", dtype="float16", inputs=(a, b))

def test_no_inputs(tolstat_check):
    a, b, out, ref = _mm(14)
    tolstat_check(out, ref, op="matmul", dtype="float16")
"""


def test_plugin_fixture_and_recorder_take_inputs(pytester, mm_table, tmp_path):
    import importlib.metadata

    pytest.importorskip("h5netcdf")
    installed = any(ep.value == "tolstat.checks.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    load = () if installed else ("-p", "tolstat.checks.pytest_plugin")
    path = tmp_path / "mm.json"
    mm_table.to_json(path)
    pytester.makepyfile(SUITE)
    rec = tmp_path / "rec.nc"
    res = pytester.runpytest(*load, f"--tolstat-table={path}", f"--tolstat-hardware={HW}", f"--tolstat-record={rec}")
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines(["*test_no_inputs*", "*pass inputs= (and params=)*"])
    ds = tolstat.open_errors(rec).load()
    assert ds.sizes["run"] == 2 and list(ds["K"].values) == [64.0, 64.0]
    # the records carry the operator statistics of the pairs, as from_pairs with inputs stores them
    g = [tolstat.from_pairs([{"actual": out, "expected": ref, "inputs": (a, b)}], op="matmul", dtype="float16")
         for a, b, out, ref in (_suite_mm(11), _suite_mm(12))]
    for i, one in enumerate(g):
        for name in tolstat.measure.noise.statistic_names("matmul"):
            x, y = ds[name].values[i], one[name].values[0]
            assert x == y or (np.isnan(x) and np.isnan(y)), name
        assert np.isfinite(ds["op_max"].values[i])
    # record-only mode: checks with and without inputs in one record file (NaN where a run has none)
    rec2 = tmp_path / "rec2.nc"
    res = pytester.runpytest(*load, f"--tolstat-hardware={HW}", f"--tolstat-record={rec2}")
    res.assert_outcomes(passed=3)
    ds2 = tolstat.open_errors(rec2).load()
    plain = np.asarray(["test_no_inputs" in t for t in ds2["test"].values])
    assert ds2.sizes["run"] == 4 and plain.sum() == 1
    assert np.isnan(ds2["op_max"].values[plain]).all() and np.isfinite(ds2["op_max"].values[~plain]).all()
    assert np.isnan(ds2["K"].values[plain]).all() and (ds2["K"].values[~plain] == 64.0).all()


def _suite_mm(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(24, 64, generator=g).half()
    b = torch.randn(64, 16, generator=g).half()
    return a, b, _splitk(a, b), a.double() @ b.double()
