"""tolstat.ops: operator models keyed by torch function names (magnitude, K, rowwise)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from scipy import special

import tolstat.ops as ops
from tolstat.measure.noise import noise_scale, record_statistics
from tolstat.ops import registry

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "conv1d", "conv2d", "softmax", "log_softmax",
            "layer_norm", "rms_norm", "group_norm", "scaled_dot_product_attention", "gelu", "silu", "relu",
            "sigmoid", "tanh", "sum", "mean", "var", "cumsum", "cross_entropy")


def _rng(seed=0):
    return np.random.default_rng(seed)


def _h(*shape, seed=0, scale=1.0):
    """float16 inputs (what a kernel sees)."""
    return (_rng(seed).standard_normal(shape) * scale).astype(np.float16)


def _st(op, args, params=None, dtype="float16"):
    return ops.op_statistics(op, args, params, dtype=dtype)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made by a test vanish after it."""
    registry.names()  # built-ins loaded before the copy
    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))
    monkeypatch.setattr(registry, "_ALIASES", dict(registry._ALIASES))


def _t64(torch, x):
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _abs64(torch, x):
    return _t64(torch, x).abs()


# ----------------------------------------------------------------------- the registry

def test_every_required_op_is_registered():
    assert set(REQUIRED) <= set(ops.names())
    assert ops.names() == sorted(ops.names())


@pytest.mark.parametrize("alias, canonical", [
    ("torch.matmul", "matmul"), ("@", "matmul"), ("Tensor.matmul", "matmul"), ("aten.matmul.default", "matmul"),
    ("torch.nn.functional.linear", "linear"), ("F.linear", "linear"), ("F.softmax", "softmax"),
    ("torch.softmax", "softmax"), ("aten._softmax.default", "softmax"),
    ("nn.functional.layer_norm", "layer_norm"), ("layernorm", "layer_norm"), ("rmsnorm", "rms_norm"),
    ("aten.mm", "mm"), ("aten.mm.default", "mm"), ("torch.ops.aten.addmm.default", "addmm"),
    ("aten.sum.dim_IntList", "sum"), ("attention", "scaled_dot_product_attention"),
    ("F.scaled_dot_product_attention", "scaled_dot_product_attention"), ("torch.nn.functional.conv2d", "conv2d"),
    ("torch.special.expit", "sigmoid"), ("F.silu", "silu"),
])
def test_aliases_resolve_to_the_canonical_model(alias, canonical):
    assert ops.canonical_name(alias) == canonical
    assert ops.get(alias) is ops.get(canonical)


def test_unknown_op_names_a_close_match_and_how_to_register():
    with pytest.raises(ops.UnknownOpError) as exc:
        ops.get("torch.matmull")
    msg = str(exc.value)
    assert isinstance(exc.value, KeyError)
    assert "'torch.matmull'" in msg and "'matmul'" in msg and "tolstat.ops.register(" in msg
    with pytest.raises(KeyError, match="tolstat.ops.register"):
        _st("no_such_op_xyz", (np.ones(2),))


def test_a_registered_user_op_is_used_and_guarded_against_overwriting(scratch_registry):
    model = ops.multilinear(lambda x, s: x * s, K=3)
    ops.register("scaled_copy", model, aliases=("mylib.scaled_copy",))
    x = np.array([-1.0, 2.0], np.float16)
    st = _st("torch.mylib.scaled_copy", (x, np.array([-3.0])))
    np.testing.assert_array_equal(st.magnitude, [3.0, 6.0])
    assert st.K == 3.0 and st.rowwise is False
    assert "scaled_copy" in ops.names() and ops.aliases("scaled_copy") == ["mylib.scaled_copy"]
    with pytest.raises(ValueError, match="already registered.*replace=True"):
        ops.register("scaled_copy", model)
    with pytest.raises(ValueError, match="'matmul'"):
        ops.register("other", model, aliases=("torch.matmul", "matmul"))
    ops.register("matmul", ops.multilinear(np.matmul, K=7), replace=True)
    assert _st("torch.matmul", (np.ones((2, 3)), np.ones((3, 2)))).K == 7.0
    with pytest.raises(TypeError, match="OpModel"):
        ops.register("bad", lambda x: x)


def test_multilinear_rule_takes_absolute_array_inputs_and_passes_other_arguments(torch):
    a, b = _h(3, 4), _h(4, 5, seed=1)
    m = ops.multilinear(np.matmul, K=lambda args, kwargs: args[0].shape[-1])
    st = ops.op_statistics
    assert m.magnitude((a, b), {}, "float16").shape == (3, 5)
    np.testing.assert_array_equal(m.magnitude((a, b), {}, "float16"),
                                  np.abs(a.astype(float)) @ np.abs(b.astype(float)))
    assert m.K((a, b), {}) == 4
    # a torch function gets float64 tensors; keyword array arguments are made absolute too
    e = ops.multilinear(torch.einsum)
    got = e.magnitude(("ij,jk->ik", torch.from_numpy(a), torch.from_numpy(b)), {}, "float16")
    np.testing.assert_array_equal(got, np.abs(a.astype(float)) @ np.abs(b.astype(float)))
    kw = ops.multilinear(lambda x, *, w, dim: (x * w).sum(dim))
    np.testing.assert_array_equal(kw.magnitude((np.array([[1.0, -2.0]]),), {"w": np.array([-3.0, 1.0]), "dim": -1},
                                               "float16"), [5.0])
    assert st is ops.op_statistics
    with pytest.raises(ValueError, match="K must be"):
        ops.multilinear(np.matmul, K=0)


# --------------------------------------------------------------- multilinear models

