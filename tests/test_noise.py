"""Operator noise model and whole-output statistics (tolstat.measure.noise)."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

import tolstat
from tolstat.measure import noise
from tolstat._base.dtypes import target_dtype
from tolstat._base.dtypes import unit_roundoff
from tolstat.measure import invariants
from tolstat.measure.invariants import register_invariant
from tolstat.measure.noise import MID_SHAPE, NoiseShape, noise_scale, record_statistics, run_statistics

FORMATS = ["float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2"]


def round_once(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to ``dtype`` once (nearest even), without double rounding."""
    td = target_dtype(dtype)
    fi = ml_dtypes.finfo(td.np_dtype) if td.name not in ("float16", "float32") else np.finfo(td.np_dtype)
    p = int(fi.nmant) + 1
    emin = int(np.log2(float(fi.tiny))) + 1  # frexp exponent of the smallest normal
    _, e = np.frexp(x)
    e = np.maximum(e, emin)
    q = np.ldexp(np.rint(np.ldexp(x, p - e)), e - p)
    assert np.all(np.abs(q) <= td.max), "test values must stay in range"
    out = q.astype(td.np_dtype)
    assert np.array_equal(out.astype(np.float64), q), "rounded value must be representable"
    return out


def edge_values(dtype: str, rng: np.random.Generator, n: int = 20000) -> np.ndarray:
    td = target_dtype(dtype)
    tiny, top = td.tiny, td.max
    sub = tiny * rng.uniform(0, 1, n // 4)  # subnormal range
    lo, hi = math.log2(tiny), math.log2(top) - 1
    pos = 2.0 ** rng.uniform(lo, hi, n // 2)  # log-uniform over the normal range
    pow2 = 2.0 ** np.arange(math.ceil(lo) - 3, math.floor(hi))
    near = np.concatenate([pow2 * (1 + 2.0**-30), pow2 * (1 - 2.0**-30)])
    # exact ties: midpoints between neighbours
    grid = np.abs(round_once(pos[:200], dtype).astype(np.float64))
    fi = ml_dtypes.finfo(td.np_dtype)
    _, e = np.frexp(grid)
    ulp = np.ldexp(1.0, np.maximum(e, int(np.log2(td.tiny)) + 1) - (int(fi.nmant) + 1))
    ties = grid + ulp / 2  # exact midpoints: round to even
    vals = np.concatenate([sub, pos, pow2, near, ties, [0.0, tiny, top * 0.999]])
    vals = vals[np.abs(vals) <= top * (1 - 2.0**-10)]
    sign = rng.choice([-1.0, 1.0], vals.size)
    return vals * sign


def test_unit_roundoff_values():
    assert unit_roundoff("fp16") == 2.0**-11
    assert unit_roundoff("bf16") == 2.0**-8
    assert unit_roundoff("float32") == 2.0**-24
    assert unit_roundoff("float64") == 2.0**-53
    assert unit_roundoff("float8_e4m3fn") == 2.0**-4
    assert unit_roundoff("float8_e5m2") == 2.0**-3
    for name in FORMATS + ["float64"]:
        assert unit_roundoff(name) == target_dtype(name).eps / 2
    with pytest.raises(ValueError, match="unknown target dtype"):
        unit_roundoff("int8")


@pytest.mark.parametrize("dtype", FORMATS)
def test_correctly_rounded_output_never_exceeds_one(dtype):
    rng = np.random.default_rng(7)
    ref = edge_values(dtype, rng)
    out = round_once(ref, dtype)
    st = run_statistics(out, ref, dtype=dtype, K=1, shape=NoiseShape(c_acc=0.0))
    assert st["op_max"] <= 1.0
    s = noise_scale(ref, dtype=dtype, shape=NoiseShape(c_acc=0.0))
    d = np.abs(out.astype(np.float64) - ref)
    assert np.all(d <= s)
    # the bound is tight: a midpoint just above a power of two, 2**e (1 + u), has z = 1/(1+u)
    assert st["op_max"] >= 0.95 / (1 + unit_roundoff(dtype))
    # and wrong outputs fail: three ULPs away from the correct rounding is beyond s
    normal = np.abs(ref) >= 2 * target_dtype(dtype).tiny
    td = target_dtype(dtype)
    bits = out[normal].view(td.uint_dtype).astype(np.int64)
    shifted = (bits + 3).astype(td.uint_dtype).view(td.np_dtype)
    with np.errstate(invalid="ignore"):
        sh = shifted.astype(np.float64)
    ok = np.isfinite(sh) & (np.sign(sh) == np.sign(ref[normal]))
    st_bad = run_statistics(shifted[ok], ref[normal][ok], dtype=dtype, shape=NoiseShape(c_acc=0.0))
    assert st_bad["op_frac"] == 1.0


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_correct_rounding_passes_with_any_magnitude(dtype):
    """Extra nonnegative terms (magnitude, K, c_mid) never break the half-ULP property."""
    rng = np.random.default_rng(3)
    ref = edge_values(dtype, rng, 4000)
    out = round_once(ref, dtype)
    m = np.abs(ref) * rng.uniform(0, 5, ref.size)
    st = run_statistics(out, ref, dtype=dtype, magnitude=m, K=4096, shape=NoiseShape(c_mid=2.0))
    assert st["op_max"] <= 1.0


def _naive(actual, expected, dtype, magnitude, K, row_axis):
    u, ua = unit_roundoff(dtype), 2.0**-24
    tiny = target_dtype(dtype).tiny
    a = actual.astype(np.float64)
    flat_a, flat_e, flat_m = a.ravel(), expected.ravel(), magnitude.ravel()
    z, zb = [], []
    for x, e, m in zip(flat_a, flat_e, flat_m):
        s = u * abs(e) + ua * math.sqrt(K) * abs(m) + u * tiny
        z.append((x - e) / s)
        zb.append((x - float(np.float16(e))) / s)  # beyond the correctly rounded reference
    z = np.array(z).reshape(expected.shape)
    zb = np.array(zb)
    n = z.size
    rows = np.moveaxis(z, row_axis, -1).reshape(-1, expected.shape[row_axis])
    row_rms = [math.sqrt(sum(v * v for v in r) / len(r)) for r in rows]
    return {
        "op_max": max(abs(v) for v in z.ravel()),
        "op_rms": math.sqrt(sum(v * v for v in z.ravel()) / n),
        "op_mean": sum(abs(v) for v in z.ravel()) / n,
        "op_bias": abs(sum(zb) / n) * math.sqrt(n),
        "op_sbias": abs(sum((v if e > 0 else -v) if e != 0 else 0.0
                            for v, e in zip(zb, expected.ravel())) / n) * math.sqrt(n),
        "op_frac": sum(abs(v) > 1.5 for v in z.ravel()) / n,
        "op_row_rms_max": max(row_rms),
        "op_row_rms_mean": sum(row_rms) / len(row_rms),
    }


def test_statistics_match_naive_reference():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 5, 7))
    out = (ref + 4e-3 * rng.standard_normal(ref.shape)).astype(np.float16)
    mag = np.abs(ref) + rng.uniform(0, 2, ref.shape)
    st = run_statistics(out, ref, dtype="float16", magnitude=mag, K=64, rowwise=True,
                        row_axis=1, shape=NoiseShape(frac_k=1.5))
    want = _naive(out, ref, "float16", mag, 64, 1)
    for k, v in want.items():
        assert st[k] == pytest.approx(v, rel=1e-12), k
    assert 0 < st["op_frac"] < 1
    # the row-bias statistic: max over rows |sum b| / sqrt(sum s^2), b beyond the rounded reference
    s = noise_scale(ref, dtype="float16", magnitude=mag, K=64)
    d = out.astype(np.float64) - ref.astype(np.float16).astype(np.float64)
    rb = np.abs(np.moveaxis(d, 1, -1).sum(-1)) / np.sqrt((np.moveaxis(s, 1, -1) ** 2).sum(-1))
    assert st["op_row_bias_max"] == pytest.approx(rb.max(), rel=1e-12)
    flat = run_statistics(out, ref, dtype="float16", magnitude=mag, K=64)
    assert math.isnan(flat["op_row_rms_max"]) and math.isnan(flat["op_row_bias_max"])


