"""Scaled dot-product attention: naive (materialised P) and flash-style (online softmax).

Layout ``q[B, Sq, D]``, ``k[B, Sk, D]``, ``v[B, Sk, D]`` (B folds batch and heads). Causal
masking is top-left aligned and only generated with ``Sq == Sk``.
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
)

BLOCK_N = 64


def _attn_ref(q, k, v, causal):
    """softmax(q k^T / sqrt(D) [+ causal mask]) v"""
    D = q.shape[-1]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(D)
    if causal:
        Sq, Sk = s.shape[-2:]
        s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return np.matmul(p / p.sum(-1, keepdims=True), v)


def _mask(Sq, Sk, j0, width, causal, shift=0):
    """True where key j0 + c is visible from query r."""
    cols = j0 + np.arange(width)[None, :]
    ok = cols < Sk
    if causal:
        ok = ok & (cols <= np.arange(Sq)[:, None] + shift)
    return ok


def attention_naive(q, k, v, causal, *, sm_scale=None):
    """Materialised attention: S = q k^T accumulated in float32, softmax in float32, P
    stored in the storage dtype, O = P v accumulated in float32, stored."""
    dt = q.dtype
    D = q.shape[-1]
    sm = F32(1 / np.sqrt(D)) if sm_scale is None else F32(sm_scale)
    s = np.matmul(f32(q), np.swapaxes(f32(k), -1, -2)) * sm
    Sq, Sk = s.shape[-2:]
    if causal:
        s = np.where(_mask(Sq, Sk, 0, Sk, True), s, F32(-np.inf))
    e = np.exp(s - s.max(-1, keepdims=True))
    p = store(e / e.sum(-1, keepdims=True, dtype=F32), dt)
    return store(np.matmul(f32(p), f32(v)), dt)


def attention_flash(q, k, v, causal, *, block_n=BLOCK_N, sm_scale=None, rescale_acc=True,
                    mask_tail=True, causal_shift=0):
    """FlashAttention-2 forward (Triton tutorial): key/value blocks of ``block_n``,
    float32 running max ``m``, running sum ``l`` and accumulator rescaled by
    exp(m_old - m_new); P is converted to the storage dtype for the P @ V tensor-core
    product; O = acc / l stored once."""
    dt = q.dtype
    Bn, Sq, D = q.shape
    Sk = k.shape[1]
    sm = F32(1 / np.sqrt(D)) if sm_scale is None else F32(sm_scale)
    q32 = f32(q)
    n_pad = -(-Sk // block_n) * block_n
    k32 = np.zeros((Bn, n_pad, D), F32)
    v32 = np.zeros((Bn, n_pad, D), F32)
    k32[:, :Sk] = f32(k)
    v32[:, :Sk] = f32(v)
    m = np.full((Bn, Sq, 1), -np.inf, F32)
    l = np.zeros((Bn, Sq, 1), F32)
    acc = np.zeros((Bn, Sq, D), F32)
    for j0 in range(0, n_pad, block_n):
        s = np.matmul(q32, np.swapaxes(k32[:, j0:j0 + block_n], -1, -2)) * sm
        if mask_tail or causal:
            ok = _mask(Sq, Sk if mask_tail else n_pad, j0, block_n, causal, causal_shift)
            s = np.where(ok, s, F32(-np.inf))
        m_new = np.maximum(m, s.max(-1, keepdims=True))
        alpha = np.exp(m - m_new)
        p = np.exp(s - m_new)
        l = l * alpha + p.sum(-1, keepdims=True, dtype=F32)
        if rescale_acc:
            acc = acc * alpha
        acc = acc + np.matmul(f32(store(p, dt)), v32[:, j0:j0 + block_n])
        m = m_new
    return store(acc / l, dt)


def _attn_case(dims, dist, scale, seed):
    rng = np.random.default_rng(seed)
    B, Sq, Sk, D, causal = dims["B"], dims["Sq"], dims["Sk"], dims["D"], bool(dims["causal"])
    q = draw(rng, (B, Sq, D), dist, scale)
    k = draw(rng, (B, Sk, D), dist, 1.0)
    v = draw(rng, (B, Sk, D), dist, scale)
    return new_case("attention", dims, dist, scale, seed, {"q": q, "k": k, "v": v},
                    (B, Sq, D), Sk, extra_labels={"causal": str(int(causal))},
                    extra_cov={"D": D}, params={"causal": causal})


_ATT_CONFIGS = [
    dict(B=4, Sq=16, Sk=16, D=16, causal=1), dict(B=2, Sq=64, Sk=64, D=64, causal=0),
    dict(B=2, Sq=33, Sk=100, D=32, causal=0), dict(B=1, Sq=128, Sk=128, D=64, causal=1),
    dict(B=2, Sq=1, Sk=257, D=64, causal=0), dict(B=2, Sq=48, Sk=48, D=8, causal=1),
    dict(B=1, Sq=100, Sk=200, D=128, causal=0),
]

register_op(OpSpec(
    name="attention",
    reference=reference_from(_attn_ref),
    variants={
        "naive": attention_naive,
        "flash_bn64": attention_flash,
        "flash_bn32": lambda q, k, v, causal: attention_flash(q, k, v, causal, block_n=32),
    },
    make_case=_attn_case,
    configs=_ATT_CONFIGS,
    quick_configs=[_ATT_CONFIGS[i] for i in (0, 2, 5)],
    description="softmax(q k^T / sqrt(D)) v over q[B,Sq,D], k,v[B,Sk,D]; q and v carry the "
                "input scale, k unit scale; reduction K = Sk",
))


def _flash_bug(**kw):
    def kernel(q, k, v, causal):
        return attention_flash(q, k, v, causal, **kw)
    return kernel


def _no_scale(q, k, v, causal):
    return attention_flash(q, k, v, causal, sm_scale=1.0)


def _scale_dp1(q, k, v, causal):
    return attention_flash(q, k, v, causal, sm_scale=1 / np.sqrt(q.shape[-1] + 1))


register_bug(BugSpec(
    "attention_no_sm_scale", "attention", _no_scale,
    "softmax scale 1/sqrt(D) omitted", "gross", "flash_bn64", trigger="always"))
register_bug(BugSpec(
    "attention_scale_sqrt_d_plus_1", "attention", _scale_dp1,
    "softmax scale 1/sqrt(D + 1) instead of 1/sqrt(D)", "subtle", "flash_bn64",
    trigger="relative logit error ~1/(2D): visible for small D or large logits"))
register_bug(BugSpec(
    "attention_causal_off_by_one", "attention", _flash_bug(causal_shift=1),
    "causal mask `k_idx <= q_idx + 1`: each query also sees the next key",
    "gross", "flash_bn64",
    exact_when=lambda c: not c.params["causal"] or c.dims["Sq"] == 1,
    trigger="causal attention"))
register_bug(BugSpec(
    "flash_no_acc_rescale", "attention", _flash_bug(rescale_acc=False),
    "accumulator not rescaled by exp(m_old - m_new) after a running-max update "
    "(l is rescaled)", "shape-dependent", "flash_bn64",
    exact_when=lambda c: c.dims["Sk"] <= BLOCK_N, trigger="Sk > BLOCK_N (64)"))
register_bug(BugSpec(
    "flash_tail_unmasked", "attention", _flash_bug(mask_tail=False),
    "last key block not masked to -inf: zero-padded keys (logit 0) join the softmax sum",
    "shape-dependent", "flash_bn64",
    exact_when=lambda c: c.dims["Sk"] % BLOCK_N == 0 or c.params["causal"],
    trigger="Sk % 64 != 0, non-causal (the causal mask hides padded keys)"))