@pytest.mark.parametrize("case", [
    ("matmul", lambda: ((_h(5, 7), _h(7, 3, seed=1)), {}), lambda T, a, b: T.abs(a) @ T.abs(b), 7),
    ("matmul", lambda: ((_h(2, 5, 7), _h(7, seed=1)), {}), lambda T, a, b: T.abs(a) @ T.abs(b), 7),
    ("matmul", lambda: ((_h(7), _h(3, 7, 2, seed=1)), {}), lambda T, a, b: T.abs(a) @ T.abs(b), 7),
    ("mm", lambda: ((_h(5, 7), _h(7, 3, seed=1)), {}), lambda T, a, b: T.abs(a) @ T.abs(b), 7),
    ("bmm", lambda: ((_h(2, 5, 7), _h(2, 7, 3, seed=1)), {}), lambda T, a, b: T.abs(a) @ T.abs(b), 7),
    ("addmm", lambda: ((_h(3), _h(5, 7, seed=1), _h(7, 3, seed=2)), {"beta": -0.5, "alpha": 2.0}),
     lambda T, i, a, b: 0.5 * T.abs(i) + 2.0 * (T.abs(a) @ T.abs(b)), 7),
    ("baddbmm", lambda: ((_h(2, 5, 3), _h(2, 5, 7, seed=1), _h(2, 7, 3, seed=2)), {}),
     lambda T, i, a, b: T.abs(i) + T.abs(a) @ T.abs(b), 7),
    ("linear", lambda: ((_h(2, 4, 6), _h(5, 6, seed=1), _h(5, seed=2)), {}),
     lambda T, x, w, b: T.nn.functional.linear(T.abs(x), T.abs(w), T.abs(b)), 6),
    ("linear", lambda: ((_h(4, 6), _h(5, 6, seed=1)), {}),
     lambda T, x, w: T.nn.functional.linear(T.abs(x), T.abs(w)), 6),
    ("add", lambda: ((_h(4, 3), _h(3, seed=1)), {"alpha": -2.0}), lambda T, a, b: T.abs(a) + 2 * T.abs(b), 1),
    ("mul", lambda: ((_h(4, 3), _h(4, 1, seed=1)), {}), lambda T, a, b: T.abs(a) * T.abs(b), 1),
], ids=lambda c: c[0])
def test_multilinear_ops_are_torch_on_absolute_inputs(torch, case):
    op, make, ref, K = case
    args, params = make()
    st = _st(op, args, params)
    want = ref(torch, *[_t64(torch, a) for a in args]).numpy()
    assert st.magnitude.shape == want.shape
    np.testing.assert_allclose(st.magnitude, want, rtol=1e-13, atol=0)
    assert st.K == K and st.rowwise is False