def test_magnitude_fallback_is_abs_ref():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(100)
    out = ref.astype(np.float16)
    a = run_statistics(out, ref, dtype="fp16", K=16)
    b = run_statistics(out, ref, dtype="fp16", K=16, magnitude=np.abs(ref))
    assert a == b


def test_non_finite_outputs_fail():
    ref = np.array([1.0, 2.0, 3.0])
    for bad in (np.nan, np.inf, -np.inf):
        out = np.array([1.0, bad, 3.0], dtype=np.float16)
        st = run_statistics(out, ref, dtype="float16", op="softmax", rowwise=True)
        assert all(v == math.inf for v in st.values())
        assert "inv_row_sum" in st
    # a non-finite reference matched exactly is no error
    ref2 = np.array([1.0, -np.inf, np.nan])
    out2 = np.array([1.0, -np.inf, np.nan], dtype=np.float16)
    st2 = run_statistics(out2, ref2, dtype="float16")
    assert st2["op_max"] == 0.0
    st3 = run_statistics(np.array([1.0, 0.0, np.nan], np.float16), ref2, dtype="float16")
    assert st3["op_max"] == math.inf


def test_bad_arguments():
    with pytest.raises(ValueError, match="shape"):
        run_statistics(np.zeros(3), np.zeros(4), dtype="float16")
    with pytest.raises(ValueError, match="row_axis"):
        run_statistics(np.zeros((2, 3)), np.zeros((2, 3)), dtype="float16", rowwise=True, row_axis=2)
    with pytest.raises(ValueError, match="K must be"):
        run_statistics(np.zeros(3), np.zeros(3), dtype="float16", K=-1)
    with pytest.raises(TypeError, match="floating-point array"):
        run_statistics(np.array(["a"]), np.zeros(1), dtype="float16")
    with pytest.raises(ValueError, match=r"NoiseShape.c_mid must be a finite number >= 0, got -1"):
        NoiseShape(c_mid=-1)
    with pytest.raises(TypeError, match="shape must be a NoiseShape, got dict"):
        run_statistics(np.zeros(3), np.zeros(3), dtype="float16", shape={"c_mid": 1.0})
    with pytest.raises(ValueError, match="does not broadcast"):
        noise_scale(np.zeros(3), dtype="float16", magnitude=np.zeros(4))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_softmax_invariants_detect_planted_violation():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 256))
    x[3, :100] = -1e6  # masked positions: probability exactly zero
    ref = _softmax(x)
    out = round_once(ref, "float16")
    ok = run_statistics(out, ref, dtype="float16", op="softmax", rowwise=True)
    assert ok["inv_masked_zero"] == 0.0
    assert ok["inv_row_sum"] < 5.0
    # plant: row 5 scaled by (1 + 4 u): every element within 3 noise units, the sum off
    bad = out.astype(np.float64)
    bad[5] *= 1 + 4 * unit_roundoff("float16")
    bad = bad.astype(np.float16)
    st = run_statistics(bad, ref, dtype="float16", op="softmax", rowwise=True)
    assert st["op_max"] < 6.0
    assert st["inv_row_sum"] > 30.0
    leak = out.copy()
    leak[3, 10] = np.float16(1e-4)
    assert run_statistics(leak, ref, dtype="float16", op="softmax")["inv_masked_zero"] == 1.0


