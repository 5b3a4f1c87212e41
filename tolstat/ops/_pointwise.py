"""Models of the elementwise ops: gelu, silu, relu, sigmoid, tanh, add, sub, mul.

``K = 1``; the magnitude is ``|ref|`` or a bound of the error of the float formula, plus the
range terms of the compute format where a correct kernel leaves the exact result's range
(the reasoning is in the docstring of :mod:`tolstat.ops`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from tolstat._base.dtypes import target_dtype, unit_roundoff
from tolstat.ops._args import Call
from tolstat.ops.model import OpModel, _torch_model

__all__: list[str] = []

#: (canonical name, model, aliases) of this module's ops, registered by tolstat.ops.registry
BUILTINS: list[tuple[str, OpModel, tuple[str, ...]]] = []


def _add(name: str, model: OpModel, aliases: tuple[str, ...] = ()) -> None:
    BUILTINS.append((name, model, tuple(aliases)))


def range_floor(dtype: Any) -> float:
    """``tiny_c / u_c`` of the compute format: float32 for outputs of 16 bits or fewer (the
    kernel computes in float32), the output format itself otherwise. ``u_acc * m >= tiny_c``
    where ``m`` includes it, so a result flushed below the compute format's normal range
    by a correct kernel stays within the noise."""
    td = target_dtype(dtype)
    comp = "float32" if td.bits <= 16 else td.name
    return float(target_dtype(comp).tiny) / unit_roundoff(comp)


def _one(c: Call, dtype: Any) -> np.ndarray:
    return c.array("input")


def _gelu(c: Call, dtype: Any) -> np.ndarray:
    x = _one(c, dtype)
    if c.choice("approximate", ("none", "tanh")) == "tanh":
        inner = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)
        return 0.5 * np.abs(x) * (1.0 + np.abs(np.tanh(inner)))
    return 0.5 * np.abs(x) * (1.0 + np.abs(special.erf(x / np.sqrt(2.0))))


def _silu(c: Call, dtype: Any) -> np.ndarray:
    x = _one(c, dtype)
    # the float32 exp(-x) overflows for x < -88.7 (sigmoid -> 0): a correct kernel returns -0
    # where the exact value, below |x| tiny_f32, may still be a bfloat16 number
    return np.maximum(np.abs(x * special.expit(x)), np.abs(x) * range_floor(dtype))


def _sigmoid(c: Call, dtype: Any) -> np.ndarray:
    # 1 / (1 + exp(-x)) in float32 is 0 for x < -88.7, where the exact value exp(x) < tiny_f32
    return np.maximum(special.expit(_one(c, dtype)), range_floor(dtype))


#: elements from which the reference identities run as numba kernels (:mod:`tolstat.ops._kernels`)
KERNEL_FROM = 4096


def kernel_input(x: np.ndarray) -> tuple[np.ndarray, tuple[bool, int, float, int]]:
    """A numpy float input as the kernels of :mod:`tolstat.ops._kernels` read it: flat, a
    float16 or bfloat16 one as its bit patterns with the decoding parameters of
    :func:`tolstat.measure.fused.decode16_params`, float32 and float64 as they are, any
    other format in float64."""
    from tolstat.measure.fused import decode16_params

    d16 = decode16_params(x.dtype)
    if d16[0]:
        return np.ascontiguousarray(x).reshape(-1).view(np.uint16), d16
    keep = x.dtype in (np.float32, np.float64)
    return np.ascontiguousarray(x, dtype=x.dtype if keep else np.float64).reshape(-1), d16


def _native(c: Call, ref: np.ndarray) -> np.ndarray | None:
    """The input as a numpy float array (a numpy input in its own format, a tensor in
    float64) where it has the reference's shape; None otherwise (the reference is not used)."""
    x = c.raw("input")
    if tuple(getattr(x, "shape", ())) != ref.shape or not hasattr(x, "shape"):
        return None
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return x
    return c.array("input")


