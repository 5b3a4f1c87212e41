"""Tests of the embedded kernel corpus (tolstat.corpus)."""

from __future__ import annotations

import numpy as np
import pytest

from tolstat.corpus import (
    BUGS,
    CATEGORIES,
    OPS,
    SCALES,
    cases,
    cast,
    grid,
    make_case,
    run_kernel,
    store_trunc,
    ulp_distance,
)
from tolstat._base.dtypes import unit_roundoff
from tolstat.corpus._base import smallest_subnormal
from tolstat.corpus._linalg import _conv_ref

DTYPES = ("float16", "bfloat16")
E32 = 2.0**-24  # float32 unit roundoff
A = np.abs

REQUIRED_OPS = {"matmul", "bmm", "linear", "softmax", "log_softmax", "layer_norm",
                "rms_norm", "attention", "gelu", "silu", "mean", "cumsum", "conv1d"}


# ----------------------------------------------------------------------------- registry

def test_registry_sizes_and_consistency():
    assert REQUIRED_OPS <= set(OPS)
    assert len(OPS) >= 12
    assert len(BUGS) >= 20
    for name, spec in OPS.items():
        assert spec.name == name
        assert len(spec.variants) >= 2, name
        assert set(spec.scales) >= {1.0, 10.0, 100.0}
        assert spec.configs and spec.quick_configs
        assert all(c in spec.configs for c in spec.quick_configs)
        assert callable(spec.reference) and callable(spec.make_case)
    cats = set()
    for name, bug in BUGS.items():
        assert bug.name == name
        assert bug.op in OPS
        assert bug.base in OPS[bug.op].variants
        assert bug.category in CATEGORIES
        assert bug.description and "\n" not in bug.description
        if bug.category == "shape-dependent":
            assert bug.exact_when is not None, name
        cats.add(bug.category)
    assert cats == set(CATEGORIES)


def test_attention_has_naive_and_flash_variants():
    v = OPS["attention"].variants
    assert "naive" in v and any(k.startswith("flash") for k in v)


# -------------------------------------------------------------------------------- cases

@pytest.mark.parametrize("op", sorted(OPS))
def test_cases_deterministic(op):
    a = cases(op, "float16", n=5, seed=11)
    b = cases(op, "float16", n=5, seed=11)
    c = cases(op, "float16", n=5, seed=12)
    for x, y, z in zip(a, b, c):
        assert x.seed == y.seed != z.seed
        assert x.labels == y.labels and x.covariates == y.covariates
        for k in x.inputs:
            assert x.inputs[k].dtype == np.float64
            np.testing.assert_array_equal(x.inputs[k], y.inputs[k])
        assert any(not np.array_equal(x.inputs[k], z.inputs[k]) for k in x.inputs)
    # regenerating from the stored seed gives the same inputs
    x = a[3]
    r = make_case(op, x.dims, x.labels["dist"], float(x.labels["scale"]), x.seed)
    for k in x.inputs:
        np.testing.assert_array_equal(x.inputs[k], r.inputs[k])
    # kernels are deterministic; float16 and bfloat16 cases share inputs
    k0 = next(iter(OPS[op].variants.values()))
    for dt in DTYPES:
        assert run_kernel(k0, x, dt).tobytes() == run_kernel(k0, x, dt).tobytes()
    y16 = cases(op, "bfloat16", n=5, seed=11)[3]
    for k in x.inputs:
        np.testing.assert_array_equal(x.inputs[k], y16.inputs[k])


@pytest.mark.parametrize("op", sorted(OPS))
def test_cases_cover_grid_and_carry_labels(op):
    spec = OPS[op]
    g = grid(op)
    assert len(g) == len(spec.configs) * len(spec.dists) * len(spec.scales)
    keys = {(tuple(sorted(d.items())), dist, s) for d, dist, s in g}
    assert len(keys) == len(g)  # a bijection onto the product
    first = g[: len(spec.configs)]  # the first pass visits every shape once
    assert len({tuple(sorted(d.items())) for d, _, _ in first}) == len(spec.configs)
    cs = cases(op, "bfloat16", n=len(g), seed=0, quick=False)
    assert {c.covariates["scale"] for c in cs} == set(SCALES)
    assert {c.labels["dist"] for c in cs} == set(spec.dists)
    for c in cs[:6]:
        assert {"shape", "dist", "scale", "dims"} <= set(c.labels)
        assert {"K", "scale"} <= set(c.covariates)
        assert all(isinstance(v, str) for v in c.labels.values())
        assert all(isinstance(v, float) for v in c.covariates.values())


@pytest.mark.parametrize("dt", DTYPES)
def test_run_kernel_and_reference_shapes(dt):
    for op, spec in OPS.items():
        c = cases(op, dt, n=1, seed=0, quick=True)[0]
        ref = spec.reference(c, dt)
        assert ref.dtype == np.float64
        for k in spec.variants.values():
            y = run_kernel(k, c, dt)
            assert y.dtype == np.dtype(cast(np.zeros(1), dt).dtype)
            assert y.shape == ref.shape
            assert "x".join(map(str, y.shape)) == c.labels["shape"]