def test_norm_and_log_softmax_invariants():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 512))
    mu, sd = x.mean(-1, keepdims=True), x.std(-1, keepdims=True)
    ref = (x - mu) / sd
    out = round_once(ref, "bfloat16")
    ok = run_statistics(out, ref, dtype="bfloat16", op="layer_norm", rowwise=True)
    bad = (out.astype(np.float64) * (1 + 2 * unit_roundoff("bfloat16")))
    st = run_statistics(round_once(bad, "bfloat16"), ref, dtype="bfloat16", op="layer_norm",
                        rowwise=True)
    assert ok["inv_row_scale"] < 5.0 and st["inv_row_scale"] > 20.0
    shifted = round_once(out.astype(np.float64) + 0.01, "bfloat16")
    assert run_statistics(shifted, ref, dtype="bfloat16", op="layer_norm")["inv_row_mean"] > 20.0
    rms = run_statistics(round_once(bad, "bfloat16"), ref, dtype="bfloat16", op="rms_norm")
    assert rms["inv_row_scale"] > 20.0
    ls = np.log(_softmax(x))
    lso = round_once(ls, "float16")
    good = run_statistics(lso, ls, dtype="float16", op="log_softmax")["inv_row_lse"]
    worse = run_statistics(round_once(ls + 0.01, "float16"), ls, dtype="float16",
                           op="log_softmax")["inv_row_lse"]
    assert good < 5.0
    assert worse > 20.0


def test_record_statistics_names_and_mid_shape():
    rng = np.random.default_rng(9)
    ref = _softmax(rng.standard_normal((4, 64)))
    out = round_once(ref, "float16")
    st = noise.record_statistics(out, ref, dtype="float16", K=64, rowwise=True, op="softmax")
    assert list(st) == noise.record_statistic_names("softmax")
    assert set(noise.score_statistic_names("softmax")) <= set(st)
    assert "inv_row_sum_mid" in noise.score_statistic_names("softmax")
    # the intermediate-store term only widens the noise scale
    assert st["op_rms_mid"] <= st["op_rms"] and st["op_max_mid"] <= st["op_max"]
    s0 = noise_scale(ref, dtype="float16", K=64)
    s1 = noise_scale(ref, dtype="float16", K=64, shape=MID_SHAPE)
    np.testing.assert_allclose(s1 - s0, unit_roundoff("float16") / 8 * np.abs(ref), rtol=1e-12)