def test_addmm_with_beta_zero_ignores_input_as_torch_does():
    bad = np.full(3, np.nan)
    st = _st("addmm", (bad, _h(2, 4), _h(4, 3, seed=1)), {"beta": 0})
    assert np.isfinite(st.magnitude).all()


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("n, kwargs", [
    (1, dict(stride=2, padding=1)), (1, dict(padding="same", dilation=2)), (1, dict(padding="valid", groups=2)),
    (2, dict()), (2, dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)), (2, dict(padding="same")),
    (3, dict(padding=1, groups=2)),
])
def test_convolutions_are_torch_conv_on_absolute_inputs(torch, n, kwargs):
    g = kwargs.get("groups", 1)
    sp = (9, 8, 7)[:n]
    x, w, b = _h(2, 4, *sp), _h(6, 4 // g, *(3, 2, 3)[:n], seed=1), _h(6, seed=2)
    st = _st(f"conv{n}d", (x, w, b), kwargs)
    conv = getattr(torch.nn.functional, f"conv{n}d")
    want = conv(_abs64(torch, x), _abs64(torch, w), _abs64(torch, b), **kwargs).numpy()
    assert st.magnitude.shape == want.shape
    np.testing.assert_allclose(st.magnitude, want, rtol=1e-13, atol=0)
    assert st.K == (4 // g) * math.prod(w.shape[2:]) and st.rowwise is False


def test_unbatched_conv_and_keyword_binding(torch):
    x, w = _h(4, 10), _h(3, 4, 3, seed=1)
    pos = _st("conv1d", (x, w, None, 2, 1))
    kw = _st("F.conv1d", (x,), {"weight": w, "stride": 2, "padding": 1})
    want = torch.nn.functional.conv1d(_abs64(torch, x), _abs64(torch, w), stride=2, padding=1).numpy()
    np.testing.assert_allclose(pos.magnitude, want, rtol=1e-13, atol=0)
    np.testing.assert_array_equal(kw.magnitude, pos.magnitude)


# ---------------------------------------------------------------- row-wise models

def test_softmax_and_log_softmax_along_any_dim(torch):
    x = _h(3, 5, 4, scale=3.0)
    for dim in (-1, 1, 0):
        sm, ls = _st("softmax", (x, dim)), _st("log_softmax", (x,), {"dim": dim})
        t = _t64(torch, x)
        np.testing.assert_allclose(sm.magnitude, torch.softmax(t, dim).numpy(), rtol=1e-13, atol=0)
        # |x - max| + log(sum exp(x - max)) = -log_softmax(x), plus 1 for the log of a rounded sum
        np.testing.assert_allclose(ls.magnitude, (-torch.log_softmax(t, dim) + 1).numpy(), rtol=1e-13, atol=0)
        assert sm.K == ls.K == x.shape[dim]
        assert sm.rowwise is ls.rowwise is (dim == -1)


def test_layer_norm_magnitude(torch):
    x, w, b = _h(4, 2, 6, scale=5.0) + np.float16(3), _h(2, 6, seed=1), _h(2, 6, seed=2)
    st = _st("layer_norm", (x, (2, 6), w, b), {"eps": 1e-3})
    t = _t64(torch, x).reshape(4, 12)
    sd = torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + 1e-3)
    aw, ab = _abs64(torch, w).reshape(12), _abs64(torch, b).reshape(12)
    part = torch.nn.functional.layer_norm(t, (12,), aw, None, 1e-3).abs()
    want = (part + t.abs().mean(-1, keepdim=True) / sd * aw + ab).reshape(x.shape).numpy()
    np.testing.assert_allclose(st.magnitude, want, rtol=1e-12, atol=0)
    assert st.K == 12 and st.rowwise is True
    # positional and keyword binding, and torch's defaults (weight=None, bias=None, eps=1e-5)
    a = _st("layer_norm", (x, [2, 6]))
    bkw = _st("layer_norm", (), {"input": x, "normalized_shape": (2, 6), "weight": None, "eps": 1e-5})
    np.testing.assert_array_equal(a.magnitude, bkw.magnitude)


def test_rms_norm_magnitude_and_torch_default_eps(torch):
    x, w = _h(3, 8, scale=1e-3), _h(8, seed=1)
    st = _st("rms_norm", (x, (8,), w), {"eps": 1e-6})
    want = torch.nn.functional.rms_norm(_t64(torch, x), (8,), _t64(torch, w), 1e-6).abs().numpy()
    np.testing.assert_allclose(st.magnitude, want, rtol=1e-13, atol=0)
    assert st.K == 8 and st.rowwise is True
    # eps=None: float32's epsilon for a 16-bit input (torch's opmath type)
    tx = torch.from_numpy(x)
    dflt = _st("rms_norm", (tx, (8,)))
    want = torch.nn.functional.rms_norm(tx.double(), (8,), eps=torch.finfo(torch.float32).eps).abs().numpy()
    np.testing.assert_allclose(dflt.magnitude, want, rtol=1e-13, atol=0)


def test_group_norm_is_layer_norm_per_group(torch):
    x, w, b = _h(2, 6, 5, scale=2.0), _h(6, seed=1), _h(6, seed=2)
    st = _st("group_norm", (x, 3, w, b))
    t = _t64(torch, x)
    g = t.reshape(2, 3, 10)
    sd = torch.sqrt(g.var(-1, unbiased=False, keepdim=True) + 1e-5)
    core = torch.nn.functional.group_norm(t, 3, eps=1e-5).abs() + (g.abs().mean(-1, keepdim=True) / sd
                                                                   ).expand(2, 3, 10).reshape(2, 6, 5)
    want = (core * _abs64(torch, w)[None, :, None] + _abs64(torch, b)[None, :, None]).numpy()
    np.testing.assert_allclose(st.magnitude, want, rtol=1e-12, atol=0)
    assert st.K == 10 and st.rowwise is True


def test_scaled_dot_product_attention_is_exact_probabilities_times_abs_value(torch):
    F = torch.nn.functional
    q, k, v = _h(2, 3, 5, 8), _h(2, 3, 7, 8, seed=1), _h(2, 3, 7, 4, seed=2)
    mask = _rng(3).random((5, 7)) > 0.3
    mask[:, 0] = True
    T = [_t64(torch, a) for a in (q, k, v)]
    for params, tparams in [({}, {}), ({"scale": 0.3}, {"scale": 0.3}),
                            ({"attn_mask": torch.from_numpy(mask)}, {"attn_mask": torch.from_numpy(mask)}),
                            ({"attn_mask": mask.astype(np.float16)}, {"attn_mask": _t64(torch, mask)})]:
        st = _st("attention", (q, k, v), params)
        want = F.scaled_dot_product_attention(T[0], T[1], T[2].abs(), **tparams).numpy()
        np.testing.assert_allclose(st.magnitude, want, rtol=1e-12, atol=0)
        assert st.K == 7 and st.rowwise is True
    qs, ks, vs = _h(1, 4, 6, 8), _h(1, 2, 6, 8, seed=1), _h(1, 2, 6, 8, seed=2)
    st = _st("scaled_dot_product_attention", (qs, ks, vs, None, 0.0, True), {"enable_gqa": True})
    want = F.scaled_dot_product_attention(*[_t64(torch, a) for a in (qs, ks)], _abs64(torch, vs), is_causal=True,
                                          enable_gqa=True).numpy()
    np.testing.assert_allclose(st.magnitude, want, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="dropout_p"):
        _st("attention", (q, k, v), {"dropout_p": 0.1})


# ------------------------------------------------------------------------ reductions

def test_sum_mean_var_cumsum(torch):
    x = _h(3, 4, 5, scale=2.0) + np.float16(4)
    t = _t64(torch, x)
    st = _st("sum", (x, (0, 2)))
    np.testing.assert_allclose(st.magnitude, t.abs().sum((0, 2)).numpy(), rtol=1e-13, atol=0)
    assert st.K == 15 and st.rowwise is False
    st = _st("torch.mean", (x,), {"dim": 1, "keepdim": True})
    np.testing.assert_allclose(st.magnitude, t.abs().mean(1, keepdim=True).numpy(), rtol=1e-13, atol=0)
    assert st.K == 4
    assert _st("sum", (x,)).magnitude.shape == () and _st("sum", (x,)).K == 60
    for args, params, corr in [((x, 2), {}, 1), ((x,), {"dim": 2, "correction": 0}, 0), ((x, 2, False), {}, 0)]:
        st = _st("var", args, params)
        mu = t.mean(2, keepdim=True)
        want = (2 * ((t - mu).abs() * t.abs()).sum(2) / (5 - corr)).numpy()
        np.testing.assert_allclose(st.magnitude, want, rtol=1e-13, atol=0)
        assert st.K == 5
        assert np.all(st.magnitude >= 2 * t.var(2, correction=corr).numpy() * (1 - 1e-12))
    st = _st("cumsum", (x, 0))
    want = (torch.cumsum(t.abs(), 0) * torch.sqrt(torch.arange(1, 4, dtype=torch.float64) / 3)[:, None, None])
    np.testing.assert_allclose(st.magnitude, want.numpy(), rtol=1e-13, atol=0)
    assert st.K == 3 and st.rowwise is False and _st("cumsum", (x,), {"dim": -1}).rowwise is True


def test_cross_entropy_is_the_loss_plus_the_log_terms(torch):
    F = torch.nn.functional
    x = _h(6, 5, scale=3.0)
    y = np.array([0, 4, 2, -100, 1, 3])
    w = np.abs(_h(5, seed=1)) + np.float16(0.5)
    tx, ty, tw = _t64(torch, x), torch.from_numpy(y), _t64(torch, w)
    none = _st("cross_entropy", (x, y, w), {"reduction": "none", "label_smoothing": 0.1})
    picked = torch.where(ty == -100, 0.0, 0.9 * tw[ty.clamp(min=0)] + 0.1 * tw.sum() / 5)
    want = F.cross_entropy(tx, ty, tw, reduction="none", label_smoothing=0.1) + picked
    np.testing.assert_allclose(none.magnitude, want.numpy(), rtol=1e-12, atol=0)
    assert none.magnitude[3] == 0 and none.K == 5 and none.rowwise is False
    total = _st("cross_entropy", (x, y, w), {"reduction": "sum", "label_smoothing": 0.1})
    mean = _st("F.cross_entropy", (x, y, w), {"label_smoothing": 0.1})
    np.testing.assert_allclose(total.magnitude, none.magnitude.sum(), rtol=1e-13)
    np.testing.assert_allclose(mean.magnitude, none.magnitude.sum() / w[y[y != -100]].astype(float).sum(),
                               rtol=1e-13)
    assert total.K == mean.K == 5 + 6
    p = special.softmax(_rng(4).standard_normal((6, 5)), -1)
    prob = _st("cross_entropy", (x, p), {"reduction": "none"})
    want = F.cross_entropy(tx, _t64(torch, p), reduction="none") + 1.0
    np.testing.assert_allclose(prob.magnitude, want.numpy(), rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="target"):
        _st("cross_entropy", (x, np.array([0, 5, 0, 0, 0, 0])))


# ------------------------------------------------------------------------- pointwise

def test_pointwise_models(torch):
    x = np.concatenate([_h(50, scale=4.0), np.array([-100.0, -89.0, 0.0, 30.0], np.float16)])
    xf = x.astype(np.float64)
    tiny_over_u = float(np.finfo(np.float32).tiny) / 2.0 ** -24
    gelu = _st("gelu", (x,)).magnitude
    np.testing.assert_allclose(gelu, 0.5 * np.abs(xf) * (1 + np.abs(special.erf(xf / np.sqrt(2)))), rtol=1e-14)
    gt = _st("gelu", (x,), {"approximate": "tanh"}).magnitude
    np.testing.assert_allclose(gt, 0.5 * np.abs(xf) * (1 + np.abs(np.tanh(np.sqrt(2 / np.pi)
                                                                          * (xf + 0.044715 * xf ** 3)))), rtol=1e-14)
    silu = _st("silu", (x,)).magnitude
    np.testing.assert_allclose(silu, np.maximum(np.abs(xf * special.expit(xf)), np.abs(xf) * tiny_over_u), rtol=1e-14)
    assert silu[50] == 100.0 * tiny_over_u  # the float32 range term where exp(-x) overflows
    sig = _st("sigmoid", (x,)).magnitude
    np.testing.assert_allclose(sig, np.maximum(special.expit(xf), tiny_over_u), rtol=1e-14)
    np.testing.assert_array_equal(_st("relu", (x,)).magnitude, np.maximum(xf, 0))
    np.testing.assert_allclose(_st("tanh", (x,)).magnitude, np.abs(np.tanh(xf)), rtol=1e-14)
    for op in ("gelu", "silu", "relu", "sigmoid", "tanh"):
        st = _st(op, (torch.from_numpy(x),))
        assert st.K == 1 and st.rowwise is False and st.magnitude.shape == x.shape


def test_sigmoid_range_term_covers_a_float32_kernel_that_flushes_to_zero():
    x = np.array([-89.0, -95.0, -1.0], dtype=ml_dtypes.bfloat16)
    xf = x.astype(np.float64)
    with np.errstate(over="ignore"):
        out = (np.float32(1) / (np.float32(1) + np.exp(-xf.astype(np.float32)))).astype(ml_dtypes.bfloat16)
    ref = special.expit(xf)
    assert out[0] == 0 and ref[0].astype(ml_dtypes.bfloat16) != 0  # the exact value is a bfloat16 number
    st = _st("sigmoid", (x,), dtype="bfloat16")
    s = noise_scale(ref, dtype="bfloat16", magnitude=st.magnitude, K=st.K)
    assert np.all(np.abs(out.astype(np.float64) - ref) <= s)
    assert np.abs(out.astype(np.float64) - ref)[0] > noise_scale(ref, dtype="bfloat16")[0]


# --------------------------------------------------------------- inputs and errors

def test_numpy_torch_and_bfloat16_inputs_give_the_same_magnitude(torch):
    xb = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    wb = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    xn = xb.float().numpy().astype(ml_dtypes.bfloat16)
    wn = wb.float().numpy().astype(ml_dtypes.bfloat16)
    for op, targs, nargs, params in [("linear", (xb, wb), (xn, wn), {}), ("softmax", (xb,), (xn,), {"dim": -1}),
                                     ("layer_norm", (xb, (16,)), (xn, (16,)), {}), ("gelu", (xb,), (xn,), {}),
                                     ("var", (xb, 1), (xn, 1), {})]:
        a, b = _st(op, targs, params, "bfloat16"), _st(op, nargs, params, "bfloat16")
        np.testing.assert_array_equal(a.magnitude, b.magnitude)
        assert a.magnitude.dtype == np.float64 and (a.K, a.rowwise) == (b.K, b.rowwise)
    want = xb.double().abs() @ wb.double().abs().T
    np.testing.assert_array_equal(_st("linear", (xb, wb), dtype=torch.bfloat16).magnitude, want.numpy())


def test_non_finite_inputs_give_non_finite_magnitudes_where_the_op_is():
    a = np.ones((3, 4), np.float16)
    a[1, 2] = np.inf
    st = _st("matmul", (a, np.ones((4, 2), np.float16)))
    assert np.isinf(st.magnitude[1]).all() and np.isfinite(st.magnitude[[0, 2]]).all()
    x = np.ones((2, 5), np.float16)
    x[0, 1] = np.nan
    sm = _st("softmax", (x, -1)).magnitude
    assert np.isnan(sm[0]).all() and np.isfinite(sm[1]).all()


@pytest.mark.parametrize("op, args, params, exc, pattern", [
    ("matmul", (np.ones((2, 3)),), {}, TypeError, r"matmul\(input, other\).*other"),
    ("matmul", (np.ones((2, 3)), np.ones((4, 2))), {}, ValueError,
     r"matmul: the inner dimensions of 'input'.*\(2, 3\)"),
    ("mm", (np.ones((2, 3)), np.ones((3,))), {}, ValueError, r"mm: argument 'mat2' must have 2 dimensions.*\(3,\)"),
    ("linear", (np.ones((2, 3)), "w"), {}, TypeError, r"linear: argument 'weight' .*'w'"),
    ("softmax", (np.ones((2, 3)),), {"dim": 2}, ValueError, r"softmax: argument 'dim'.*got 2"),
    ("softmax", (np.ones((2, 3)), -1), {"dims": 1}, TypeError, r"softmax.*dims"),
    ("layer_norm", (np.ones((2, 3)), (4,)), {}, ValueError, r"layer_norm: argument 'normalized_shape'.*\(4,\)"),
    ("conv2d", (np.ones((1, 4, 5, 5)), np.ones((2, 3, 3, 3))), {}, ValueError, r"conv2d: input.*groups=1"),
    ("conv1d", (np.ones((1, 2, 5)), np.ones((2, 2, 3))), {"padding": "same", "stride": 2}, ValueError,
     r"conv1d: argument 'padding'.*'same'"),
    ("conv1d", (np.ones((1, 2, 5)), np.ones((2, 2, 3))), {"padding": "full"}, ValueError, r"'padding'.*'full'"),
    ("group_norm", (np.ones((2, 6, 3)), 4), {}, ValueError, r"group_norm: argument 'num_groups'.*got 4"),
    ("gelu", (np.ones(3),), {"approximate": "fast"}, ValueError, r"gelu: argument 'approximate'.*'fast'"),
    ("gelu", (np.ones(3, dtype=complex),), {}, TypeError, r"gelu: argument 'input' must be a real"),
    ("sum", (np.ones((2, 3)),), {"dim": (0, 0)}, ValueError, r"sum: argument 'dim' names a dimension twice"),
])
def test_wrong_arguments_name_the_op_the_argument_and_the_value(op, args, params, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _st(op, args, params)
    # the same errors where the magnitude would come from a reference
    with pytest.raises(exc, match=pattern):
        ops.op_statistics(op, args, params, dtype="float16", reference=np.ones(np.shape(args[0])))


def test_bad_dtype_and_inputs_container_are_refused():
    with pytest.raises(ValueError, match="dtype"):
        _st("relu", (np.ones(2),), dtype="float13")
    with pytest.raises(TypeError, match="sequence"):
        _st("relu", np.ones(2))


def test_op_statistics_holds_a_float64_magnitude_and_k_at_least_one():
    st = _st("sum", (np.ones((2, 0)), 1))
    assert st.K == 1.0 and st.magnitude.shape == (2,)
    with pytest.raises(ValueError, match="K"):
        ops.OpStatistics(np.ones(2), 0.5, False)


# ------------------------------------------------------------------ the noise model

def _z_max(out, ref, st, dtype):
    return record_statistics(out, ref, dtype=dtype, magnitude=st.magnitude, K=st.K, rowwise=st.rowwise)


def test_end_to_end_torch_matmul_and_softmax_scores_match_the_corpus_model_and_are_small(torch):
    corpus = pytest.importorskip("tolstat.corpus")
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(32, 256, generator=g) * 10).half()
    b = torch.randn(256, 48, generator=g).half()
    out = (a.float() @ b.float()).half()  # fp16 storage, fp32 accumulation: a correct kernel
    ref = (a.double() @ b.double()).numpy()
    st = _st("torch.matmul", (a, b))
    old = np.abs(a.double().numpy()) @ np.abs(b.double().numpy())  # the corpus's formula
    np.testing.assert_array_equal(noise_scale(ref, dtype="float16", magnitude=st.magnitude, K=st.K),
                                  noise_scale(ref, dtype="float16", magnitude=old, K=256))
    np.testing.assert_array_equal(st.magnitude, corpus.MAGNITUDES["matmul"](a=a.numpy(), b=b.numpy()))
    good = _z_max(out, ref, st, "float16")
    assert good["op_max"] < 2 and good["op_rms"] < 0.5
    bad = (a[:, :224].float() @ b[:224].float()).half()  # the last K tile dropped
    assert _z_max(bad, ref, st, "float16")["op_max"] > 20

    x = torch.randn(16, 300, generator=g).half() * 4
    out = torch.softmax(x.float(), -1).half()
    ref = torch.softmax(x.double(), -1).numpy()
    st = _st("F.softmax", (x,), {"dim": -1})
    assert st.rowwise and st.K == 300
    case_like = corpus.MAGNITUDES["softmax"](x=x.numpy())
    np.testing.assert_array_equal(noise_scale(ref, dtype="float16", magnitude=st.magnitude, K=st.K),
                                  noise_scale(ref, dtype="float16", magnitude=case_like, K=300))
    good = _z_max(out, ref, st, "float16")
    assert good["op_max"] < 2 and good["op_row_rms_max"] < 1
    off = (out.double() * (1 + 2.0 ** -8)).half()  # a 0.4% relative error (a few ULPs)
    assert _z_max(off, ref, st, "float16")["op_max"] > 3


# ------------------------------------------------------- the corpus computes through ops

def _old_models():
    """The corpus's magnitude formulas as they were before tolstat.ops (the reference)."""
    from tolstat.corpus._linalg import _conv_ref
    from tolstat.corpus._rowwise import _rms_ref, _softmax_ref

    tiny32, u32 = float(np.finfo(np.float32).tiny), 2.0 ** -24

    def layer_norm(x, weight, bias, eps):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return ((np.abs(x - mu) + np.abs(x).mean(-1, keepdims=True)) / np.sqrt(var + eps)
                * np.abs(weight) + np.abs(bias))

    def cumsum(x):
        n = x.shape[-1]
        return np.cumsum(np.abs(x), axis=-1) * np.sqrt(np.arange(1, n + 1) / n)

    def attention(q, k, v, causal):
        s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1])
        if causal:
            Sq, Sk = s.shape[-2:]
            s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return np.matmul(p / p.sum(-1, keepdims=True), np.abs(v))

    def log_softmax(x):
        m = x.max(-1, keepdims=True)
        return np.abs(x - m) + np.log(np.exp(x - m).sum(-1, keepdims=True)) + 1.0

    return {
        "matmul": lambda a, b: np.abs(a) @ np.abs(b), "bmm": lambda a, b: np.abs(a) @ np.abs(b),
        "linear": lambda x, w, bias: np.abs(x) @ np.abs(w).T + np.abs(bias),
        "conv1d": lambda x, w, bias: _conv_ref(np.abs(x), np.abs(w), np.abs(bias)),
        "softmax": _softmax_ref, "log_softmax": log_softmax, "layer_norm": layer_norm,
        "rms_norm": lambda x, weight, eps: np.abs(_rms_ref(x, weight, eps)),
        "mean": lambda x: np.abs(x).mean(-1, keepdims=True), "cumsum": cumsum, "attention": attention,
        "gelu": lambda x: 0.5 * np.abs(x) * (1.0 + np.abs(special.erf(x / np.sqrt(2.0)))),
        "silu": lambda x: np.maximum(np.abs(x * special.expit(x)), np.abs(x) * (tiny32 / u32)),
    }, {"softmax", "log_softmax", "layer_norm", "rms_norm", "cumsum", "attention"}


