"""Matrix-multiply family: matmul, batched matmul, linear (+bias), conv1d.

All kernels model a tensor-core GEMM: float16/bfloat16 operands (their products are exact
in float32), float32 accumulation over K-blocks, one rounding to the storage dtype when
the output tile is stored.
"""

from __future__ import annotations

import numpy as np

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
    store_trunc,
)

BK = 32  # BLOCK_K of the default tiled kernels
BN = 32  # BLOCK_N of the linear epilogue


# --------------------------------------------------------------------------- GEMM core

def _gemm_f32(a32: np.ndarray, b32: np.ndarray, block_k: int, *, k_end: int | None = None,
              assign: bool = False, acc_dtype: np.dtype | None = None) -> np.ndarray:
    """float32 accumulator of ``a @ b`` over K-blocks (batched over leading axes).

    ``assign``/``k_end``/``acc_dtype`` exist to express bugs: overwrite instead of
    accumulate, stop early, keep the accumulator in a storage dtype.
    """
    K = a32.shape[-1]
    k_end = K if k_end is None else k_end
    shape = np.broadcast_shapes(a32.shape[:-2], b32.shape[:-2]) + (a32.shape[-2], b32.shape[-1])
    acc = np.zeros(shape, F32)
    if acc_dtype is not None:
        acc = acc.astype(acc_dtype)
    for k0 in range(0, k_end, block_k):
        k1 = min(k0 + block_k, k_end)
        part = np.matmul(a32[..., :, k0:k1], b32[..., k0:k1, :])
        if assign:
            acc = part
        elif acc_dtype is not None:
            acc = (acc.astype(F32) + part).astype(acc_dtype)
        else:
            acc += part
    return acc.astype(F32)


