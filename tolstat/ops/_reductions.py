"""Models of the row-wise ops and reductions: softmax, log_softmax, layer_norm, rms_norm,
group_norm, sum, mean, var, cumsum, cross_entropy, scaled_dot_product_attention.

The reasoning behind each magnitude is in the docstring of :mod:`tolstat.ops`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from tolstat.ops._args import Call, is_torch
from tolstat.ops._pointwise import KERNEL_FROM, kernel_input
from tolstat.ops.model import OpModel, _torch_model

__all__: list[str] = []

#: (canonical name, model, aliases) of this module's ops, registered by tolstat.ops.registry
BUILTINS: list[tuple[str, OpModel, tuple[str, ...]]] = []


def _add(name: str, model: OpModel, aliases: tuple[str, ...] = ()) -> None:
    BUILTINS.append((name, model, tuple(aliases)))


def _along(x: np.ndarray, dim: int, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``fn`` applied to the rows of ``x`` along ``dim`` (moved to the last axis and back)."""
    if x.ndim == 0:
        return fn(x.reshape(1)).reshape(())
    if dim == x.ndim - 1:
        return fn(x)
    return np.moveaxis(fn(np.moveaxis(x, dim, -1)), -1, dim)


def _softmax_dim(c: Call, ndim: int) -> int:
    if c.raw("dim") is None:  # torch's legacy implicit dim (with a deprecation warning)
        return 0 if ndim in (0, 1, 3) else 1
    return c.dim("dim", ndim)


def _row_len(c: Call, dim: int) -> float:
    s = c.shape("input")
    return float(s[dim]) if s else 1.0


def _dim_is_last(c: Call) -> bool:
    n = len(c.shape("input"))
    return _softmax_dim(c, n) == max(n, 1) - 1