def test_corpus_magnitudes_are_the_old_formulas_and_k_is_the_case_covariate():
    corpus = pytest.importorskip("tolstat.corpus")
    from tolstat.corpus._magnitude import _CALLS

    old, rowwise = _old_models()
    assert set(old) == set(corpus.OPS) and corpus.ROWWISE == rowwise
    for op in corpus.OPS:
        for dtype in ("float16", "bfloat16"):
            for case in corpus.cases(op, dtype, n=4, seed=3, quick=True):
                xs = {k: v.astype(np.float64) for k, v in case.cast_inputs(dtype).items()}
                with np.errstate(all="ignore"):
                    want = old[op](**xs, **case.params)
                got = corpus.run_magnitude(case, dtype)
                assert got.shape == want.shape, op
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=op)
                name, call = _CALLS[op]
                args, kwargs = call(**case.cast_inputs(dtype), **case.params)
                st = _st(name, args, kwargs, dtype)
                assert st.K == case.covariates["K"] and st.rowwise == (op in rowwise), op
            np.testing.assert_allclose(corpus.MAGNITUDES[op](**xs, **case.params), want, rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------ docs

def test_docs_table_lists_every_op_with_its_aliases():
    text = (ROOT / "docs" / "ops.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", text, re.M)}
    builtin = {n for n in ops.names() if ops.get(n).signature is not None}  # not a user's (docs snippets)
    assert set(REQUIRED) <= builtin and set(rows) == builtin
    for name in builtin:
        for a in ops.aliases(name):
            assert f"`{a}`" in rows[name], (name, a)
    assert "ops" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8").split()


