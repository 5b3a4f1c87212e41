"""Operator magnitudes of the corpus ops, computed by :mod:`tolstat.ops`.

For the operator noise model of :mod:`tolstat.measure.noise` each op gets ``m_i`` (the scale of
the accumulated rounding error of output element ``i``, to be multiplied by
``u_acc * sqrt(K)``) and a flag saying whether it works on rows (last axis). The
magnitudes are computed, like the references, on the inputs as rounded to the dtype.

Each corpus op is a torch function (the corpus kernels take the inputs of its reference):
``_CALLS`` maps a case's inputs and params to that function's arguments, and
:func:`tolstat.ops.op_statistics` derives the magnitude from them (the models and why
each is what it is: :mod:`tolstat.ops`, ``docs/ops.md``). In brief: matmul, bmm:
``|A| @ |B|``; linear: ``|x| @ |w|.T + |bias|``; conv1d (``padding="same"``): the same
cross-correlation on ``|x|``, ``|w|`` plus ``|bias|``; softmax, rms_norm: ``|ref|``;
log_softmax: ``|x - max| + log(sum exp(x - max)) + 1``; layer_norm:
``(|x - mu| + mean|x|) / sqrt(var + eps) * |w| + |b|``; mean: ``mean |x|``; cumsum:
``cumsum |x| * sqrt((j+1)/N)``; attention: ``P @ |V|``; gelu:
``0.5 |x| (1 + |erf(x / sqrt 2)|)``; silu: ``max(|ref|, |x| tiny_f32 / u_f32)``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tolstat.corpus._base import F64, OPS, np_dtype
from tolstat.ops import get, op_statistics

__all__ = ["MAGNITUDES", "ROWWISE", "run_magnitude"]

Call = tuple[tuple[Any, ...], dict[str, Any]]


def _norm(x: np.ndarray, *rest: Any) -> tuple[Any, ...]:
    return (x, (x.shape[-1],), *rest)


#: corpus op -> (the torch function it is, a case's inputs and params -> its positional and
#: keyword arguments)
_CALLS: dict[str, tuple[str, Callable[..., Call]]] = {
    "matmul": ("matmul", lambda a, b: ((a, b), {})),
    "bmm": ("bmm", lambda a, b: ((a, b), {})),
    "linear": ("linear", lambda x, w, bias: ((x, w, bias), {})),
    "conv1d": ("conv1d", lambda x, w, bias: ((x, w, bias), {"padding": "same"})),
    "softmax": ("softmax", lambda x: ((x,), {"dim": -1})),
    "log_softmax": ("log_softmax", lambda x: ((x,), {"dim": -1})),
    "layer_norm": ("layer_norm", lambda x, weight, bias, eps: (_norm(x, weight, bias), {"eps": eps})),
    "rms_norm": ("rms_norm", lambda x, weight, eps: (_norm(x, weight), {"eps": eps})),
    "mean": ("mean", lambda x: ((x,), {"dim": -1, "keepdim": True})),
    "cumsum": ("cumsum", lambda x: ((x,), {"dim": -1})),
    "attention": ("scaled_dot_product_attention", lambda q, k, v, causal: ((q, k, v), {"is_causal": bool(causal)})),
    "gelu": ("gelu", lambda x: ((x,), {})),
    "silu": ("silu", lambda x: ((x,), {})),
}

#: the corpus dtypes (float16, bfloat16) both compute in float32: the ops' range terms are
#: those of float32 for either, so the magnitude functions below need no dtype
_COMPUTE_AS = "float16"


def _magnitude(op: str, inputs_and_params: dict[str, Any], dtype: str) -> np.ndarray:
    name, call = _CALLS[op]
    args, kwargs = call(**inputs_and_params)
    return np.asarray(op_statistics(name, args, kwargs, dtype=dtype).magnitude, dtype=F64)


def _magnitude_of(op: str) -> Callable[..., np.ndarray]:
    def magnitude(**inputs_and_params: Any) -> np.ndarray:
        return _magnitude(op, inputs_and_params, _COMPUTE_AS)

    magnitude.__doc__ = f"Magnitude of {op} (the reference's arguments), via tolstat.ops."
    return magnitude


#: op -> magnitude function of the float64 inputs (same arguments as the reference)
MAGNITUDES: dict[str, Callable[..., np.ndarray]] = {op: _magnitude_of(op) for op in _CALLS}
#: ops whose output rows (last axis) are computed together (every corpus op works on the last axis)
ROWWISE = {op for op, (name, _) in _CALLS.items() if get(name).rowwise}


def run_magnitude(case, dtype: str) -> np.ndarray:
    """The magnitude ``m`` of a case's output, on the inputs rounded to ``dtype``.

    Parameters
    ----------
    case : Case
    dtype : str

    Returns
    -------
    numpy.ndarray
        float64, the shape of the reference output.
    """
    if case.op not in _CALLS:
        raise KeyError(f"no magnitude for op {case.op!r}; known: {sorted(MAGNITUDES)}")
    return _magnitude(case.op, {**case._cast(np_dtype(dtype)), **case.params}, dtype)


missing = sorted(set(OPS) - set(MAGNITUDES))
if missing:  # pragma: no cover - guards a new op without a magnitude
    raise RuntimeError(f"corpus ops without a magnitude: {missing}")