def _softmax_rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _log_softmax_rows(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return np.abs(x - m) + np.log(np.exp(x - m).sum(-1, keepdims=True)) + 1.0


def _rowwise_op(rows: Callable[[np.ndarray], np.ndarray]):
    def magnitude(c: Call, dtype: Any) -> np.ndarray:
        x = c.array("input")
        return np.abs(_along(x, _softmax_dim(c, x.ndim), rows))
    return magnitude


def _rowwise_ref(offset: float):
    """The magnitude from the reference: ``|softmax(x)|`` is ``|ref|``; log_softmax's
    ``|x - max| + log(sum exp(x - max)) + 1`` is ``|ref| + 1`` (``ref = (x - max) - lse``
    with ``x - max <= 0 <= lse``)."""
    def from_reference(c: Call, ref: np.ndarray, dtype: Any) -> np.ndarray | None:
        shape = c.shape("input")
        _softmax_dim(c, len(shape))  # the argument checks of the magnitude from the input
        if shape != ref.shape:
            return None
        if offset:
            m = np.abs(ref)
            m += offset
            return m
        # a softmax reference is >= 0 (NaN where the op's output is): |ref| is ref itself,
        # without a copy (a large one; the test costs more than the copy below
        # KERNEL_FROM); -0.0 reads as 0 wherever a magnitude is read (through its abs)
        return ref if ref.size >= KERNEL_FROM and ref.min() >= 0 else np.abs(ref)
    return from_reference


def _rowwise_k(c: Call) -> float:
    return _row_len(c, _softmax_dim(c, len(c.shape("input"))))


# ----------------------------------------------------------------------------- norms

def _normalized(c: Call) -> tuple[int, ...]:
    got = c.memo.get("normalized_shape")
    if got is None:
        got = c.memo["normalized_shape"] = _normalized_shape(c)
    return got


def _normalized_shape(c: Call) -> tuple[int, ...]:
    ns = c.raw("normalized_shape")
    ns = (ns,) if isinstance(ns, (int, np.integer)) and not isinstance(ns, bool) else ns
    try:
        out = tuple(int(v) for v in ns)
    except (TypeError, ValueError):
        raise c.error("normalized_shape", "must be an int or a sequence of ints") from None
    shape = c.shape("input")
    if not out or shape[len(shape) - len(out):] != out or len(out) > len(shape):
        raise c.error("normalized_shape", f"must be the trailing dimensions of the input (shape {shape})")
    return out


def _affine(c: Call, name: str, shape: tuple[int, ...], n: int, default: float) -> np.ndarray | float:
    a = c.optional(name)
    if a is None:
        return default
    if a.shape != shape:
        raise c.error(name, f"must have the normalized shape {shape}")
    return np.abs(a).reshape(n)


def _ln_rows(x: np.ndarray, w: Any, b: Any, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (np.abs(x - mu) + np.abs(x).mean(-1, keepdims=True)) / np.sqrt(var + eps) * w + b


def _layer_norm(c: Call, dtype: Any) -> np.ndarray:
    ns = _normalized(c)
    n = math.prod(ns)
    w, b = _affine(c, "weight", ns, n, 1.0), _affine(c, "bias", ns, n, 0.0)
    eps = c.number("eps")
    raw = c.raw("input")
    if isinstance(raw, np.ndarray) and raw.dtype in _LN_KERNEL_DTYPES and raw.size and n:
        return _ln_kernel(raw, n, w, b, eps)
    x = c.array("input")
    rows = x.reshape(x.shape[: x.ndim - len(ns)] + (n,))
    return _ln_rows(rows, w, b, eps).reshape(x.shape)


#: input formats that :func:`_ln_kernel` reads as they are (float16 decoded from its bits)
_LN_KERNEL_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _ln_kernel(x: np.ndarray, n: int, w: Any, b: Any, eps: float) -> np.ndarray:
    """:func:`_ln_rows` of a numpy input (any size) by :mod:`tolstat.ops._kernels` (one pass per row, no
    float64 copy of the input); the same values up to the rounding of the row sums."""
    from tolstat.ops._kernels import layer_norm_magnitude

    out = np.empty(x.shape)
    wa = w if isinstance(w, np.ndarray) else np.ones(1)
    ba = b if isinstance(b, np.ndarray) else np.zeros(1)
    layer_norm_magnitude(*kernel_input(x), n, np.ascontiguousarray(wa, dtype=np.float64),
                         np.ascontiguousarray(ba, dtype=np.float64), isinstance(w, np.ndarray),
                         isinstance(b, np.ndarray), float(eps), out.reshape(-1))
    return out


def _opmath_eps(x: Any) -> float:
    """``eps=None`` of torch's rms_norm: the machine epsilon of the input's compute type."""
    if is_torch(x):
        import torch  # noqa: PLC0415 - x is a tensor, torch is there

        ft = torch.finfo(x.dtype) if x.dtype.is_floating_point else torch.finfo(torch.float32)
        return float(torch.finfo(torch.float32).eps) if ft.bits <= 16 else float(ft.eps)
    dt = np.asarray(x).dtype
    return float(np.finfo(np.float64).eps) if dt == np.float64 else float(np.finfo(np.float32).eps)


def _rms_norm(c: Call, dtype: Any) -> np.ndarray:
    ns = _normalized(c)
    x = c.array("input")
    n = math.prod(ns)
    rows = x.reshape(x.shape[: x.ndim - len(ns)] + (n,))
    w = _affine(c, "weight", ns, n, 1.0)
    eps = _opmath_eps(c.raw("input")) if c.raw("eps") is None else c.number("eps")
    return np.abs(rows / np.sqrt((rows * rows).mean(-1, keepdims=True) + eps) * w).reshape(x.shape)


def _rms_norm_ref(c: Call, ref: np.ndarray, dtype: Any) -> np.ndarray | None:
    # |x / sqrt(mean(x^2) + eps) * w| is |ref|; the arguments checked as from the input
    ns = _normalized(c)
    _affine(c, "weight", ns, math.prod(ns), 1.0)
    if c.raw("eps") is not None:
        c.number("eps")
    return np.abs(ref) if c.shape("input") == ref.shape else None


def _norm_k(c: Call) -> float:
    return float(math.prod(_normalized(c)))


def _group_norm(c: Call, dtype: Any) -> np.ndarray:
    x = c.array("input")
    if x.ndim < 2:
        raise c.error("input", "must have at least 2 dimensions (N, C, *)")
    g = c.integer("num_groups", low=1)
    C = x.shape[1]
    if C % g:
        raise c.error("num_groups", f"must divide the number of channels {C}")
    rows = x.reshape(x.shape[0], g, -1)
    m = _ln_rows(rows, 1.0, 0.0, c.number("eps")).reshape(x.shape)
    cshape = (1, C) + (1,) * (x.ndim - 2)
    w, b = c.optional("weight"), c.optional("bias")
    for name, a in (("weight", w), ("bias", b)):
        if a is not None and a.shape != (C,):
            raise c.error(name, f"must have shape ({C},)")
    if w is not None:
        m = m * np.abs(w).reshape(cshape)
    return m if b is None else m + np.abs(b).reshape(cshape)


def _group_k(c: Call) -> float:
    s = c.shape("input")
    g = c.integer("num_groups", low=1)
    return float(math.prod(s[1:]) // g) if len(s) >= 2 else 1.0


# ------------------------------------------------------------------------ reductions

def _reduce(kind: str):
    def magnitude(c: Call, dtype: Any) -> np.ndarray:
        x = c.array("input")
        keep = c.flag("keepdim")
        if kind == "var":
            return _var(c, x, keep)
        axes = c.dims("dim", x.ndim)
        f = np.sum if kind == "sum" else np.mean
        return np.asarray(f(np.abs(x), axis=axes, keepdims=keep))
    return magnitude


def _var_args(c: Call) -> tuple[Any, int]:
    """(dim, correction) of torch.var's overloads: ``var(x, dim, unbiased, keepdim)``,
    ``var(x, dim, *, correction, keepdim)``, ``var(x, unbiased)``."""
    dim, unbiased, corr = c.raw("dim"), c.raw("unbiased"), c.raw("correction")
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    if unbiased is not None and corr is not None:
        raise c.error("correction", "cannot be given together with unbiased")
    if unbiased is not None:
        return dim, int(bool(unbiased))
    return dim, 1 if corr is None else int(c.number("correction"))


def _var(c: Call, x: np.ndarray, keep: bool) -> np.ndarray:
    dim, corr = _var_args(c)
    axes = tuple(range(x.ndim)) if dim is None else c.dims("dim", x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    mu = x.mean(axis=axes, keepdims=True)
    s = (np.abs(x - mu) * np.abs(x)).sum(axis=axes, keepdims=keep)
    return np.asarray(2.0 * s / max(n - corr, 0))


def _reduce_k(c: Call) -> float:
    s = c.shape("input")
    dim = c.raw("dim")
    if isinstance(dim, bool):  # var(x, unbiased)
        dim = None
    axes = c.dims("dim", len(s)) if dim is not None else tuple(range(len(s)))
    return float(math.prod(s[a] for a in axes))


def _cumsum_rows(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    return np.cumsum(np.abs(x), axis=-1) * np.sqrt(np.arange(1, n + 1) / n)


def _cumsum(c: Call, dtype: Any) -> np.ndarray:
    x = c.array("input")
    return _along(x, c.dim("dim", x.ndim), _cumsum_rows)


def _cumsum_k(c: Call) -> float:
    s = c.shape("input")
    return float(s[c.dim("dim", len(s))]) if s else 1.0


def _cumsum_last(c: Call) -> bool:
    n = len(c.shape("input"))
    return c.dim("dim", n) == max(n, 1) - 1


_add("softmax", _torch_model("softmax", "input, dim=None, _stacklevel=3, dtype=None", _rowwise_op(_softmax_rows),
                             _rowwise_k, rowwise=True, rows_last=_dim_is_last, model="|softmax(input)|",
                             k_rule="input.shape[dim]", from_reference=_rowwise_ref(0.0)),
     aliases=("_softmax", "special.softmax", "Softmax"))
_add("log_softmax", _torch_model(
    "log_softmax", "input, dim=None, _stacklevel=3, dtype=None", _rowwise_op(_log_softmax_rows), _rowwise_k,
    rowwise=True, rows_last=_dim_is_last, model="|x - max| + log(sum exp(x - max)) + 1 along dim",
    k_rule="input.shape[dim]", from_reference=_rowwise_ref(1.0)),
    aliases=("_log_softmax", "special.log_softmax", "LogSoftmax"))
_add("layer_norm", _torch_model(
    "layer_norm", "input, normalized_shape, weight=None, bias=None, eps=1e-05", _layer_norm, _norm_k, rowwise=True,
    model="(|x - mu| + mean|x|) / sqrt(var + eps) * |weight| + |bias|", k_rule="prod(normalized_shape)"),
     aliases=("layernorm", "LayerNorm", "native_layer_norm"))
_add("rms_norm", _torch_model(
    "rms_norm", "input, normalized_shape, weight=None, eps=None", _rms_norm, _norm_k, rowwise=True,
    model="|x / sqrt(mean(x^2) + eps) * weight| (eps=None: the compute type's epsilon, as torch)",
    k_rule="prod(normalized_shape)", from_reference=_rms_norm_ref), aliases=("rmsnorm", "RMSNorm"))
_add("group_norm", _torch_model(
    "group_norm", "input, num_groups, weight=None, bias=None, eps=1e-05", _group_norm, _group_k, rowwise=True,
    model="layer_norm's magnitude per group, then * |weight[c]| + |bias[c]|",
    k_rule="C / num_groups * prod(spatial)"), aliases=("groupnorm", "GroupNorm", "native_group_norm"))
_add("sum", _torch_model("sum", "input, dim=None, keepdim=False, *, dtype=None", _reduce("sum"), _reduce_k,
                         model="sum |x| over dim", k_rule="number of summed elements"))
_add("mean", _torch_model("mean", "input, dim=None, keepdim=False, *, dtype=None", _reduce("mean"), _reduce_k,
                          model="mean |x| over dim", k_rule="number of averaged elements"))
_add("var", _torch_model("var", "input, dim=None, unbiased=None, keepdim=False, *, correction=None", _reduce("var"),
                         _reduce_k, model="2 sum |x - mu| |x| / (N - correction) over dim",
                         k_rule="N, the number of reduced elements"))
_add("cumsum", _torch_model("cumsum", "input, dim, *, dtype=None", _cumsum, _cumsum_k, rowwise=True,
                            rows_last=_cumsum_last, model="cumsum |x| * sqrt((j + 1) / N) along dim",
                            k_rule="N = input.shape[dim]"))


# ------------------------------------------------------------------- cross_entropy

def _targets(c: Call, x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(target, is_index): class indices as int64, or class probabilities as float64."""
    t = c.raw("target")
    tf = c.array("target")
    if tf.shape == x.shape:
        return tf, False
    want = x.shape[:1] + x.shape[2:] if x.ndim >= 2 else ()
    if tf.shape != want:
        raise c.error("target", f"must hold class indices of shape {want} or probabilities of shape {x.shape}")
    kind = str(getattr(t, "dtype", np.asarray(tf).dtype))
    if "int" not in kind or not np.all(np.isfinite(tf)):
        raise c.error("target", "of class indices must have an integer dtype")
    return tf.astype(np.int64), True


def _ce_terms(c: Call) -> tuple[np.ndarray, np.ndarray, str]:
    """(per-sample magnitudes, per-sample weights of the mean, reduction), classes on axis 1."""
    x = c.array("input")
    if x.ndim == 0:
        raise c.error("input", "must have a class dimension")
    red = c.choice("reduction", ("mean", "sum", "none"))
    if c.raw("size_average") is not None or c.raw("reduce") is not None:
        raise c.error("size_average", "and reduce are deprecated and not supported; use reduction")
    t, index = _targets(c, x)
    xb, tb = (x[None], t[None]) if x.ndim == 1 else (x, t)
    C = xb.shape[1]
    w = c.optional("weight")
    w = np.ones(C) if w is None else np.abs(w)
    if w.shape != (C,):
        raise c.error("weight", f"must have one entry per class ({C})")
    ls = c.number("label_smoothing")
    wshape = (1, C) + (1,) * (xb.ndim - 2)
    mls = _along(xb, 1, _log_softmax_rows) * w.reshape(wshape)  # |w_c| * m(log_softmax)_c
    smooth = mls.sum(1) / C
    if index:
        ign = tb == c.integer("ignore_index")
        safe = np.where(ign, 0, tb)
        if np.any((safe < 0) | (safe >= C)):
            raise c.error("target", f"holds class indices outside [0, {C})")
        pick = np.take_along_axis(mls, safe[:, None], axis=1)[:, 0]
        m = np.where(ign, 0.0, (1.0 - ls) * pick + ls * smooth)
        den = np.where(ign, 0.0, w[safe])
    else:
        m = (1.0 - ls) * (mls * np.abs(tb)).sum(1) + ls * smooth
        den = np.ones(m.shape)
    return (m[0], den[0], red) if x.ndim == 1 else (m, den, red)


def _cross_entropy(c: Call, dtype: Any) -> np.ndarray:
    m, den, red = _ce_terms(c)
    if red == "none":
        return m
    total = m.sum()
    return np.asarray(total if red == "sum" else total / den.sum())


def _cross_entropy_k(c: Call) -> float:
    s = c.shape("input")
    C = s[1] if len(s) >= 2 else (s[0] if s else 1)
    red = c.choice("reduction", ("mean", "sum", "none"))
    n = (s[0] * math.prod(s[2:])) if len(s) >= 2 else 1
    return float(C if red == "none" else C + n)


# ------------------------------------------------------------------------ attention

def _attention(c: Call, dtype: Any) -> np.ndarray:
    q, k, v = c.array("query"), c.array("key"), c.array("value")
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.ndim < 2:
            raise c.error(name, "must have at least 2 dimensions (..., L, E)")
    if c.number("dropout_p") != 0.0:
        raise c.error("dropout_p", "must be 0: dropout makes the output random (not modelled)")
    if c.flag("enable_gqa") and q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        if q.shape[-3] % k.shape[-3]:
            raise c.error("key", f"must have a number of heads dividing the query's {q.shape[-3]}")
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{c.op}: shapes do not match: query {q.shape}, key {k.shape}, value {v.shape}")
    scale = c.raw("scale")
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s = s / np.sqrt(q.shape[-1]) if scale is None else s * c.number("scale")
    L, S = s.shape[-2:]
    mask = c.optional("attn_mask")
    if c.flag("is_causal"):
        if mask is not None:
            raise c.error("attn_mask", "cannot be given with is_causal=True (as in torch)")
        s = np.where(np.arange(S)[None, :] <= np.arange(L)[:, None], s, -np.inf)
    elif mask is not None:
        kind = str(getattr(c.raw("attn_mask"), "dtype", ""))
        s = np.where(mask != 0, s, -np.inf) if "bool" in kind else s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.matmul(p / p.sum(-1, keepdims=True), np.abs(v))


def _attention_k(c: Call) -> float:
    return float(c.shape("key")[-2])


_add("cross_entropy", _torch_model(
    "cross_entropy", "input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, "
    "reduction='mean', label_smoothing=0.0", _cross_entropy, _cross_entropy_k,
    model="|w_y| * log_softmax's magnitude at the target (label smoothing, probabilities: their mix), "
          "summed / averaged as the reduction", k_rule="C (reduction='none'); C + number of losses (mean, sum)"),
     aliases=("CrossEntropyLoss",))
_add("scaled_dot_product_attention", _torch_model(
    "scaled_dot_product_attention", "query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, "
    "scale=None, enable_gqa=False", _attention, _attention_k, rowwise=True,
    model="P @ |value|, P the exact attention probabilities", k_rule="the key length S (key.shape[-2])"),
     aliases=("attention", "sdpa", "flash_attention"))