# ------------------------------------------------------- magnitudes from the reference

def _sm64(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _reference_cases(x):
    """(op, args, params, float64 reference) of the ops with a reference identity, on ``x``."""
    x64 = x.astype(np.float64)
    w = (1 + 0.2 * _rng(5).standard_normal(x.shape[-1])).astype(x.dtype)
    with np.errstate(all="ignore"):
        return [
            ("gelu", (x,), {}, 0.5 * x64 * (1 + special.erf(x64 / math.sqrt(2)))),
            ("gelu", (x,), {"approximate": "tanh"},
             0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))),
            ("silu", (x,), {}, x64 * special.expit(x64)),
            ("sigmoid", (x,), {}, special.expit(x64)),
            ("tanh", (x,), {}, np.tanh(x64)),
            ("softmax", (x,), {"dim": -1}, _sm64(x64)),
            ("softmax", (x, 0), {}, _sm64(x64, 0)),
            ("log_softmax", (x,), {"dim": -1}, np.log(_sm64(x64))),
            ("rms_norm", (x, (x.shape[-1],), w), {"eps": 1e-6},
             x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w.astype(np.float64)),
        ]


@pytest.mark.parametrize("shape", [(6, 37), (40, 512)])  # numpy, and the kernels from 4,096 elements
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_magnitude_from_the_reference_is_the_magnitude_from_the_inputs(shape, dtype):
    x = (_rng(1).standard_normal(shape) * 3).astype(dtype)
    x.flat[:6] = [np.inf, -np.inf, 0.0, -0.0, 1e-30, -70.0]  # overflow, underflow and signed zeros
    for op, args, params, ref in _reference_cases(x):
        got = ops.op_statistics(op, args, params, dtype="bfloat16", reference=ref)
        want = ops.op_statistics(op, args, params, dtype="bfloat16")
        assert (got.K, got.rowwise) == (want.K, want.rowwise)
        a, b = got.magnitude, want.magnitude
        assert a.shape == b.shape and a.dtype == np.float64
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=op)
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b), err_msg=op)
        fin = np.isfinite(b)
        np.testing.assert_allclose(a[fin], b[fin], rtol=4e-16, atol=0, err_msg=f"{op} {params}")


