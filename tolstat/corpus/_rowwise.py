"""Row-wise kernels: softmax, log_softmax, layer_norm, rms_norm, mean, cumsum.

Each models a Triton-style program per row: a row is loaded in BLOCK-wide tiles (masked
lanes get the load's ``other`` value), statistics are accumulated in float32 (lane-wise
across tiles, then a tree reduction over lanes) and the output is stored once.
"""

from __future__ import annotations

import numpy as np

from tolstat.corpus._base import (
    F32,
    BugSpec,
    OpSpec,
    DISTS,
    draw,
    f32,
    new_case,
    next_pow2,
    pad_cols,
    reference_from,
    register_bug,
    register_op,
    store,
)

LOG2E = F32(1.4426950408889634)
LN2 = F32(0.6931471805599453)


def _exp(x):
    return np.exp(x)


def _exp_fast(x):
    """``tl.exp`` as Triton lowers it: ex2(x * log2(e)) in float32."""
    return np.exp2(x * LOG2E)


def _lane_sum(xp: np.ndarray, block: int) -> np.ndarray:
    """Accumulate a padded row tile by tile into BLOCK float32 lanes, then tree-sum lanes."""
    R, n = xp.shape
    acc = xp.reshape(R, n // block, block).sum(axis=1, dtype=F32)  # sequential over tiles
    return acc.sum(axis=-1, keepdims=True, dtype=F32)


def _row_case(op, dists=DISTS, extra=None):
    def make(dims, dist, scale, seed):
        rng = np.random.default_rng(seed)
        R, N = dims["R"], dims["N"]
        inputs = {"x": draw(rng, (R, N), dist, scale)}
        params = {}
        if extra:
            inputs.update(extra(rng, N))
        if op == "layer_norm":
            params = {"eps": 1e-5}
        elif op == "rms_norm":
            params = {"eps": 1e-6}
        return new_case(op, dims, dist, scale, seed, inputs,
                        (R, 1) if op == "mean" else (R, N), N, params=params)

    return make


_SOFTMAX_CONFIGS = [
    dict(R=8, N=1), dict(R=3, N=7), dict(R=16, N=128), dict(R=8, N=256), dict(R=2, N=1025),
    dict(R=32, N=100), dict(R=4, N=3000),
]
_SOFTMAX_QUICK = [_SOFTMAX_CONFIGS[i] for i in (1, 2, 5)]


# ---------------------------------------------------------------------------- softmax

def _softmax_ref(x):
    """softmax over the last axis"""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_single_block(x, *, pad=-np.inf, sub_max=True):
    """Triton tutorial softmax: one tile of BLOCK = next_pow2(N) lanes per row."""
    N = x.shape[-1]
    xp = pad_cols(f32(x), next_pow2(N), pad)
    m = xp.max(-1, keepdims=True) if sub_max else F32(0)
    e = _exp(xp - m)
    s = e.sum(-1, keepdims=True, dtype=F32)
    return store(e[:, :N] / s, x.dtype)


def _online_stats(x32, block, exp, rescale=True):
    xp = pad_cols(x32, block, -np.inf)
    R = xp.shape[0]
    m = np.full((R, 1), -np.inf, F32)
    l = np.zeros((R, 1), F32)
    for j in range(0, xp.shape[-1], block):
        t = xp[:, j:j + block]
        mn = np.maximum(m, t.max(-1, keepdims=True))
        p = exp(t - mn).sum(-1, keepdims=True, dtype=F32)
        l = l * exp(m - mn) + p if rescale else l + p
        m = mn
    return m, l


def softmax_online(x, block=128, rescale=True):
    """Online-normaliser softmax (Milakov & Gimelshein): tiles of ``block``, running max
    and rescaled running sum in one pass, then a second pass writing exp(x - m) / l."""
    x32 = f32(x)
    m, l = _online_stats(x32, block, _exp_fast, rescale)
    return store(_exp_fast(x32 - m) / l, x.dtype)


def softmax_two_pass(x, block=256):
    """Multi-pass tiled softmax: max pass, lane-wise sum pass, write pass with 1/sum."""
    x32 = f32(x)
    m = x32.max(-1, keepdims=True)
    e = _exp(pad_cols(x32, block, -np.inf) - m)
    s = _lane_sum(e, block)
    return store(_exp(x32 - m) * (F32(1) / s), x.dtype)


_is_pow2 = lambda n: n & (n - 1) == 0  # noqa: E731

register_op(OpSpec(
    name="softmax",
    reference=reference_from(_softmax_ref),
    variants={"single_block": softmax_single_block, "online": softmax_online,
              "two_pass": softmax_two_pass},
    make_case=_row_case("softmax"),
    configs=_SOFTMAX_CONFIGS,
    quick_configs=_SOFTMAX_QUICK,
    description="softmax over the last axis of x[R,N]; reduction K = N",
))

register_bug(BugSpec(
    "softmax_pad_zero", "softmax", lambda x: softmax_single_block(x, pad=0.0),
    "tail mask loads 0.0 instead of -inf for padding lanes: exp(0 - max) joins the sum",
    "shape-dependent", "single_block",
    exact_when=lambda c: _is_pow2(c.dims["N"]), trigger="N not a power of two"))
register_bug(BugSpec(
    "softmax_no_max_sub", "softmax", lambda x: softmax_single_block(x, sub_max=False),
    "row max not subtracted before exp: float32 overflow (inf/inf = NaN) once x > 88",
    "gross", "single_block", trigger="large input scale (x > 88)"))
register_bug(BugSpec(
    "softmax_online_no_rescale", "softmax", lambda x: softmax_online(x, rescale=False),
    "online softmax adds a tile's sum without rescaling the running sum by "
    "exp(m_old - m_new)", "shape-dependent", "online",
    exact_when=lambda c: c.dims["N"] <= 128, trigger="N > BLOCK (128) and the max moves"))


# ------------------------------------------------------------------------ log_softmax

def _log_softmax_ref(x):
    """log_softmax over the last axis"""
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def log_softmax_two_pass(x, block=256, *, add_max=True):
    x32 = f32(x)
    m = x32.max(-1, keepdims=True)
    s = _lane_sum(_exp(pad_cols(x32, block, -np.inf) - m), block)
    if not add_max:
        return store(x32 - np.log(s), x.dtype)
    return store((x32 - m) - np.log(s), x.dtype)


def log_softmax_online(x, block=128):
    x32 = f32(x)
    m, l = _online_stats(x32, block, _exp_fast)
    return store((x32 - m) - np.log2(l) * LN2, x.dtype)


register_op(OpSpec(
    name="log_softmax",
    reference=reference_from(_log_softmax_ref),
    variants={"two_pass": log_softmax_two_pass, "online": log_softmax_online},
    make_case=_row_case("log_softmax"),
    configs=_SOFTMAX_CONFIGS,
    quick_configs=_SOFTMAX_QUICK,
    description="log_softmax over the last axis of x[R,N]: (x - m) - log(sum exp(x - m))",
))


def _bug_log_of_softmax(x):
    p = softmax_single_block(x)  # materialised in the storage dtype
    return store(np.log(f32(p)), x.dtype)


register_bug(BugSpec(
    "log_softmax_log_of_softmax", "log_softmax", _bug_log_of_softmax,
    "log(softmax(x)) with the softmax stored in fp16/bf16 first: precision lost near 0, "
    "-inf where probabilities underflow", "subtle", "two_pass",
    trigger="always ~1e-3 abs error; -inf at large scale"))
register_bug(BugSpec(
    "log_softmax_lse_no_max", "log_softmax",
    lambda x: log_softmax_two_pass(x, add_max=False),
    "logsumexp returned as log(sum(exp(x - m))) without adding m back", "gross", "two_pass",
    trigger="row max != 0"))


# ------------------------------------------------------------------------- layer_norm

def _ln_ref(x, weight, bias, eps):
    """layer_norm over the last axis (biased variance)"""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


def layer_norm_two_pass(x, weight, bias, eps, block=256, *, ddof=0, eps_override=None,
                        one_pass=False):
    """Triton tutorial layer norm: lane-wise mean pass, lane-wise variance pass."""
    N = x.shape[-1]
    x32 = f32(x)
    xp = pad_cols(x32, block, 0.0)
    mean = _lane_sum(xp, block) / F32(N)
    if one_pass:
        var = _lane_sum(xp * xp, block) / F32(N) - mean * mean
    else:
        d = np.where(np.arange(xp.shape[-1]) < N, xp - mean, F32(0))
        var = _lane_sum(d * d, block) / F32(N - ddof)
    e = F32(eps if eps_override is None else eps_override)
    rstd = F32(1) / np.sqrt(var + e)
    return store((x32 - mean) * rstd * f32(weight) + f32(bias), x.dtype)


def layer_norm_welford(x, weight, bias, eps, block=128):
    """Tile-wise statistics merged with Chan's parallel Welford update (apex/PyTorch)."""
    N = x.shape[-1]
    x32 = f32(x)
    R = x32.shape[0]
    mean = np.zeros((R, 1), F32)
    m2 = np.zeros((R, 1), F32)
    n = F32(0)
    for j in range(0, N, block):
        t = x32[:, j:j + block]
        nt = F32(t.shape[-1])
        mt = t.sum(-1, keepdims=True, dtype=F32) / nt
        m2t = ((t - mt) ** 2).sum(-1, keepdims=True, dtype=F32)
        tot = n + nt
        delta = mt - mean
        mean = mean + delta * (nt / tot)
        m2 = m2 + m2t + delta * delta * (n * nt / tot)
        n = tot
    rstd = F32(1) / np.sqrt(m2 / F32(N) + F32(eps))
    return store((x32 - mean) * rstd * f32(weight) + f32(bias), x.dtype)


def _ln_extra(rng, N):
    return {"weight": 1.0 + 0.1 * rng.standard_normal(N), "bias": 0.1 * rng.standard_normal(N)}


_LN_CONFIGS = [
    dict(R=4, N=7), dict(R=16, N=64), dict(R=8, N=256), dict(R=3, N=1000), dict(R=2, N=4096),
    dict(R=32, N=33),
]

register_op(OpSpec(
    name="layer_norm",
    reference=reference_from(_ln_ref),
    variants={"two_pass": layer_norm_two_pass, "welford": layer_norm_welford},
    make_case=_row_case("layer_norm", extra=_ln_extra),
    configs=_LN_CONFIGS,
    quick_configs=[_LN_CONFIGS[i] for i in (0, 1, 5)],
    dists=DISTS + ("offset",),
    description="layer_norm over the last axis of x[R,N] with weight, bias, eps=1e-5",
))

register_bug(BugSpec(
    "layer_norm_eps_1e-6", "layer_norm",
    lambda x, weight, bias, eps: layer_norm_two_pass(x, weight, bias, eps, eps_override=1e-6),
    "eps hard-coded as 1e-6 instead of the specified 1e-5", "subtle", "two_pass",
    trigger="rows whose variance is within ~100x of eps"))
register_bug(BugSpec(
    "layer_norm_unbiased_var", "layer_norm",
    lambda x, weight, bias, eps: layer_norm_two_pass(x, weight, bias, eps, ddof=1),
    "variance divided by N-1 (torch.var default) instead of N", "subtle", "two_pass",
    trigger="relative error 1/(2N): visible for short rows"))
register_bug(BugSpec(
    "layer_norm_one_pass_var", "layer_norm",
    lambda x, weight, bias, eps: layer_norm_two_pass(x, weight, bias, eps, one_pass=True),
    "variance as E[x^2] - E[x]^2 in float32: catastrophic cancellation when |mean| >> std",
    "subtle", "two_pass", trigger="offset inputs (mean >> std)"))


# --------------------------------------------------------------------------- rms_norm

def _rms_ref(x, weight, eps):
    """x / sqrt(mean(x^2) + eps) * weight"""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def rms_norm_single_block(x, weight, eps, *, mode="ok", read_past_end=False):
    N = x.shape[-1]
    x32 = f32(x)
    B = next_pow2(N)
    xp = pad_cols(x32, B, 0.0)
    if read_past_end and B > N:
        # mask `offs <= N`: lane N loads the next row's first element (0 past the buffer)
        nxt = np.zeros(x32.shape[0], F32)
        nxt[:-1] = x32[1:, 0]
        xp = xp.copy()
        xp[:, N] = nxt
    ms = (xp * xp).sum(-1, keepdims=True, dtype=F32) / F32(N)
    e = F32(eps)
    if mode == "eps_outside":
        rstd = F32(1) / (np.sqrt(ms) + e)
    elif mode == "no_sqrt":
        rstd = F32(1) / (ms + e)
    else:
        rstd = F32(1) / np.sqrt(ms + e)
    w = f32(weight) + F32(1) if mode == "weight_offset" else f32(weight)
    return store(x32 * rstd * w, x.dtype)


def rms_norm_blocked(x, weight, eps, block=256):
    N = x.shape[-1]
    x32 = f32(x)
    xp = pad_cols(x32, block, 0.0)
    ms = _lane_sum(xp * xp, block) / F32(N)
    rstd = F32(1) / np.sqrt(ms + F32(eps))
    return store(x32 * rstd * f32(weight), x.dtype)


def rms_norm_hf(x, weight, eps):
    """Hugging Face LlamaRMSNorm: normalise in float32, cast to the input dtype, then
    multiply by the weight (a second rounding)."""
    x32 = f32(x)
    ms = np.mean(x32 * x32, axis=-1, keepdims=True, dtype=F32)
    h = store(x32 / np.sqrt(ms + F32(eps)), x.dtype)
    return store(f32(weight) * f32(h), x.dtype)


def _rms_extra(rng, N):
    return {"weight": 1.0 + 0.1 * rng.standard_normal(N)}


register_op(OpSpec(
    name="rms_norm",
    reference=reference_from(_rms_ref),
    variants={"single_block": rms_norm_single_block, "blocked": rms_norm_blocked,
              "hf_cast_then_weight": rms_norm_hf},
    make_case=_row_case("rms_norm", extra=_rms_extra),
    configs=_LN_CONFIGS,
    quick_configs=[_LN_CONFIGS[i] for i in (0, 1, 5)],
    description="RMSNorm over the last axis of x[R,N] with weight, eps=1e-6",
))

register_bug(BugSpec(
    "rms_norm_eps_outside_sqrt", "rms_norm",
    lambda x, weight, eps: rms_norm_single_block(x, weight, eps, mode="eps_outside"),
    "x / (sqrt(mean(x^2)) + eps) instead of x / sqrt(mean(x^2) + eps)", "subtle",
    "single_block", trigger="rows with mean(x^2) near eps (tiny rows)"))
register_bug(BugSpec(
    "rms_norm_no_sqrt", "rms_norm",
    lambda x, weight, eps: rms_norm_single_block(x, weight, eps, mode="no_sqrt"),
    "divides by mean(x^2) + eps: the sqrt is missing", "gross", "single_block",
    trigger="mean(x^2) != 1"))
register_bug(BugSpec(
    "rms_norm_read_past_end", "rms_norm",
    lambda x, weight, eps: rms_norm_single_block(x, weight, eps, read_past_end=True),
    "load mask `offs <= N` instead of `offs < N`: one element past the row end joins the "
    "sum of squares", "shape-dependent", "single_block",
    exact_when=lambda c: _is_pow2(c.dims["N"]), trigger="N not a power of two"))
register_bug(BugSpec(
    "rms_norm_weight_plus_one", "rms_norm",
    lambda x, weight, eps: rms_norm_single_block(x, weight, eps, mode="weight_offset"),
    "scales by (1 + weight) (Gemma convention) where the weight is stored directly",
    "gross", "single_block", trigger="always"))


# ------------------------------------------------------------------------------- mean

def _mean_ref(x):
    """mean over the last axis (keepdims)"""
    return x.mean(-1, keepdims=True)


MB = 256


def mean_blocked(x, block=MB, *, drop_tail=False, lowp_acc=False, div_padded=False):
    N = x.shape[-1]
    x32 = f32(x)
    if drop_tail:
        x32 = x32[:, : (N // block) * block]
    xp = pad_cols(x32, block, 0.0)
    R, n = xp.shape
    tiles = xp.reshape(R, n // block, block)
    if lowp_acc:
        acc = np.zeros((R, block), x.dtype)
        for j in range(tiles.shape[1]):
            acc = store(f32(acc) + tiles[:, j], x.dtype)
        total = f32(acc).sum(-1, keepdims=True, dtype=F32)
    else:
        total = tiles.sum(axis=1, dtype=F32).sum(-1, keepdims=True, dtype=F32)
    denom = -(-N // block) * block if div_padded else N
    return store(total / F32(denom), x.dtype)


def mean_pairwise(x):
    """numpy/PyTorch-CPU style: pairwise float32 sum, then divide."""
    x32 = f32(x)
    return store(x32.sum(-1, keepdims=True, dtype=F32) / F32(x.shape[-1]), x.dtype)


def mean_two_stage(x, chunk=1024):
    """Two-kernel reduction: per-chunk partial sums (tree) to a float32 workspace, then
    a sequential combine."""
    N = x.shape[-1]
    x32 = f32(x)
    total = np.zeros((x32.shape[0], 1), F32)
    for j in range(0, N, chunk):
        total = total + x32[:, j:j + chunk].sum(-1, keepdims=True, dtype=F32)
    return store(total / F32(N), x.dtype)


def mean_hierarchical(x, chunk=1024):
    """Two kernels with a stored intermediate: stage 1 writes per-chunk means in the
    storage dtype, stage 2 combines them weighted by chunk length in float32 (as
    ``x.view(R, C, N // C).mean(-1)`` then a weighted mean)."""
    N = x.shape[-1]
    x32 = f32(x)
    total = np.zeros((x32.shape[0], 1), F32)
    for j in range(0, N, chunk):
        t = x32[:, j:j + chunk]
        part = store(t.sum(-1, keepdims=True, dtype=F32) / F32(t.shape[-1]), x.dtype)
        total = total + f32(part) * F32(t.shape[-1])
    return store(total / F32(N), x.dtype)


_MEAN_CONFIGS = [
    dict(R=4, N=1), dict(R=8, N=7), dict(R=16, N=256), dict(R=4, N=1000), dict(R=2, N=4096),
    dict(R=2, N=32768), dict(R=64, N=33),
]

register_op(OpSpec(
    name="mean",
    reference=reference_from(_mean_ref),
    variants={"blocked": mean_blocked, "pairwise": mean_pairwise, "two_stage": mean_two_stage,
              "hierarchical": mean_hierarchical},
    make_case=_row_case("mean"),
    configs=_MEAN_CONFIGS,
    quick_configs=[_MEAN_CONFIGS[i] for i in (1, 2, 3)],
    description="mean over the last axis of x[R,N] -> [R,1]; reduction K = N",
))

register_bug(BugSpec(
    "mean_drop_tail_block", "mean", lambda x: mean_blocked(x, drop_tail=True),
    "loop `for j in range(N // BLOCK)`: the last partial block is never loaded",
    "shape-dependent", "blocked",
    exact_when=lambda c: c.dims["N"] % MB == 0, trigger="N % 256 != 0"))
register_bug(BugSpec(
    "mean_lowp_acc", "mean", lambda x: mean_blocked(x, lowp_acc=True),
    "lane accumulators kept in the storage dtype instead of float32", "subtle", "blocked",
    exact_when=lambda c: c.dims["N"] <= MB, trigger="N > 256; grows with N"))
register_bug(BugSpec(
    "mean_div_padded_len", "mean", lambda x: mean_blocked(x, div_padded=True),
    "sum divided by the padded length (n_blocks * BLOCK) instead of N",
    "shape-dependent", "blocked",
    exact_when=lambda c: c.dims["N"] % MB == 0, trigger="N % 256 != 0"))


# ----------------------------------------------------------------------------- cumsum

def _cumsum_ref(x):
    """inclusive prefix sum over the last axis"""
    return np.cumsum(x, axis=-1)


CB = 64


def _hillis_steele(t):
    y = t.copy()
    d = 1
    while d < y.shape[-1]:
        y[..., d:] = y[..., d:] + y[..., :-d].copy()
        d *= 2
    return y


def cumsum_scan_then_propagate(x, block=CB):
    """Classic two-kernel GPU scan (GPU Gems 3, ch. 39): kernel 1 scans each block and
    writes it to the output (storage dtype) plus block sums to a float32 buffer; kernel 2
    adds the scanned block offsets to the stored output (a second rounding)."""
    N = x.shape[-1]
    xp = pad_cols(f32(x), block, 0.0)
    R, n = xp.shape
    tiles = xp.reshape(R, n // block, block)
    within = store(np.cumsum(tiles, axis=-1, dtype=F32), x.dtype)
    bsum = tiles.sum(-1, dtype=F32)
    c = np.zeros((R, n // block), F32)
    if n // block > 1:
        c[:, 1:] = np.cumsum(bsum[:, :-1], axis=-1, dtype=F32)
    out = f32(within) + c[..., None]
    return store(out.reshape(R, n)[:, :N], x.dtype)


def cumsum_blocked(x, block=CB, *, scan="seq", carry="sum", exclusive=False,
                   lowp_carry=False):
    N = x.shape[-1]
    xp = pad_cols(f32(x), block, 0.0)
    R, n = xp.shape
    tiles = xp.reshape(R, n // block, block)
    within = np.cumsum(tiles, axis=-1, dtype=F32) if scan == "seq" else _hillis_steele(tiles)
    bsum = tiles.sum(-1, dtype=F32) if carry == "sum" else within[..., -1]
    nb = tiles.shape[1]
    if carry == "none":
        c = np.zeros((R, nb), F32)
    elif lowp_carry:
        c = np.zeros((R, nb), F32)
        run = np.zeros(R, x.dtype)
        for j in range(1, nb):
            run = store(f32(run) + bsum[:, j - 1], x.dtype)
            c[:, j] = f32(run)
    else:
        c = np.zeros((R, nb), F32)
        if nb > 1:
            c[:, 1:] = np.cumsum(bsum[:, :-1], axis=-1, dtype=F32)
    out = (within + c[..., None]).reshape(R, n)[:, :N]
    if exclusive:
        out = np.concatenate([np.zeros((R, 1), F32), out[:, :-1]], axis=-1)
    return store(out, x.dtype)


_CS_CONFIGS = [
    dict(R=4, N=1), dict(R=8, N=7), dict(R=16, N=64), dict(R=4, N=255), dict(R=2, N=600),
    dict(R=32, N=128),
]

register_op(OpSpec(
    name="cumsum",
    reference=reference_from(_cumsum_ref),
    variants={
        "blocked_seq": cumsum_blocked,
        "blocked_tree": lambda x: cumsum_blocked(x, scan="tree", carry="last"),
        "scan_then_propagate": cumsum_scan_then_propagate,
    },
    make_case=_row_case("cumsum"),
    configs=_CS_CONFIGS,
    quick_configs=[_CS_CONFIGS[i] for i in (1, 2, 3)],
    description="inclusive prefix sum of x[R,N] along N: per-block scan (sequential or "
                "Hillis-Steele tree) plus a float32 carry from the previous blocks",
))

register_bug(BugSpec(
    "cumsum_exclusive", "cumsum", lambda x: cumsum_blocked(x, exclusive=True),
    "exclusive scan returned where an inclusive one is specified (output shifted by one)",
    "gross", "blocked_seq", trigger="always"))
register_bug(BugSpec(
    "cumsum_no_carry", "cumsum", lambda x: cumsum_blocked(x, carry="none"),
    "carry from previous blocks never added: each block restarts at 0",
    "shape-dependent", "blocked_seq",
    exact_when=lambda c: c.dims["N"] <= CB, trigger="N > BLOCK (64)"))
register_bug(BugSpec(
    "cumsum_lowp_carry", "cumsum", lambda x: cumsum_blocked(x, lowp_carry=True),
    "running carry between blocks kept in the storage dtype instead of float32", "subtle",
    "blocked_seq", exact_when=lambda c: c.dims["N"] <= CB, trigger="N > 64"))