def test_reference_uses_inputs_rounded_to_dtype():
    c = cases("matmul", "float16", n=1, seed=0)[0]
    for dt in DTYPES:
        a = cast(c.inputs["a"], dt).astype(np.float64)
        b = cast(c.inputs["b"], dt).astype(np.float64)
        np.testing.assert_array_equal(OPS["matmul"].reference(c, dt), a @ b)
    assert not np.array_equal(OPS["matmul"].reference(c, "float16"),
                              OPS["matmul"].reference(c, "bfloat16"))


# ------------------------------------------------------------------------------ helpers

def test_cast_rounds_once_and_to_nearest_even():
    # float64 value just above a bfloat16 midpoint: a float32 detour would round it
    # down to the midpoint and then to even (1.0); the correct answer is 1 + 2**-7
    x = np.array([1.0 + 2.0**-8 + 2.0**-30, 1.0 + 2.0**-8, -(1.0 + 3 * 2.0**-8), 1e39, 1e-45])
    y = cast(x, "bfloat16").astype(np.float64)
    assert y[0] == 1.0 + 2.0**-7
    assert y[1] == 1.0  # tie to even
    assert y[2] == -(1.0 + 2.0**-6)  # tie to even, away from 1.0+2**-7 (odd)
    assert np.isinf(y[3])
    assert y[4] == 0.0
    z = cast(np.array([1.0 + 2.0**-11 + 2.0**-40]), "float16").astype(np.float64)
    assert z[0] == 1.0 + 2.0**-10


@pytest.mark.parametrize("dt", DTYPES)
def test_store_trunc_and_ulp_distance(dt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10000) * 10).astype(np.float32)
    rn = x.astype(cast(np.zeros(1), dt).dtype)
    tr = store_trunc(x, rn.dtype)
    assert np.all(A(tr.astype(np.float64)) <= A(x.astype(np.float64)))
    assert ulp_distance(rn, tr).max() == 1
    assert ulp_distance(tr, tr).max() == 0
    pz = np.zeros(1, rn.dtype)
    assert ulp_distance(pz, -pz)[0] == 0
    one = np.ones(1, rn.dtype)
    assert ulp_distance(one, np.nextafter(one, 2 * one))[0] == 1


# ------------------------------------------------- correct variants: rounding-scale error

def rounding_bound(case, dt, variant, ref):
    """Elementwise first-order error bound of a correct kernel.

    ``u |ref|`` for the final round-to-nearest store (more where the kernel stores
    intermediates: split-K atomics, unfused bias, Hugging Face RMSNorm, attention's P),
    plus a float32 accumulation term ``K * 2**-24 * magnitude``, plus half the dtype's
    subnormal spacing for outputs that underflow.
    """
    u = unit_roundoff(dt)
    fl = smallest_subnormal(dt) / 2
    X = {k: cast(v, dt).astype(np.float64) for k, v in case.inputs.items()}
    op, K = case.op, case.covariates["K"]
    if op in ("matmul", "bmm"):
        m2 = A(X["a"]) @ A(X["b"])
        extra = 3 * u * m2 if variant == "splitk4_atomic" else 0.0  # 4 stores, not 1
        return u * A(ref) + extra + K * E32 * m2 + fl
    if op == "linear":
        mm = A(X["x"]) @ A(X["w"]).T
        extra = u * mm if variant == "unfused_bias" else 0.0  # GEMM output stored first
        return u * A(ref) + extra + K * E32 * (mm + A(X["bias"])) + fl
    if op == "conv1d":
        m2 = _conv_ref(A(X["x"]), A(X["w"]), A(X["bias"]))
        return u * A(ref) + K * E32 * m2 + fl
    if op == "softmax":
        return (u + 4 * K * E32) * A(ref) + fl
    if op == "log_softmax":
        x = X["x"]
        m = x.max(-1, keepdims=True)
        m2 = A(x) + A(m) + A(ref - (x - m))
        return u * A(ref) + 4 * (K + 1) * E32 * m2 + fl
    if op == "layer_norm":
        x = X["x"]
        mu = x.mean(-1, keepdims=True)
        sd = np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + case.params["eps"])
        m2 = (A(x - mu) / sd + 1 + A(mu) / sd) * A(X["weight"]) + A(X["bias"])
        return u * A(ref) + 4 * (K + 4) * E32 * m2 + fl
    if op == "rms_norm":
        b = u * A(ref) + 4 * (K + 4) * E32 * A(ref) + fl
        if variant == "hf_cast_then_weight":  # x * rstd stored before the weight multiply
            b = b + u * A(ref) + fl * A(X["weight"])
        return b
    if op == "mean":
        m2 = A(X["x"]).mean(-1, keepdims=True)
        extra = u * m2 + fl if variant == "hierarchical" else 0.0  # chunk means stored
        return u * A(ref) + extra + K * E32 * m2 + fl
    if op == "cumsum":
        m2 = np.cumsum(A(X["x"]), -1)
        extra = u * m2 + fl if variant == "scan_then_propagate" else 0.0  # block scans stored
        return u * A(ref) + extra + K * E32 * m2 + fl
    if op == "attention":
        q, k, v = X["q"], X["k"], X["v"]
        D = q.shape[-1]
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
        sa = A(q) @ np.swapaxes(A(k), -1, -2) / np.sqrt(D)
        if case.params["causal"]:
            Sq, Sk = s.shape[-2:]
            s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None], s, -np.inf)
        sm = s - s.max(-1, keepdims=True)
        p = np.exp(sm)
        p /= p.sum(-1, keepdims=True)
        pv = p @ A(v)
        # float32 logits (dot, scale, max subtraction, exp) perturb p relatively by ds
        ds = (D + 4) * E32 * sa.max(-1, keepdims=True) + 4 * E32 * A(sm).max(-1, keepdims=True)
        # P is stored in the dtype for the P@V product: u relative, or the subnormal
        # spacing for tiny probabilities (l >= 1, so sum_j fl |v_j| bounds that part)
        p_store = u * pv + fl * A(v).sum(-2, keepdims=True)
        return u * A(ref) + p_store + 2 * ds * pv + K * E32 * pv + fl
    if op == "gelu":
        return u * A(ref) + 8 * E32 * (A(ref) + A(X["x"])) + fl
    if op == "silu":
        x = X["x"]
        b = u * A(ref) + 8 * E32 * A(ref) + fl
        if variant != "mul_sigmoid":
            # x / (1 + exp(-x)): exp(-x) overflows float32 for x < -88.7 and the output
            # becomes -0 although bfloat16 could hold silu(x) ~ -x e^x down to 1e-40
            b = b + np.where(x < -88.0, A(ref), 0.0)
        return b
    raise KeyError(op)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", sorted(OPS))