def test_magnitude_from_the_reference_is_not_the_reference_where_the_op_on_absolute_inputs_is_larger():
    x = np.array([-3.0, -0.5, 0.0, 2.0], np.float16)
    ref = 0.5 * x * (1 + special.erf(x / math.sqrt(2)))
    m = ops.op_statistics("gelu", (x,), dtype="float16", reference=ref).magnitude
    np.testing.assert_allclose(m, 0.5 * np.abs(x) * (1 + np.abs(special.erf(x / math.sqrt(2)))), rtol=1e-15)
    assert m[0] > 2.9 and ref[0] < 0.01


def test_a_reference_of_another_shape_is_not_used():
    x = _h(4, 8)
    st = ops.op_statistics("softmax", (x, -1), dtype="float16", reference=np.full((8,), 7.0))
    np.testing.assert_array_equal(st.magnitude, _st("softmax", (x, -1)).magnitude)
    st = ops.op_statistics("gelu", (x,), dtype="float16", reference=np.full((4, 1), 7.0))
    assert st.magnitude.shape == (4, 8)


def test_torch_inputs_and_references_give_the_magnitude_of_the_inputs(torch):
    x = _h(16, 300, seed=3)
    t = torch.from_numpy(x).to(torch.bfloat16)
    x64 = t.double().numpy()
    for op, ref in (("gelu", torch.nn.functional.gelu(t.double())), ("softmax", torch.softmax(t.double(), -1))):
        params = {"dim": -1} if op == "softmax" else {}
        got = ops.op_statistics(op, (t,), params, dtype="bfloat16", reference=ref).magnitude
        want = ops.op_statistics(op, (x64,), params, dtype="bfloat16").magnitude
        np.testing.assert_allclose(got, want, rtol=1e-15)


