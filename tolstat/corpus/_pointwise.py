"""Elementwise activations: gelu (erf form) and silu.

Correct kernels load, compute in float32 and store once. The ``no_upcast`` bugs compute in
the storage dtype (every intermediate rounded), as a kernel that forgets ``.to(float32)``.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from tolstat.corpus._base import (
    F32,
    BugSpec,
    OpSpec,
    draw,
    f32,
    new_case,
    reference_from,
    register_bug,
    register_op,
    store,
)

INV_SQRT2 = F32(0.7071067811865476)
SQRT_2_OVER_PI = F32(0.7978845608028654)
LOG2E = F32(1.4426950408889634)


def _pw_case(op):
    def make(dims, dist, scale, seed):
        rng = np.random.default_rng(seed)
        R, N = dims["R"], dims["N"]
        return new_case(op, dims, dist, scale, seed, {"x": draw(rng, (R, N), dist, scale)},
                        (R, N), 1)
    return make


_PW_CONFIGS = [dict(R=1, N=1), dict(R=7, N=13), dict(R=64, N=256), dict(R=3, N=1000),
               dict(R=128, N=128)]


# ------------------------------------------------------------------------------- gelu

def _gelu_ref(x):
    """0.5 x (1 + erf(x / sqrt(2)))"""
    return 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))


def gelu_erf(x, *, half=True):
    x32 = f32(x)
    y = x32 * (F32(1) + special.erf(x32 * INV_SQRT2))
    return store(F32(0.5) * y if half else y, x.dtype)


def gelu_erfc(x):
    """0.5 x erfc(-x / sqrt(2)): accurate in the negative tail (PyTorch CUDA style)."""
    x32 = f32(x)
    return store(F32(0.5) * x32 * special.erfc(-x32 * INV_SQRT2), x.dtype)


register_op(OpSpec(
    name="gelu",
    reference=reference_from(_gelu_ref),
    variants={"erf": gelu_erf, "erfc": gelu_erfc},
    make_case=_pw_case("gelu"),
    configs=_PW_CONFIGS,
    quick_configs=_PW_CONFIGS[:3],
    description="exact (erf) GELU, elementwise",
))


def _gelu_tanh(x):
    x32 = f32(x)
    inner = SQRT_2_OVER_PI * (x32 + F32(0.044715) * x32 * x32 * x32)
    return store(F32(0.5) * x32 * (F32(1) + np.tanh(inner)), x.dtype)


def _gelu_sigmoid(x):
    x32 = f32(x)
    return store(x32 / (F32(1) + np.exp(F32(-1.702) * x32)), x.dtype)


def _gelu_no_upcast(x):
    dt = x.dtype
    t = store(f32(x) * INV_SQRT2, dt)
    t = store(special.erf(f32(t)), dt)
    t = store(F32(1) + f32(t), dt)
    t = store(f32(x) * f32(t), dt)
    return store(F32(0.5) * f32(t), dt)


register_bug(BugSpec(
    "gelu_tanh_approx", "gelu", _gelu_tanh,
    "tanh approximation used where the erf GELU is specified", "subtle", "erf",
    trigger="|x| around 1-5; large relative error in the negative tail"))
register_bug(BugSpec(
    "gelu_missing_half", "gelu", lambda x: gelu_erf(x, half=False),
    "the factor 0.5 is missing", "gross", "erf", trigger="x != 0"))
register_bug(BugSpec(
    "gelu_sigmoid_approx", "gelu", _gelu_sigmoid,
    "x * sigmoid(1.702 x) approximation used where the erf GELU is specified", "gross", "erf",
    trigger="|x| around 0.5-5"))
register_bug(BugSpec(
    "gelu_no_upcast", "gelu", _gelu_no_upcast,
    "computed in the storage dtype (no upcast to float32): every intermediate rounded",
    "subtle", "erf", trigger="always, a few ULP"))


# ------------------------------------------------------------------------------- silu

def _silu_ref(x):
    """x * sigmoid(x)"""
    return x * special.expit(x)


def silu_exp(x, *, k=F32(1)):
    x32 = f32(x)
    return store(x32 / (F32(1) + np.exp(-k * x32)), x.dtype)


def silu_sigmoid_mul(x):
    """x * sigmoid(x) with the overflow-free sigmoid (exp of -|x| only)."""
    x32 = f32(x)
    e = np.exp(-np.abs(x32))
    sig = np.where(x32 >= 0, F32(1) / (F32(1) + e), e / (F32(1) + e))
    return store(x32 * sig, x.dtype)


def silu_exp2(x):
    """Triton fast-math: exp(-x) as exp2(-x * log2(e))."""
    x32 = f32(x)
    return store(x32 / (F32(1) + np.exp2(-x32 * LOG2E)), x.dtype)


register_op(OpSpec(
    name="silu",
    reference=reference_from(_silu_ref),
    variants={"div_exp": silu_exp, "mul_sigmoid": silu_sigmoid_mul, "exp2_fast": silu_exp2},
    make_case=_pw_case("silu"),
    configs=_PW_CONFIGS,
    quick_configs=_PW_CONFIGS[:3],
    description="SiLU x * sigmoid(x), elementwise",
))


def _silu_no_upcast(x):
    dt = x.dtype
    e = store(np.exp(-f32(x)), dt)  # overflows float16 for x < -11.1
    d = store(F32(1) + f32(e), dt)
    return store(f32(x) / f32(d), dt)


register_bug(BugSpec(
    "silu_sigmoid_2x", "silu", lambda x: silu_exp(x, k=F32(2)),
    "written as x * sigmoid(2x)", "gross", "div_exp", trigger="x != 0"))
register_bug(BugSpec(
    "silu_no_upcast", "silu", _silu_no_upcast,
    "sigmoid computed in the storage dtype: rounding of exp(-x) and 1 + exp(-x); exp "
    "overflows float16 for x < -11 (silu -> -0)", "subtle", "div_exp",
    trigger="always a few ULP; -0 for x < -11 in float16"))