def _splitk_partials(a32, b32, splits, block_k):
    K = a32.shape[-1]
    bounds = np.linspace(0, K, splits + 1).astype(int)
    # split boundaries aligned to block_k as real split-K kernels do
    bounds = [min(K, -(-int(x) // block_k) * block_k) for x in bounds]
    bounds[-1] = K
    return [_gemm_f32(a32[..., :, s:e], b32[..., s:e, :], block_k)
            for s, e in zip(bounds[:-1], bounds[1:]) if e > s]


def mm_tiled(a, b, block_k=BK):
    """Tiled GEMM: float32 accumulation over K-blocks of ``block_k``, one store."""
    return store(_gemm_f32(f32(a), f32(b), block_k), a.dtype)


def mm_splitk_f32(a, b, splits=4, block_k=BK):
    """Split-K GEMM: ``splits`` partial sums in a float32 workspace, then reduced."""
    parts = _splitk_partials(f32(a), f32(b), splits, block_k)
    acc = parts[0]
    for p in parts[1:]:
        acc = acc + p
    return store(acc, a.dtype)


def mm_splitk_atomic(a, b, splits=4, block_k=BK, _store=store):
    """Split-K GEMM as in Triton's split-K tutorial: each split ``atomic_add``s its
    partial into the output in the storage dtype (one rounding per split)."""
    dt = a.dtype
    parts = _splitk_partials(f32(a), f32(b), splits, block_k)
    out = np.zeros(parts[0].shape, dt)
    for p in parts:
        out = _store(out.astype(F32) + p, dt)
    return out


def _matmul_variants():
    return {
        "tiled_bk32": lambda a, b: mm_tiled(a, b, 32),
        "tiled_bk128": lambda a, b: mm_tiled(a, b, 128),
        "splitk4_f32": lambda a, b: mm_splitk_f32(a, b, 4),
        "splitk4_atomic": lambda a, b: mm_splitk_atomic(a, b, 4),
    }


# ------------------------------------------------------------------------------ matmul

def _matmul_ref(a, b):
    """a @ b"""
    return a @ b


def _matmul_case(dims, dist, scale, seed):
    rng = np.random.default_rng(seed)
    M, K, N = dims["M"], dims["K"], dims["N"]
    a = draw(rng, (M, K), dist, scale)
    b = draw(rng, (K, N), dist, 1.0)
    return new_case("matmul", dims, dist, scale, seed, {"a": a, "b": b}, (M, N), K)


_MM_CONFIGS = [
    dict(M=16, K=8, N=16), dict(M=33, K=64, N=64), dict(M=64, K=127, N=48),
    dict(M=7, K=512, N=96), dict(M=64, K=2048, N=64), dict(M=128, K=256, N=128),
    dict(M=1, K=100, N=3),
]

register_op(OpSpec(
    name="matmul",
    reference=reference_from(_matmul_ref),
    variants=_matmul_variants(),
    make_case=_matmul_case,
    configs=_MM_CONFIGS,
    quick_configs=[_MM_CONFIGS[i] for i in (0, 1, 2, 6)],
    description="C[M,N] = A[M,K] @ B[K,N]; A carries the input scale, B unit scale",
))


def _bug_acc_assign(a, b):
    return store(_gemm_f32(f32(a), f32(b), BK, assign=True), a.dtype)


def _bug_drop_k_tail(a, b):
    K = a.shape[-1]
    return store(_gemm_f32(f32(a), f32(b), BK, k_end=K - K % BK if K >= BK else K), a.dtype)


def _bug_fp16_acc(a, b):
    return store(_gemm_f32(f32(a), f32(b), BK, acc_dtype=a.dtype), a.dtype)


def _bug_wrong_stride_b(a, b):
    K, N = b.shape
    flat = b.reshape(-1)
    idx = np.arange(K)[:, None] * K + np.arange(N)[None, :]  # row stride K, not N
    ok = idx < flat.size  # masked load beyond the buffer returns 0
    bad = np.where(ok, flat[np.minimum(idx, flat.size - 1)], np.zeros((), b.dtype))
    return mm_tiled(a, bad.astype(b.dtype), BK)


def _bug_splitk_trunc(a, b):
    return mm_splitk_atomic(a, b, 4, _store=store_trunc)


def _K(case):
    return case.dims["K"]


register_bug(BugSpec(
    "matmul_acc_assign", "matmul", _bug_acc_assign,
    "`acc = tl.dot(a, b)` instead of `acc += tl.dot(a, b)` in the K loop: only the last "
    "K-block survives", "shape-dependent", "tiled_bk32",
    exact_when=lambda c: _K(c) <= BK, trigger="K > BLOCK_K (32)"))
register_bug(BugSpec(
    "matmul_drop_k_tail", "matmul", _bug_drop_k_tail,
    "K loop runs `range(0, K // BLOCK_K * BLOCK_K, BLOCK_K)`: the last partial K tile is "
    "dropped", "shape-dependent", "tiled_bk32",
    exact_when=lambda c: _K(c) % BK == 0 or _K(c) < BK, trigger="K % 32 != 0 and K > 32"))
register_bug(BugSpec(
    "matmul_lowp_acc", "matmul", _bug_fp16_acc,
    "accumulator declared in the storage dtype (fp16/bf16) instead of float32: rounded "
    "after every K-block", "subtle", "tiled_bk32",
    exact_when=lambda c: _K(c) <= BK, trigger="K > 32; grows with K, large for bf16"))
register_bug(BugSpec(
    "matmul_wrong_stride_b", "matmul", _bug_wrong_stride_b,
    "B indexed with row stride K instead of N (`stride_bk` mixed up): right only for "
    "square B", "shape-dependent", "tiled_bk32",
    exact_when=lambda c: c.dims["K"] == c.dims["N"], trigger="K != N"))
register_bug(BugSpec(
    "matmul_splitk_trunc_store", "matmul", _bug_splitk_trunc,
    "split-K atomic adds into the fp16/bf16 output truncate (round toward zero) instead "
    "of rounding to nearest even", "subtle", "splitk4_atomic",
    trigger="always; a drift of up to ~1 ULP per split, toward zero"))


# ------------------------------------------------------------------------------- bmm

def _bmm_case(dims, dist, scale, seed):
    rng = np.random.default_rng(seed)
    B, M, K, N = dims["B"], dims["M"], dims["K"], dims["N"]
    a = draw(rng, (B, M, K), dist, scale)
    b = draw(rng, (B, K, N), dist, 1.0)
    return new_case("bmm", dims, dist, scale, seed, {"a": a, "b": b}, (B, M, N), K)


_BMM_CONFIGS = [
    dict(B=1, M=16, K=64, N=16), dict(B=4, M=33, K=127, N=17), dict(B=8, M=32, K=512, N=32),
    dict(B=3, M=64, K=64, N=64), dict(B=2, M=7, K=1000, N=9),
]

register_op(OpSpec(
    name="bmm",
    reference=reference_from(_matmul_ref),
    variants={
        "tiled_bk32": lambda a, b: mm_tiled(a, b, 32),
        "tiled_bk64": lambda a, b: mm_tiled(a, b, 64),
        "splitk2_f32": lambda a, b: mm_splitk_f32(a, b, 2),
    },
    make_case=_bmm_case,
    configs=_BMM_CONFIGS,
    quick_configs=[_BMM_CONFIGS[i] for i in (0, 1, 3)],
    description="C[B,M,N] = A[B,M,K] @ B[B,K,N] (one GEMM per batch entry)",
))


def _bug_bmm_batch_stride(a, b):
    return mm_tiled(a, np.broadcast_to(b[:1], b.shape), BK)


register_bug(BugSpec(
    "bmm_b_batch_stride_zero", "bmm", _bug_bmm_batch_stride,
    "batch offset of B never added (`b_ptr + pid_b * stride_bb` missing): every batch "
    "multiplies by B[0]", "shape-dependent", "tiled_bk32",
    exact_when=lambda c: c.dims["B"] == 1, trigger="batch > 1"))


# ---------------------------------------------------------------------------- linear

def _linear_ref(x, w, bias):
    """x @ w.T + bias"""
    return x @ w.T + bias


def _linear_case(dims, dist, scale, seed):
    rng = np.random.default_rng(seed)
    M, K, N = dims["M"], dims["K"], dims["N"]
    x = draw(rng, (M, K), dist, scale)
    w = draw(rng, (N, K), dist, 1.0)
    bias = draw(rng, (N,), "normal", scale)
    return new_case("linear", dims, dist, scale, seed, {"x": x, "w": w, "bias": bias},
                    (M, N), K)


def _linear_fused(x, w, bias):
    acc = _gemm_f32(f32(x), f32(w).T, BK)
    return store(acc + f32(bias), x.dtype)


def _linear_unfused(x, w, bias):
    y = store(_gemm_f32(f32(x), f32(w).T, BK), x.dtype)  # GEMM output stored
    return store(f32(y) + f32(bias), x.dtype)  # separate bias-add kernel


def _linear_bias_init(x, w, bias):
    acc = np.broadcast_to(f32(bias), (x.shape[0], w.shape[0])).copy()  # acc starts at bias
    return store(_acc_from(acc, f32(x), f32(w).T, 64), x.dtype)


def _acc_from(acc, a32, b32, block_k):
    for k0 in range(0, a32.shape[-1], block_k):
        acc += a32[:, k0:k0 + block_k] @ b32[k0:k0 + block_k]
    return acc


_LIN_CONFIGS = [
    dict(M=16, K=64, N=64), dict(M=33, K=127, N=50), dict(M=8, K=512, N=96),
    dict(M=64, K=1024, N=40), dict(M=5, K=8, N=3),
]

register_op(OpSpec(
    name="linear",
    reference=reference_from(_linear_ref),
    variants={
        "fused_epilogue": _linear_fused,
        "unfused_bias": _linear_unfused,
        "bias_init_bk64": _linear_bias_init,
    },
    make_case=_linear_case,
    configs=_LIN_CONFIGS,
    quick_configs=[_LIN_CONFIGS[i] for i in (0, 1, 4)],
    description="y[M,N] = x[M,K] @ w[N,K].T + bias[N] (PyTorch layout)",
))


def _bug_bias_twice(x, w, bias):
    acc = np.broadcast_to(f32(bias), (x.shape[0], w.shape[0])).copy()
    acc = _acc_from(acc, f32(x), f32(w).T, BK)
    return store(acc + f32(bias), x.dtype)


def _bug_bias_tail(x, w, bias):
    N = w.shape[0]
    b = f32(bias).copy()
    b[(N // BN) * BN:] = 0.0  # bias load masked with `offs_n + BLOCK_N <= N`
    return store(_gemm_f32(f32(x), f32(w).T, BK) + b, x.dtype)


register_bug(BugSpec(
    "linear_bias_twice", "linear", _bug_bias_twice,
    "bias both used to initialise the accumulator and added again in the epilogue",
    "gross", "fused_epilogue", trigger="always"))
register_bug(BugSpec(
    "linear_bias_tail_tile", "linear", _bug_bias_tail,
    "bias load masked per whole tile (`offs_n + BLOCK_N <= N`): the last partial column "
    "tile gets no bias", "shape-dependent", "fused_epilogue",
    exact_when=lambda c: c.dims["N"] % BN == 0, trigger="N % 32 != 0"))


# ---------------------------------------------------------------------------- conv1d

def _same_pad(kw):
    left = (kw - 1) // 2
    return left, kw - 1 - left


def _im2col(x, kw, left, right):
    """(B, C, L) -> (B, C*kw, L) columns, index c*kw + t."""
    Bn, C, L = x.shape
    xp = np.zeros((Bn, C, L + left + right), x.dtype)
    xp[:, :, left:left + L] = x
    cols = np.stack([xp[:, :, t:t + L] for t in range(kw)], axis=2)  # B, C, kw, L
    return cols.reshape(Bn, C * kw, L)


def _conv_ref(x, w, bias):
    """cross-correlation with 'same' padding (PyTorch conv1d, padding='same')"""
    Cout, C, kw = w.shape
    left, right = _same_pad(kw)
    cols = _im2col(x, kw, left, right)
    return np.matmul(w.reshape(Cout, C * kw), cols) + bias[None, :, None]


def _conv_im2col(x, w, bias, _pad=None, _flip=False):
    Cout, C, kw = w.shape
    left, right = _pad or _same_pad(kw)
    w32 = f32(w)[:, :, ::-1] if _flip else f32(w)
    cols = _im2col(f32(x), kw, left, right)
    acc = _gemm_f32(np.ascontiguousarray(w32).reshape(Cout, C * kw), cols, BK)
    return store(acc + f32(bias)[None, :, None], x.dtype)


def _conv_direct(x, w, bias):
    Cout, C, kw = w.shape
    Bn, _, L = x.shape
    left, right = _same_pad(kw)
    xp = np.zeros((Bn, C, L + kw - 1), F32)
    xp[:, :, left:left + L] = f32(x)
    w32 = f32(w)
    acc = np.zeros((Bn, Cout, L), F32)
    for t in range(kw):  # one GEMM (K = C) per filter tap
        acc += np.matmul(w32[:, :, t], xp[:, :, t:t + L])
    return store(acc + f32(bias)[None, :, None], x.dtype)


def _conv_case(dims, dist, scale, seed):
    rng = np.random.default_rng(seed)
    B, C, L, Co, kw = dims["B"], dims["Cin"], dims["L"], dims["Cout"], dims["Kw"]
    x = draw(rng, (B, C, L), dist, scale)
    w = draw(rng, (Co, C, kw), dist, 1.0)
    bias = draw(rng, (Co,), "normal", scale)
    return new_case("conv1d", dims, dist, scale, seed, {"x": x, "w": w, "bias": bias},
                    (B, Co, L), C * kw, extra_cov={"Kw": kw})


_CONV_CONFIGS = [
    dict(B=2, Cin=4, L=16, Cout=8, Kw=3), dict(B=1, Cin=16, L=64, Cout=16, Kw=4),
    dict(B=2, Cin=32, L=100, Cout=24, Kw=5), dict(B=4, Cin=3, L=33, Cout=5, Kw=1),
    dict(B=1, Cin=64, L=128, Cout=32, Kw=2), dict(B=2, Cin=8, L=257, Cout=8, Kw=7),
]

register_op(OpSpec(
    name="conv1d",
    reference=reference_from(_conv_ref),
    variants={"im2col_gemm": _conv_im2col, "direct_taps": _conv_direct},
    make_case=_conv_case,
    configs=_CONV_CONFIGS,
    quick_configs=[_CONV_CONFIGS[i] for i in (0, 1, 3)],
    description="y[B,Cout,L] = conv1d(x[B,Cin,L], w[Cout,Cin,Kw], bias), stride 1, "
                "padding='same' (cross-correlation); reduction K = Cin*Kw",
))


def _bug_conv_pad_swapped(x, w, bias):
    kw = w.shape[-1]
    left, right = _same_pad(kw)
    return _conv_im2col(x, w, bias, _pad=(right, left))


def _bug_conv_flipped(x, w, bias):
    return _conv_im2col(x, w, bias, _flip=True)


register_bug(BugSpec(
    "conv1d_same_pad_swapped", "conv1d", _bug_conv_pad_swapped,
    "'same' padding split as (Kw//2 left, (Kw-1)//2 right) instead of the reverse: output "
    "shifted by one for even kernels", "shape-dependent", "im2col_gemm",
    exact_when=lambda c: c.dims["Kw"] % 2 == 1, trigger="even kernel width"))
register_bug(BugSpec(
    "conv1d_flipped_kernel", "conv1d", _bug_conv_flipped,
    "true convolution (taps flipped) instead of the cross-correlation frameworks call "
    "conv", "gross", "im2col_gemm",
    exact_when=lambda c: c.dims["Kw"] == 1, trigger="Kw > 1"))