def test_a_user_model_without_an_identity_ignores_the_reference(scratch_registry):
    ops.register("my_double", ops.multilinear(lambda a: 2 * a))
    x = _h(3, 5)
    st = ops.op_statistics("my_double", (x,), dtype="float16", reference=np.zeros((3, 5)))
    np.testing.assert_array_equal(st.magnitude, 2 * np.abs(x.astype(np.float64)))


def test_a_user_model_with_an_identity_uses_it_and_its_statistics_bind_the_call_once(scratch_registry, monkeypatch):
    model = ops.OpModel(magnitude=lambda args, kw, dt: np.abs(np.asarray(args[0], np.float64)),
                        K=lambda args, kw: 1.0,
                        from_reference=lambda args, kw, ref, dt: np.abs(ref) + 1.0)
    ops.register("my_abs", model)
    x = _h(3, 5)
    st = ops.op_statistics("my_abs", (x,), dtype="float16", reference=np.zeros((3, 5)))
    np.testing.assert_array_equal(st.magnitude, np.ones((3, 5)))
    with pytest.raises(TypeError, match="from_reference must be callable"):
        ops.OpModel(magnitude=model.magnitude, K=model.K, from_reference=3)
    # a built-in model binds the call to the torch signature once for magnitude, K and rows
    from tolstat.ops import _args

    calls = []
    real = _args.Call.__init__

    def counting(self, *a, **k):
        calls.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(_args.Call, "__init__", counting)
    ops.op_statistics("softmax", (x,), {"dim": -1}, dtype="float16", reference=np.zeros((3, 5)))
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape, ns", [((40, 512), (512,)), ((3, 5, 700), (700,)), ((4, 6, 300), (6, 300))])
@pytest.mark.parametrize("affine", ["both", "none", "bias"])
def test_layer_norm_magnitude_of_large_inputs_is_the_formula(dtype, shape, ns, affine):
    # from 4,096 elements a numba pass per row computes it (sums reassociated)
    from tolstat.ops._reductions import _ln_rows

    rng = _rng(7)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    x.flat[:3] = [np.inf, 0.0, -0.0]
    x[-1, ..., 5] = np.nan
    w = (1 + 0.2 * rng.standard_normal(ns)).astype(dtype)
    b = (0.2 * rng.standard_normal(ns)).astype(dtype)
    args = {"both": (x, ns, w, b), "none": (x, ns), "bias": (x, ns, None, b)}[affine]
    got = ops.op_statistics("layer_norm", args, {"eps": 1e-5}, dtype="float16").magnitude
    n = math.prod(ns)
    rows = x.astype(np.float64).reshape(-1, n)
    wv = np.abs(w.astype(np.float64)).reshape(n) if affine == "both" else 1.0
    bv = np.abs(b.astype(np.float64)).reshape(n) if affine != "none" else 0.0
    with np.errstate(all="ignore"):
        want = _ln_rows(rows, wv, bv, 1e-5).reshape(shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-14, atol=0)