def _gelu_ref(c: Call, ref: np.ndarray, dtype: Any) -> np.ndarray | None:
    # gelu(x) - gelu(-x) = x for both forms (x s(x) with s(x) + s(-x) = 1), so the magnitude
    # 0.5 |x| (1 + |erf(x / sqrt 2)|) = gelu(|x|) = ref + max(-x, 0); -x and the max are exact
    c.choice("approximate", ("none", "tanh"))
    x = _native(c, ref)
    if x is None:
        return None
    if x.size >= KERNEL_FROM:
        from tolstat.ops._kernels import gelu_magnitude

        m = np.empty(ref.shape)
        xf, d16 = kernel_input(x)
        ok = gelu_magnitude(xf, d16, np.ascontiguousarray(ref).ravel(), m.reshape(-1))
    else:
        m = ref - np.minimum(x, 0)
        ok = not np.isnan(m).any()
    # a NaN reference (gelu(-inf) in float64) where the op on |x| is not NaN: from the input
    return m if ok else None


def _silu_ref(c: Call, ref: np.ndarray, dtype: Any) -> np.ndarray | None:
    x = _native(c, ref)
    if x is None:
        return None
    return np.maximum(np.abs(ref), np.multiply(np.abs(x), range_floor(dtype), dtype=np.float64))


def _sigmoid_ref(c: Call, ref: np.ndarray, dtype: Any) -> np.ndarray | None:
    return None if _native(c, ref) is None else np.maximum(np.abs(ref), range_floor(dtype))


def _tanh_ref(c: Call, ref: np.ndarray, dtype: Any) -> np.ndarray | None:
    return None if _native(c, ref) is None else np.abs(ref)


def _binary(sign: float):
    def magnitude(c: Call, dtype: Any) -> np.ndarray:
        a, b = c.optional("input"), c.optional("other")
        for name, v in (("input", a), ("other", b)):
            if v is None:
                raise c.error(name, "must be an array or a number")
        if sign == 0:  # mul
            return np.abs(a) * np.abs(b)
        return np.abs(a) + abs(c.number("alpha")) * np.abs(b)
    return magnitude


def _one_k(c: Call) -> float:
    return 1.0


_add("gelu", _torch_model("gelu", "input, approximate='none'", _gelu, _one_k,
                          model="0.5 |x| (1 + |erf(x / sqrt 2)|) (tanh form: |tanh(...)| for |erf|)", k_rule="1",
                          from_reference=_gelu_ref))
_add("silu", _torch_model("silu", "input, inplace=False", _silu, _one_k,
                          model="max(|x sigmoid(x)|, |x| tiny_c / u_c)", k_rule="1", from_reference=_silu_ref),
     aliases=("swish", "SiLU"))
_add("relu", _torch_model("relu", "input, inplace=False", lambda c, dt: np.maximum(_one(c, dt), 0.0), _one_k,
                          model="|relu(x)| (exact)", k_rule="1"), aliases=("ReLU", "relu_"))
_add("sigmoid", _torch_model("sigmoid", "input", _sigmoid, _one_k, model="max(sigmoid(x), tiny_c / u_c)",
                             k_rule="1", from_reference=_sigmoid_ref), aliases=("expit", "special.expit", "Sigmoid"))
_add("tanh", _torch_model("tanh", "input", lambda c, dt: np.abs(np.tanh(_one(c, dt))), _one_k,
                          model="|tanh(x)|", k_rule="1", from_reference=_tanh_ref), aliases=("Tanh",))
_add("add", _torch_model("add", "input, other, *, alpha=1", _binary(1.0), _one_k,
                         model="|input| + |alpha| |other|", k_rule="1"), aliases=("__add__",))
_add("sub", _torch_model("sub", "input, other, *, alpha=1", _binary(-1.0), _one_k,
                         model="|input| + |alpha| |other|", k_rule="1"), aliases=("subtract", "__sub__"))
_add("mul", _torch_model("mul", "input, other", _binary(0.0), _one_k, model="|input| |other|", k_rule="1"),
     aliases=("multiply", "__mul__"))