def test_register_invariant():
    name = "test_noise_op"
    register_invariant(name, "peak", lambda a, e, s: float(np.abs(a - e).max() / s.max()))
    try:
        st = run_statistics(np.ones(4, np.float16), np.ones(4), dtype="float16", op=name)
        assert st["inv_peak"] == 0.0
        assert "inv_peak" in noise.statistic_names(name)
        with pytest.raises(ValueError, match="already registered"):
            register_invariant(name, "peak", lambda a, e, s: 0.0)
        with pytest.raises(ValueError, match="letters, digits"):
            register_invariant(name, "bad name", lambda a, e, s: 0.0)
        with pytest.raises(TypeError, match="callable"):
            register_invariant(name, "x", 3)
        register_invariant(name, "neg", lambda a, e, s: -1.0)
        with pytest.raises(ValueError, match="must be >= 0"):
            run_statistics(np.ones(4, np.float16), np.ones(4), dtype="float16", op=name)
    finally:
        invariants._INVARIANTS.pop(name, None)


# ----------------------------------------------------------------- dataset wiring
def test_from_pairs_with_magnitude_array():
    rng = np.random.default_rng(5)
    pairs, direct = [], []
    for _ in range(4):
        a = rng.standard_normal((8, 32)).astype(np.float16)
        b = rng.standard_normal((32, 16)).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        out = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
        mag = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
        pairs.append((out, ref, mag, {"variant": "x"}, {"K": 32.0}))
        direct.append(run_statistics(out, ref, dtype="float16", magnitude=mag, K=32))
    ds = tolstat.from_pairs(pairs, op="matmul", dtype="float16", options=tolstat.CollectOptions(progress=False))
    tolstat.dataset.validate(ds)
    for k in noise.STATISTICS:
        assert ds[k].attrs["role"] == "op_statistic"
        if k in ("op_max", "op_frac"):  # maxima and counts: exact
            np.testing.assert_array_equal(ds[k].values, [d[k] for d in direct])
        else:  # sums: one fused pass (sequential) vs numpy's pairwise sums, equal to rounding
            np.testing.assert_allclose(ds[k].values, [d[k] for d in direct], rtol=1e-12, atol=0)
    out, ref, mag = pairs[2][:3]
    mid = run_statistics(out, ref, dtype="float16", magnitude=mag, K=32, shape=MID_SHAPE)
    assert ds["op_rms_mid"].values[2] == pytest.approx(mid["op_rms"], rel=1e-12)
    assert "intermediate-store" in ds["op_rms_mid"].attrs["long_name"]
    assert sorted(k for k in ds.data_vars if ds[k].attrs.get("role") == "op_statistic") == \
        sorted(noise.record_statistic_names("matmul"))
    assert ds["variant"].values.tolist() == ["x"] * 4
    # 3-tuple: the third item is a magnitude unless it is a mapping (labels)
    ds3 = tolstat.from_pairs([p[:3] for p in pairs], op="matmul", dtype="float16", options=tolstat.CollectOptions(progress=False))
    assert "op_max" in ds3
    plain = tolstat.from_pairs([(p[0], p[1], {"variant": "x"}) for p in pairs], op="matmul",
                               dtype="float16", options=tolstat.CollectOptions(progress=False))
    assert "op_max" not in plain and "variant" in plain.coords
    fallback = tolstat.from_pairs([p[:2] for p in pairs], op="matmul", dtype="float16",
                                  options=tolstat.CollectOptions(magnitude="ref", progress=False))
    assert np.all(np.isfinite(fallback["op_rms"].values))
    with pytest.raises(ValueError, match="magnitude for every run or for none"):
        tolstat.from_pairs([pairs[0][:3], pairs[1][:2]], op="matmul", dtype="float16",
                           options=tolstat.CollectOptions(progress=False))
    with pytest.raises(ValueError, match=r"CollectOptions.magnitude must be a callable, 'ref' or None, got 'abs'"):
        tolstat.CollectOptions(magnitude="abs", progress=False)
    with pytest.raises(ValueError, match="magnitude must be None or 'ref'"):  # pairs carry their arrays
        tolstat.from_pairs(pairs, op="matmul", dtype="float16",
                           options=tolstat.CollectOptions(magnitude=np.abs, progress=False))


