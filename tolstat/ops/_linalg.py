"""Models of the matrix-product family: matmul, mm, bmm, addmm, baddbmm, linear, conv1d/2d/3d,
_scaled_mm.

Each is multilinear: the magnitude is the op on the absolute inputs (``|A| @ |B|``), and
``K`` the length of the inner products (the contracted dimension, ``in_channels / groups *
prod(kernel_size)`` for a convolution).

``_scaled_mm`` is ``torch._scaled_mm`` (named as torch names it): FP8 inputs
(``float8_e4m3fn`` / ``float8_e5m2``, the values as given), per-tensor (one-element) scales,
accumulation in float32 and a bfloat16, float16 or float32 output. Its magnitude is ``|scale_a scale_b| |input| @ |mat2| + |bias|``:
the scales multiply every product, so they multiply the accumulated rounding error too. The
dtype a dataset names is the *output* format (``u_out``); the accumulation format is float32
(the default ``acc_dtype`` of :func:`tolstat.measure.noise.record_statistics`). Row-wise
scales and ``scale_result`` (the output scale of FP8 outputs) are refused rather than
guessed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tolstat.ops._args import Call
from tolstat.ops.model import OpModel, _torch_model

__all__: list[str] = []

#: (canonical name, model, aliases) of this module's ops, registered by tolstat.ops.registry
BUILTINS: list[tuple[str, OpModel, tuple[str, ...]]] = []


def _add(name: str, model: OpModel, aliases: tuple[str, ...] = ()) -> None:
    BUILTINS.append((name, model, tuple(aliases)))


def _inner(c: Call, a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = c.array(a), c.array(b)
    if x.ndim == 0 or y.ndim == 0:
        raise c.error(a if x.ndim == 0 else b, "must have at least 1 dimension")
    kb = y.shape[-2] if y.ndim >= 2 else y.shape[0]
    if x.shape[-1] != kb:
        raise ValueError(f"{c.op}: the inner dimensions of {a!r} (shape {x.shape}) and {b!r} "
                         f"(shape {y.shape}) differ: {x.shape[-1]} != {kb}")
    return np.abs(x), np.abs(y)


def _mm_checked(c: Call, a: str, b: str, ndim: int) -> np.ndarray:
    c.array(a, ndim=(ndim,))
    c.array(b, ndim=(ndim,))
    x, y = _inner(c, a, b)
    if ndim == 3 and x.shape[0] != y.shape[0]:
        raise ValueError(f"{c.op}: batch sizes of {a!r} (shape {x.shape}) and {b!r} (shape {y.shape}) differ")
    return np.matmul(x, y)


def _k_last(name: str):
    def k(c: Call) -> float:
        s = c.shape(name)
        return float(s[-1]) if s else 1.0
    return k


def _matmul(c: Call, dtype: Any) -> np.ndarray:
    return np.matmul(*_inner(c, "input", "other"))


def _addmm(ndim: int):
    def magnitude(c: Call, dtype: Any) -> np.ndarray:
        names = ("mat1", "mat2") if ndim == 2 else ("batch1", "batch2")
        prod = _mm_checked(c, *names, ndim)
        alpha, beta = c.number("alpha"), c.number("beta")
        out = abs(alpha) * prod
        if beta != 0:  # torch ignores input (NaN included) when beta == 0
            try:
                out = out + abs(beta) * np.abs(c.array("input"))
            except ValueError:
                raise c.error("input", f"must broadcast to the product's shape {prod.shape}") from None
        return out
    return magnitude


def _linear(c: Call, dtype: Any) -> np.ndarray:
    x = c.array("input")
    w = c.array("weight", ndim=(1, 2))
    if x.ndim == 0 or x.shape[-1] != w.shape[-1]:
        raise ValueError(f"{c.op}: input (shape {x.shape}) and weight (shape {w.shape}) differ in "
                         f"in_features")
    out = np.abs(x) @ np.abs(w).T
    b = c.optional("bias")
    return out if b is None else out + np.abs(b)


def _scaled_mm(c: Call, dtype: Any) -> np.ndarray:
    c.array("input", ndim=(2,))
    c.array("mat2", ndim=(2,))
    prod = np.matmul(*_inner(c, "input", "mat2"))
    scale = 1.0
    for name in ("scale_a", "scale_b"):
        s = c.array(name)
        if s.size != 1:
            raise c.error(name, "must be a one-element (per-tensor) scale; row-wise scales are not modelled")
        scale *= abs(float(s.reshape(())))
    if c.raw("scale_result") is not None:
        raise c.error("scale_result", "is not modelled (the output scale of FP8 outputs); pass None")
    out = scale * prod
    b = c.optional("bias")
    return out if b is None else out + np.abs(b)


# ------------------------------------------------------------------------ convolution

def _conv_padding(c: Call, n: int, ksize: tuple[int, ...], dilation: tuple[int, ...],
                  stride: tuple[int, ...]) -> list[tuple[int, int]]:
    p = c.raw("padding")
    if isinstance(p, str):
        mode = c.choice("padding", ("same", "valid"))
        if mode == "valid":
            return [(0, 0)] * n
        if any(s != 1 for s in stride):
            raise c.error("padding", "'same' is not supported with stride > 1 (as in torch)")
        total = [d * (k - 1) for d, k in zip(dilation, ksize)]
        return [(t // 2, t - t // 2) for t in total]
    return [(q, q) for q in c.ints("padding", n)]


def _conv_nd(x: np.ndarray, w: np.ndarray, pads: list[tuple[int, int]], stride: tuple[int, ...],
             dilation: tuple[int, ...], groups: int) -> np.ndarray:
    """Cross-correlation of ``x[N, Cin, *S]`` with ``w[Cout, Cin/groups, *k]`` (float64)."""
    N, cin = x.shape[:2]
    cout, cg = w.shape[:2]
    ksize = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0), *pads])
    sizes = [(xp.shape[2 + d] - dilation[d] * (ksize[d] - 1) - 1) // stride[d] + 1 for d in range(len(ksize))]
    og = cout // groups
    xg = xp.reshape(N, groups, cg, *xp.shape[2:])
    wg = w.reshape(groups, og, cg, *ksize)
    out = np.zeros((N, groups, og, *sizes))
    for tap in np.ndindex(*ksize):
        sl = tuple(slice(t * dl, t * dl + (o - 1) * s + 1, s) for t, dl, o, s in zip(tap, dilation, sizes, stride))
        patch = xg[(slice(None),) * 3 + sl]
        out += np.einsum("ngc...,goc->ngo...", patch, wg[(slice(None),) * 3 + tap])
    return out.reshape(N, cout, *sizes)


def _conv(n: int):
    def magnitude(c: Call, dtype: Any) -> np.ndarray:
        x = c.array("input", ndim=(n + 1, n + 2))
        w = c.array("weight", ndim=(n + 2,))
        groups = c.integer("groups", low=1)
        stride, dilation = c.ints("stride", n, low=1), c.ints("dilation", n, low=1)
        unbatched = x.ndim == n + 1
        if unbatched:
            x = x[None]
        if x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
            raise ValueError(f"{c.op}: input (shape {c.shape('input')}) and weight (shape {w.shape}) do "
                             f"not match with groups={groups}: need in_channels == weight.shape[1] * "
                             f"groups and out_channels divisible by groups")
        pads = _conv_padding(c, n, w.shape[2:], dilation, stride)
        for d in range(n):
            if x.shape[2 + d] + sum(pads[d]) < dilation[d] * (w.shape[2 + d] - 1) + 1:
                raise c.error("input", f"is smaller than the (dilated) kernel along spatial dim {d}")
        out = _conv_nd(np.abs(x), np.abs(w), pads, stride, dilation, groups)
        b = c.optional("bias")
        if b is not None:
            out = out + np.abs(b).reshape((1, -1) + (1,) * n)
        return out[0] if unbatched else out
    return magnitude


def _conv_k(c: Call) -> float:
    s = c.shape("weight")
    return float(s[1] * math.prod(s[2:])) if len(s) >= 2 else 1.0


_MM = "|input| @ |other|"
_add("matmul", _torch_model("matmul", "input, other", _matmul, _k_last("input"), model=_MM,
                            k_rule="input.shape[-1]"),
     aliases=("@", "__matmul__", "Tensor.__matmul__", "aten.matmul"))
_add("mm", _torch_model("mm", "input, mat2", lambda c, dt: _mm_checked(c, "input", "mat2", 2),
                        _k_last("input"), model="|input| @ |mat2|", k_rule="input.shape[1]"))
_add("bmm", _torch_model("bmm", "input, mat2", lambda c, dt: _mm_checked(c, "input", "mat2", 3),
                         _k_last("input"), model="|input| @ |mat2| (per batch)", k_rule="input.shape[2]"))
_add("addmm", _torch_model("addmm", "input, mat1, mat2, *, beta=1, alpha=1", _addmm(2), _k_last("mat1"),
                           model="|beta| |input| + |alpha| |mat1| @ |mat2|", k_rule="mat1.shape[1]"))
_add("baddbmm", _torch_model("baddbmm", "input, batch1, batch2, *, beta=1, alpha=1", _addmm(3),
                             _k_last("batch1"), model="|beta| |input| + |alpha| |batch1| @ |batch2|",
                             k_rule="batch1.shape[2]"))
_add("linear", _torch_model("linear", "input, weight, bias=None", _linear, _k_last("weight"),
                            model="|input| @ |weight|.T + |bias|", k_rule="in_features (weight.shape[-1])"))
_add("_scaled_mm", _torch_model(
    "_scaled_mm", "input, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, "
    "use_fast_accum=False", _scaled_mm, _k_last("input"),
    model="|scale_a scale_b| |input| @ |mat2| + |bias| (FP8 inputs, per-tensor scales, float32 accumulation)",
    k_rule="input.shape[1]"))
for _n in (1, 2, 3):
    _add(f"conv{_n}d", _torch_model(
        f"conv{_n}d", "input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1", _conv(_n), _conv_k,
        model=f"conv{_n}d(|input|, |weight|) + |bias| (stride, padding, dilation, groups as given)",
        k_rule="in_channels / groups * prod(kernel_size)"))
