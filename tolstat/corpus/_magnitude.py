"""Operator magnitudes of the corpus ops: the op applied to absolute inputs (float64).

For the operator noise model of :mod:`tolstat.measure.noise` each op gets ``m_i`` (the scale of
the accumulated rounding error of output element ``i``, to be multiplied by
``u_acc * sqrt(K)``) and a flag saying whether it works on rows (last axis). The
magnitudes are computed, like the references, on the inputs as rounded to the dtype.

* matmul, bmm: ``|A| @ |B|``; linear: ``|x| @ |w|.T + |bias|``; conv1d: the same
  cross-correlation on ``|x|``, ``|w|`` plus ``|bias|``.
* softmax: ``|ref|`` (the row sum's relative error carries over to every element).
* log_softmax: ``|x - max| + log(sum exp(x - max)) + 1`` (absolute error of a log:
  the arguments' magnitude plus the relative error of the sum).
* layer_norm: ``(|x - mu| + mean|x|) / sqrt(var + eps) * |w| + |b|``: the mean's error,
  of size ``mean|x|``, is amplified by ``1/sigma`` (cancellation for offset rows).
* rms_norm: ``|ref|``.
* mean: ``mean |x|``; cumsum: ``cumsum |x| * sqrt((j+1)/N)`` (element ``j`` sums ``j+1``
  terms; ``K = N``).
* attention: ``P @ |V|`` with ``P`` the exact attention probabilities.
* gelu: ``0.5 |x| (1 + |erf(x / sqrt 2)|)`` (the cancellation in ``1 + erf`` for
  negative ``x``); silu: ``max(|ref|, |x| tiny_f32 / u_f32)``: ``|ref|``, plus the range
  of the float32 computation (``exp(-x)`` overflows for ``x < -88.7``, so a correct
  kernel returns -0 where the exact value, below ``|x| tiny_f32``, is still a bfloat16
  number).
"""

from __future__ import annotations

import numpy as np
from scipy import special

from tolstat.corpus._base import F64, OPS, np_dtype

__all__ = ["MAGNITUDES", "ROWWISE", "run_magnitude"]


def _mm(a, b):
    return np.abs(a) @ np.abs(b)


def _linear(x, w, bias):
    return np.abs(x) @ np.abs(w).T + np.abs(bias)


def _conv(x, w, bias):
    from tolstat.corpus._linalg import _conv_ref

    return _conv_ref(np.abs(x), np.abs(w), np.abs(bias))


def _softmax(x):
    from tolstat.corpus._rowwise import _softmax_ref

    return _softmax_ref(x)


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return np.abs(x - m) + np.log(np.exp(x - m).sum(-1, keepdims=True)) + 1.0


def _layer_norm(x, weight, bias, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return ((np.abs(x - mu) + np.abs(x).mean(-1, keepdims=True)) / np.sqrt(var + eps)
            * np.abs(weight) + np.abs(bias))


def _rms_norm(x, weight, eps):
    from tolstat.corpus._rowwise import _rms_ref

    return np.abs(_rms_ref(x, weight, eps))


def _mean(x):
    return np.abs(x).mean(-1, keepdims=True)


def _cumsum(x):
    n = x.shape[-1]
    return np.cumsum(np.abs(x), axis=-1) * np.sqrt(np.arange(1, n + 1) / n)


def _attention(q, k, v, causal):
    D = q.shape[-1]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(D)
    if causal:
        Sq, Sk = s.shape[-2:]
        s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.matmul(p / p.sum(-1, keepdims=True), np.abs(v))


_TINY32 = float(np.finfo(np.float32).tiny)  # smallest positive normal float32
_U32 = 2.0 ** -24  # unit roundoff of float32


def _gelu(x):
    return 0.5 * np.abs(x) * (1.0 + np.abs(special.erf(x / np.sqrt(2.0))))


def _silu(x):
    # float32 computes exp(-x), which overflows for x < -88.7 (sigmoid -> 0): a correct
    # float32 silu then returns -0 where the exact value, below |x| tiny_f32, is still a
    # bfloat16 number. The range term |x| tiny_f32 / u_f32 makes s_i >= |x| tiny_f32 there.
    return np.maximum(np.abs(x * special.expit(x)), np.abs(x) * (_TINY32 / _U32))


#: op -> magnitude function of the float64 inputs (same arguments as the reference)
MAGNITUDES = {
    "matmul": _mm, "bmm": _mm, "linear": _linear, "conv1d": _conv, "softmax": _softmax,
    "log_softmax": _log_softmax, "layer_norm": _layer_norm, "rms_norm": _rms_norm,
    "mean": _mean, "cumsum": _cumsum, "attention": _attention, "gelu": _gelu, "silu": _silu,
}
#: ops whose output rows (last axis) are computed together
ROWWISE = {"softmax", "log_softmax", "layer_norm", "rms_norm", "cumsum", "attention"}


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
    if case.op not in MAGNITUDES:
        raise KeyError(f"no magnitude for op {case.op!r}; known: {sorted(MAGNITUDES)}")
    dt = np_dtype(dtype)
    xs = {k: v.astype(F64) for k, v in case._cast(dt).items()}
    with np.errstate(all="ignore"):
        return np.asarray(MAGNITUDES[case.op](**xs, **case.params), dtype=F64)


missing = sorted(set(OPS) - set(MAGNITUDES))
if missing:  # pragma: no cover - guards a new op without a magnitude
    raise RuntimeError(f"corpus ops without a magnitude: {missing}")