def test_collect_with_magnitude_function(tmp_path):
    def kernel(a, b):
        return (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)

    def reference(a, b):
        return a.astype(np.float64) @ b.astype(np.float64)

    def magnitude(a, b):
        return np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))

    def make(rng):
        a = rng.standard_normal((4, 64)).astype(np.float16)
        b = rng.standard_normal((64, 8)).astype(np.float16)
        return tolstat.Inputs(args=(a, b), covariates={"K": 64.0})

    ds = tolstat.collect(kernel, reference, make, op="matmul", dtype="float16", runs=3,
                         options=tolstat.CollectOptions(magnitude=magnitude, progress=False))
    a, b = make(np.random.default_rng([0, 1])).args
    want = run_statistics(kernel(a, b), reference(a, b), dtype="float16",
                          magnitude=magnitude(a, b), K=64)
    assert ds["op_max"].values[1] == want["op_max"]
    assert ds["op_rms"].values[1] == want["op_rms"]
    assert np.all(ds["op_max"].values <= 1.0)  # float32 accumulation, one rounding
    # streamed to a store: the same operator statistics (tests/test_stream.py compares all)
    st = tolstat.collect(kernel, reference, make, op="matmul", dtype="float16", runs=3,
                         options=tolstat.CollectOptions(magnitude=magnitude, progress=False),
                         store=tmp_path / "m.zarr")
    np.testing.assert_array_equal(st["op_max"].values, ds["op_max"].values)
    np.testing.assert_array_equal(st["op_rms"].values, ds["op_rms"].values)


def test_corpus_magnitudes_bound_the_reference():
    corpus = pytest.importorskip("tolstat.corpus")
    for op in corpus.OPS:
        for case in corpus.cases(op, "float16", n=3, seed=1, quick=True):
            ref = corpus.run_reference(case, "float16")
            m = corpus.run_magnitude(case, "float16")
            assert m.shape == ref.shape, op
            assert np.all(np.isfinite(m)) and np.all(m >= 0), op
            if op != "cumsum":  # cumsum's magnitude is scaled by sqrt((j+1)/N)
                assert np.all(m >= np.abs(ref) * (1 - 1e-12)), op
            out = corpus.run_kernel(next(iter(corpus.OPS[op].variants.values())), case, "float16")
            st = run_statistics(out, ref, dtype="float16", magnitude=m, K=case.covariates["K"],
                                rowwise=op in corpus.ROWWISE, op=op)
            assert np.isfinite(st["op_max"]), op


def test_corpus_calibration_dataset_records_op_statistics():
    from tolstat.assess.corpus_runs import calibration_dataset
    from tolstat.assess.evaluation import EvalConfig

    cfg = EvalConfig(ops=["mean", "softmax"], dtypes=("float16",), n_cal=3, quick=True)
    ds = calibration_dataset(cfg, progress=False)
    tolstat.dataset.validate(ds)
    assert np.all(np.isfinite(ds["op_max"].values)) and np.all(np.isfinite(ds["op_rms_mid"].values))
    soft = ds["op"].values == "softmax"
    assert np.all(np.isfinite(ds["inv_row_sum"].values[soft]))
    assert np.all(np.isnan(ds["inv_row_sum"].values[~soft]))  # mean has no such invariant
    assert np.all(np.isnan(ds["op_row_rms_max"].values[~soft]))  # mean is not row-wise
    # attrs survive concat although the first dataset (mean) lacks the variable
    assert ds["inv_row_sum"].attrs["role"] == "op_statistic"