@pytest.mark.parametrize("spec", ["input, dim=None, _stacklevel=3, dtype=None", "input, other, *, alpha=1",
                                  "input, normalized_shape, weight=None, bias=None, eps=1e-05",
                                  "input, dim, *, dtype=None"])
def test_a_call_binds_its_arguments_as_inspect_does(spec):
    from tolstat.ops._args import Call, signature

    sig = signature(spec)
    names = list(sig.parameters)
    rng = _rng(11)
    for _ in range(300):
        n_pos = int(rng.integers(0, len(names) + 2))
        args = tuple(f"p{i}" for i in range(n_pos))
        kw = {str(k): "k" for k in rng.choice(names + ["bogus"], size=int(rng.integers(0, 3)))}
        try:
            bound = sig.bind(*args, **kw)
        except TypeError:
            with pytest.raises(TypeError, match=re.escape(f"op{sig}: ")):
                Call("op", sig, args, kw)
            continue
        bound.apply_defaults()
        got = Call("op", sig, args, kw).arguments
        assert got == dict(bound.arguments) and list(got) == list(bound.arguments)


@pytest.mark.parametrize("op, params, shape", [("softmax", {"dim": -1}, (6, 1024)), ("softmax", {"dim": -1}, (3, 40)),
                                               ("gelu", {}, (5000,)), ("log_softmax", {"dim": -1}, (4, 64))])
def test_calibration_and_check_both_take_the_magnitude_from_the_reference(op, params, shape, monkeypatch):
    import tolstat

    seen = []  # the reference each op_statistics call of collect and check gets
    real = ops.op_statistics

    def spy(*args, **kwargs):
        seen.append(kwargs.get("reference"))
        return real(*args, **kwargs)

    def pair(seed):
        x = _h(*shape, seed=seed, scale=2.0)
        x64 = x.astype(np.float64)
        # references rounded otherwise than the models' own formulas, so that the magnitude
        # from the reference and the one from the inputs differ in their last bits
        if op == "gelu":
            f = lambda v: 0.5 * v * special.erfc(-v / math.sqrt(2))  # noqa: E731
        else:
            lse = lambda v: special.logsumexp(v, axis=-1, keepdims=True)  # noqa: E731
            f = (lambda v: np.exp(v - lse(v))) if op == "softmax" else (lambda v: v - lse(v))  # noqa: E731
        return (x,), f(x.astype(np.float32).astype(np.float64)).astype(np.float16), f(x64)

    items, hand, differ = [], [], 0
    for i in range(120):
        inputs, out, ref = pair(i)
        items.append({"actual": out, "expected": ref, "inputs": inputs, "params": params})
        st = ops.op_statistics(op, inputs, params, dtype="float16", reference=ref)
        hand.append({"actual": out, "expected": ref, "magnitude": st.magnitude, "covariates": {"K": st.K}})
        differ += int((st.magnitude != ops.op_statistics(op, inputs, params, dtype="float16").magnitude).any())
    assert differ > 60  # the two ways of computing the magnitude are told apart
    opts = tolstat.CollectOptions(progress=False)
    monkeypatch.setattr(ops, "op_statistics", spy)
    ds = tolstat.from_pairs(items, op=op, dtype="float16", hardware="cpu", options=opts)
    assert len(seen) == len(items) and all(np.array_equal(r, it["expected"]) for r, it in zip(seen, items))
    monkeypatch.setattr(ops, "op_statistics", real)
    ref_ds = tolstat.from_pairs(hand, op=op, dtype="float16", hardware="cpu",
                                options=tolstat.CollectOptions(progress=False, rowwise=op != "gelu"))
    for name in ["op_max", "op_rms", "op_bias", "K"]:
        np.testing.assert_array_equal(ds[name].values, ref_ds[name].values, err_msg=name)
    table = tolstat.select(ds, fp_budget=0.05)
    inputs, out, ref = pair(1000)
    monkeypatch.setattr(ops, "op_statistics", spy)
    r = tolstat.check(out, ref, op=op, dtype="float16", table=table, hardware="cpu", inputs=inputs, params=params)
    monkeypatch.setattr(ops, "op_statistics", real)
    assert np.array_equal(seen[-1], ref)
    st = ops.op_statistics(op, inputs, params, dtype="float16", reference=ref)
    given = tolstat.check(out, ref, op=op, dtype="float16", table=table, hardware="cpu", covariates={"K": st.K},
                          options=tolstat.CheckOptions(magnitude=st.magnitude))
    assert r.statistics == given.statistics and r.passed == given.passed
    # the magnitude from the inputs gives the same statistics up to rounding
    m_in = ops.op_statistics(op, inputs, params, dtype="float16").magnitude
    from_inputs = tolstat.check(out, ref, op=op, dtype="float16", table=table, hardware="cpu",
                                covariates={"K": st.K}, options=tolstat.CheckOptions(magnitude=m_in))
    for k, v in r.statistics.items():
        assert v == pytest.approx(from_inputs.statistics[k], rel=1e-12, abs=0), k