def test_correct_variants_within_rounding_error(op, dt):
    spec = OPS[op]
    cs = cases(op, dt, n=len(grid(op, quick=True)), seed=7, quick=True)
    for c in cs:
        ref = spec.reference(c, dt)
        assert np.all(np.isfinite(ref))
        for name, k in spec.variants.items():
            y = run_kernel(k, c, dt).astype(np.float64)
            assert np.all(np.isfinite(y)), (name, c.labels)
            ratio = np.max(A(y - ref) / rounding_bound(c, dt, name, ref))
            assert ratio <= 1.0, (name, c.labels, ratio)


@pytest.mark.parametrize("dt", DTYPES)
def test_large_reduction_variants_within_rounding_error(dt):
    # the long reductions the quick grid leaves out (K = 2048 matmul, N = 32768 mean)
    for op, dims in (("matmul", dict(M=64, K=2048, N=64)), ("mean", dict(R=2, N=32768)),
                     ("attention", dict(B=1, Sq=100, Sk=200, D=128, causal=0))):
        spec = OPS[op]
        for dist in spec.dists:
            c = make_case(op, dims, dist, 100.0, 5)
            ref = spec.reference(c, dt)
            for name, k in spec.variants.items():
                y = run_kernel(k, c, dt).astype(np.float64)
                assert np.max(A(y - ref) / rounding_bound(c, dt, name, ref)) <= 1.0, name


def test_variants_actually_differ():
    # correct variants are not all the same computation: on some case they round differently
    for op, spec in OPS.items():
        if len(spec.variants) < 2:
            continue
        outs_differ = False
        for c in cases(op, "float16", n=len(grid(op)), seed=1):
            outs = [run_kernel(k, c, "float16").tobytes() for k in spec.variants.values()]
            if len(set(outs)) > 1:
                outs_differ = True
                break
        assert outs_differ, op


# ----------------------------------------------------------------------------- the bugs

def _full_cases(op, dt):
    return cases(op, dt, n=len(grid(op)), seed=3)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_bug_differs_from_its_correct_kernel(bug, dt):
    b = BUGS[bug]
    base = OPS[b.op].variants[b.base]
    for c in _full_cases(b.op, dt):
        if ulp_distance(run_kernel(b.kernel, c, dt), run_kernel(base, c, dt)).max() > 1:
            return
    pytest.fail(f"{bug} never differs by more than 1 ULP from {b.base} in {dt}")


@pytest.mark.parametrize("bug", sorted(b for b in BUGS if BUGS[b].exact_when is not None))
def test_bug_exact_where_claimed(bug):
    b = BUGS[bug]
    base = OPS[b.op].variants[b.base]
    for dt in DTYPES:
        claimed = 0
        for c in _full_cases(b.op, dt):
            if b.exact_when(c):
                claimed += 1
                y, r = run_kernel(b.kernel, c, dt), run_kernel(base, c, dt)
                assert y.tobytes() == r.tobytes(), (bug, dt, c.labels)
        assert claimed > 0, f"{bug}: no case in the grid where it is claimed exact"