def test_sbias_sees_a_bias_toward_zero_that_the_signed_mean_cancels():
    """Truncation (round toward zero) moves every element toward zero: the signed mean of
    ``z`` cancels over references of both signs, ``op_sbias`` grows like sqrt(n)."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal(4096)
    ref = ref - ref.mean()
    near = ref.astype(np.float16)
    trunc = np.where(np.abs(near.astype(np.float64)) > np.abs(ref),
                     np.nextafter(near, np.float16(0)), near)  # round toward zero
    assert (np.abs(trunc.astype(np.float64)) <= np.abs(ref)).all()
    st_rn = run_statistics(near, ref, dtype="float16")
    st_tz = run_statistics(trunc, ref, dtype="float16")
    assert st_rn["op_sbias"] < 3.0  # round to nearest: no direction, |z-mean| ~ 1
    assert st_tz["op_sbias"] > 10 * st_rn["op_sbias"] and st_tz["op_sbias"] > 15.0
    assert st_tz["op_bias"] < 0.2 * st_tz["op_sbias"]  # the plain signed mean cancels
    # the fused path of the error dataset computes the same number
    rec = record_statistics(trunc, ref, dtype="float16")
    assert rec["op_sbias"] == pytest.approx(st_tz["op_sbias"], rel=1e-9)


def test_bias_statistics_are_zero_for_a_correctly_rounded_output():
    """Round-to-nearest errors of structured inputs are not mean-zero (here: a grid of
    positive values); the bias statistics measure the error beyond the correctly rounded
    reference, so they are exactly 0, while the signed mean of d / s is far from it."""
    grid = np.unique(np.linspace(1.0, 1.5, 20001).astype(np.float16)).astype(np.float64)
    ref = grid * (1.0 + 1e-4)  # each value just above a float16: rounding always goes down
    out = ref.astype(np.float16)
    assert (out.astype(np.float64) == grid).all()
    st = run_statistics(out, ref, dtype="float16")
    assert st["op_bias"] == 0.0 and st["op_sbias"] == 0.0
    z = (out.astype(np.float64) - ref) / noise_scale(ref, dtype="float16")
    assert abs(z.mean()) * math.sqrt(z.size) > 3.0  # what op_bias would be on d itself
    one_ulp_up = np.nextafter(out, np.float16(np.inf))  # every element one ULP too far from 0
    st_up = run_statistics(one_ulp_up, ref, dtype="float16")
    ulp = one_ulp_up.astype(np.float64) - out.astype(np.float64)
    want = np.mean(ulp / noise_scale(ref, dtype="float16")) * math.sqrt(ref.size)
    assert st_up["op_sbias"] == pytest.approx(want, rel=1e-12) and want > 20.0
    assert st_up["op_bias"] == pytest.approx(st_up["op_sbias"])
    assert record_statistics(one_ulp_up, ref, dtype="float16")["op_sbias"] == pytest.approx(st_up["op_sbias"],
                                                                                           rel=1e-9)


def test_silu_magnitude_covers_float32_exp_overflow():
    """A correct float32 silu returns -0 for x < -88.7 (exp(-x) overflows), where the exact
    value is a bfloat16 number of size |x| e^x: the corpus magnitude's range term keeps those
    elements within the noise scale, as |ref| alone does not (z about 2**8 there)."""
    from tolstat.corpus import _magnitude
    from tolstat.corpus._pointwise import silu_exp, silu_exp2, silu_sigmoid_mul

    x = np.concatenate([np.linspace(-120.0, -80.0, 401), np.linspace(-8.0, 8.0, 101)]).astype(ml_dtypes.bfloat16)
    x64 = x.astype(np.float64)
    ref = x64 / (1.0 + np.exp(-x64))
    m = _magnitude.MAGNITUDES["silu"](x=x64)
    tiny32 = float(np.finfo(np.float32).tiny)
    assert np.all(m >= np.abs(ref) * (1 - 1e-12)) and np.all(m * 2.0**-24 >= np.abs(x64) * tiny32 * (1 - 1e-12))
    flushed = 0
    for kernel in (silu_exp, silu_exp2, silu_sigmoid_mul):
        out = kernel(x)
        flushed += int(np.sum((out.astype(np.float64) == 0) & (ref != 0)))
        assert run_statistics(out, ref, dtype="bfloat16", magnitude=m)["op_max"] <= 1.0, kernel.__name__
    assert flushed > 0  # the range term is exercised
    old = run_statistics(silu_exp(x), ref, dtype="bfloat16", magnitude=np.abs(ref))["op_max"]
    assert old > 100.0


# --------------------------------------------------------------------------- non-finite pairs, empty rows, overflow
# Matched non-finite pairs, empty and zero rows, overflow, quietly.
# References: the definitions of docs/noise.md re-implemented in numpy (the noise scale with the
# unit roundoffs 2**-11, 2**-24; the invariants' matched filters), the round-to-nearest reference
# by a plain cast, and the stated contract that the statistics of a correct (or empty) output
# are 0 and are computed quietly (no floating-point warning for values handled on purpose).


def _log_softmax(x: np.ndarray) -> np.ndarray:
    """float64 log-softmax along the last axis (``-inf`` logits give ``-inf``)."""
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _lse_reference(a: np.ndarray, e: np.ndarray, s: np.ndarray) -> float:
    """docs/noise.md, ``inv_row_lse``: worst |sum_j p_j d_j| / sqrt(sum_j p_j^2 s_j^2) with
    p = exp(ref), over the finite entries of each row (a masked entry, -inf in the
    reference and in the output, has p_j = 0 and is exact)."""
    worst = 0.0
    for ar, er, sr in zip(a, e, s):
        f = np.isfinite(er)
        p, d = np.exp(er[f]), ar[f] - er[f]
        num = abs(float(np.sum(p * d)))
        if num:
            worst = max(worst, num / math.sqrt(float(np.sum((p * sr[f]) ** 2))))
    return worst


def _scale(e: np.ndarray, u_out: float, tiny: float, u_acc: float = 2.0 ** -24, K: float = 1.0,
           m: np.ndarray | None = None) -> np.ndarray:
    """docs/noise.md: s_i = u_out |ref_i| + u_acc sqrt(K) m_i + u_out tiny (c_out = c_acc = 1)."""
    m = np.abs(e) if m is None else m
    return u_out * np.abs(e) + u_acc * math.sqrt(K) * m + u_out * tiny


@pytest.mark.parametrize("record", [False, True])
def test_masked_log_softmax_output_is_exact_for_its_invariant(record):
    """A masked log-softmax (``-inf`` logits) has ``-inf`` in the reference; a correct
    output has ``-inf`` there too. Such a matched pair is exact (docs/noise.md: only a
    non-finite output that differs from its reference fails), so ``inv_row_lse`` is the
    matched filter over the unmasked entries, and finite."""
    rng = np.random.default_rng(320)
    x = rng.standard_normal((6, 16))
    x[:, 11:] = -np.inf
    x[2, 3] = -np.inf
    e = _log_softmax(x)
    a = e.astype(np.float16).astype(np.float64)
    a[1, :11] = (a[1, :11] * (1 + 2.0 ** -9)).astype(np.float16)  # a scaled row: the invariant moves
    fn = noise.record_statistics if record else noise.run_statistics
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = fn(a, e, dtype="float16", rowwise=True, op="log_softmax")
    s = _scale(np.where(np.isfinite(e), e, 0.0), 2.0 ** -11, 2.0 ** -14)
    want = _lse_reference(a, e, s)
    assert want > 1.0
    assert st["inv_row_lse"] == pytest.approx(want, rel=1e-9)
    assert math.isfinite(st["op_max"]) and st["op_max"] > 1.0
    # a masked entry that is not -inf in the output fails every statistic
    a[0, 12] = 0.0
    assert all(v == math.inf for v in fn(a, e, dtype="float16", rowwise=True, op="log_softmax").values())


def test_matched_non_finite_pairs_reach_an_invariant_as_exact_entries():
    """Only matched non-finite pairs reach an invariant (unmatched ones make every
    statistic +inf); an invariant that sums the differences at the non-finite entries of
    the reference sees none there (inf - inf is NaN, so the pairs must be exact)."""
    def nonfinite_diffs(a, e, s):
        f = ~np.isfinite(e)
        same = (a[f] == e[f]) | (np.isnan(a[f]) & np.isnan(e[f]))
        return float(np.count_nonzero(~same))

    register_invariant("matched_nonfinite_op", "nonfinite", nonfinite_diffs, replace=True)
    e = np.linspace(-2.0, 2.0, 24).reshape(4, 6)
    e[1, 2], e[3, 5], e[0, 0] = np.inf, -np.inf, np.nan
    a = e.astype(np.float32).astype(np.float64)
    st = noise.run_statistics(a, e, dtype="float32", rowwise=True, row_axis=0, op="matched_nonfinite_op")
    assert st["inv_nonfinite"] == 0.0
    assert st["op_max"] <= 1.0 and st["op_bias"] == 0.0


@pytest.mark.parametrize("op,name", [("softmax", "row_sum"), ("log_softmax", "row_lse"),
                                     ("layer_norm", "row_mean"), ("layer_norm", "row_scale"),
                                     ("rms_norm", "row_scale")])
def test_invariants_of_an_output_without_rows_are_zero(op, name):
    """An output with no rows satisfies every invariant (0, like the statistics of an
    empty output); an invariant is a nonnegative statistic, 0 when it holds."""
    fn = invariants.invariants(op)[name]
    z = np.zeros((0, 8))
    assert fn(z, z, np.ones((0, 8))) == 0.0


def test_rms_norm_of_a_zero_row_is_exact_and_quiet():
    """A zero input row of an RMS norm gives a zero reference row (the projection weight
    r = ref is 0): the row holds its scale exactly (0) and no 0/0 warning is raised."""
    rng = np.random.default_rng(321)
    e = rng.standard_normal((5, 32))
    e[2] = 0.0
    a = e.astype(np.float16).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = noise.run_statistics(a, e, dtype="float16", rowwise=True, op="rms_norm")
        v = invariants.invariants("rms_norm")["row_scale"](a[2:3], e[2:3], np.ones((1, 32)))
    assert v == 0.0
    s = _scale(e, 2.0 ** -11, 2.0 ** -14)
    d = a - e
    per_row = [abs(float(np.sum(r * dr))) / math.sqrt(float(np.sum((r * sr) ** 2)))
               for r, dr, sr in zip(e, d, s) if np.any(r)]
    assert st["inv_row_scale"] == pytest.approx(max(per_row), rel=1e-9)


def test_rounded_reference_beyond_the_range_is_the_reference_quietly():
    """``rounded_reference``: RN(ref) as a float16 cast, and the reference itself where
    that is not finite, without an overflow warning (beyond the range is handled)."""
    e = np.array([1.0 + 2.0 ** -12, -3.0e5, 65504.0, 65520.0, 7.0e4, 2.0 ** -26])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = noise.rounded_reference(e, "float16")
        st = noise.run_statistics(e, e, dtype="float16")
    # float16: spacing 2^-10 at 1 (1 + 2^-12 -> 1); largest finite 65504, and 65520 (the
    # midpoint to 2^16) rounds to even, i.e. overflows: kept; 2^-26 is below half the
    # smallest subnormal 2^-24 -> 0
    want = np.array([1.0, -3.0e5, 65504.0, 65520.0, 7.0e4, 0.0])
    np.testing.assert_array_equal(r, want)
    # the output equal to the float64 reference: no error, but an excess over RN(ref)
    s = _scale(e, 2.0 ** -11, 2.0 ** -14, u_acc=2.0 ** -24)
    assert st["op_max"] == 0.0
    assert st["op_bias"] == pytest.approx(abs(np.mean((e - want) / s)) * math.sqrt(e.size), rel=1e-12)


def test_noise_scale_that_overflows_is_inf_quietly():
    """A scale beyond float64's range is +inf (the run's statistics are then decided by
    the non-finite rule), computed without an overflow warning."""
    e = np.array([1.0, 1.0e308])
    K = 2.0 ** 50  # u_acc sqrt(K) = 2^-24 2^25 = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = noise.noise_scale(e, dtype="float32", K=K)
    assert s[1] == math.inf
    assert s[0] == _scale(e[:1], 2.0 ** -24, float(np.finfo(np.float32).tiny), K=K)[0]


@pytest.mark.skipif(np.finfo(np.longdouble).eps == np.finfo(np.float64).eps, reason="long double is double here")
def test_combined_score_is_computed_in_float64_whatever_the_statistics_dtype():
    """The one definition of the score, for calibration and check alike: statistics of
    another dtype (here extended precision) are rounded to float64 first, so the score is
    the float64 score bit for bit."""
    from tolstat.measure.noise import combined_score

    x = np.array([1.0, 2.0, 3.0], dtype=np.longdouble) / 7  # not float64 numbers
    q = {"a": 3.0, "b": 0.7}
    s, which = combined_score({"a": x, "b": [0.1, np.nan, 5.0]}, q, which=True)
    s64 = combined_score({"a": x.astype(np.float64), "b": np.array([0.1, np.nan, 5.0])}, q)
    assert s.dtype == np.float64 and s.tobytes() == s64.tobytes()
    assert which.tolist() == ["b", "a", "b"]


def test_combined_score_of_one_pair_equals_the_array_definition():
    """A check's statistics are floats: the scalar path gives the array path's maximum and
    name (NaN skipped, the first maximum, inf wins, NaN when none applies)."""
    from tolstat.measure.noise import combined_score

    q = {"a": 0.5, "b": 2.0, "c": 1.0}
    for vals in ([1.0, 4.0, 2.0], [1.0, np.nan, 0.25], [np.nan, np.nan, np.nan], [0.5, np.inf, 3.0],
                 [1.0, 4.0, 0.5], [0.0, 0.0, 0.0]):
        scalar = dict(zip(q, (float(v) for v in vals)))
        arrays = {k: np.array([v]) for k, v in scalar.items()}
        s, which = combined_score(scalar, q, which=True)
        sa, wa = combined_score(arrays, q, which=True)
        assert s.shape == () and s.dtype == np.float64
        assert float(s) == float(sa[0]) or (math.isnan(s) and math.isnan(sa[0]))
        assert str(which) == wa[0], vals


def test_score_of_pair_is_the_scalar_path_of_combined_score():
    """The loop a check runs with its entry's normalisers (tolstat.measure.noise.score_of_pair)
    gives combined_score's score and name: NaN skipped, the first maximum, inf wins, NaN and
    "" when no statistic applies."""
    from tolstat.measure.noise import combined_score, score_of_pair

    q = {"a": 0.5, "b": 2.0, "c": 1.0}
    rng = np.random.default_rng(3)
    cases = [[1.0, 4.0, 2.0], [1.0, np.nan, 0.25], [np.nan] * 3, [0.5, np.inf, 3.0], [1.0, 4.0, 0.5], [0.0] * 3]
    cases += [list(np.where(rng.random(3) < 0.2, np.nan, rng.exponential(size=3))) for _ in range(200)]
    for vals in cases:
        stats = dict(zip(q, (float(v) for v in vals)))
        s, which = combined_score(stats, q, which=True)
        s1, which1 = score_of_pair(stats, tuple(q), tuple(q.values()))
        assert (float(s) == s1) or (math.isnan(s) and math.isnan(s1)), vals
        assert str(which) == which1, vals
