"""The types of an operator model: :class:`OpModel` (a call's arguments -> magnitude, ``K``,
rows) and :class:`OpStatistics` (what :func:`tolstat.ops.registry.op_statistics` returns)."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from tolstat.ops._args import Call, show, signature

__all__ = ["OpStatistics", "OpModel"]

#: the magnitude callable of a model: ``(args, kwargs, dtype) -> ndarray``
MagnitudeFn = Callable[[Sequence[Any], Mapping[str, Any], Any], np.ndarray]
#: the reduction-length callable of a model: ``(args, kwargs) -> float``
KFn = Callable[[Sequence[Any], Mapping[str, Any]], float]


@dataclass(frozen=True)
class OpStatistics:
    """What the operator noise model needs of one call (:func:`op_statistics`).

    Attributes
    ----------
    magnitude : numpy.ndarray
        ``m_i``, float64, the shape of the op's output: the op applied to the absolute inputs
        (plus the compute format's range terms where a model has them).
    K : float
        Reduction length, ``>= 1`` (1 for pointwise ops).
    rowwise : bool
        Output rows along the last axis are computed together (softmax, norms, attention):
        pass it as ``rowwise=`` to :func:`tolstat.measure.noise.record_statistics`.
    """

    magnitude: np.ndarray
    K: float
    rowwise: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "magnitude", np.asarray(self.magnitude, dtype=np.float64))
        k = float(self.K)
        if not (math.isfinite(k) and k >= 1.0):
            raise ValueError(f"OpStatistics.K must be a finite number >= 1, got {self.K!r}")
        object.__setattr__(self, "K", k)
        object.__setattr__(self, "rowwise", bool(self.rowwise))


@dataclass(frozen=True)
class OpModel:
    """The noise-model inputs of one operator, as functions of a call's arguments.

    Attributes
    ----------
    magnitude : callable
        ``magnitude(args, kwargs, dtype) -> ndarray``: ``m_i`` (float64, the output's shape)
        for the positional ``args`` and keyword ``kwargs`` of one call; ``dtype`` is the
        kernel's output format (for range terms of its compute format).
    K : callable
        ``K(args, kwargs) -> float``: the reduction length.
    rowwise : bool, default False
        The op computes output rows (the reduction axis) together.
    model : str
        One line: the magnitude, in words (the docs table).
    k_rule : str
        One line: how ``K`` is found.
    rows_last : callable, optional
        ``rows_last(args, kwargs) -> bool``: whether this call's rows lie along the last axis
        (a ``dim`` argument); None: always. A row-wise op reports ``rowwise`` only then.
    signature : inspect.Signature, optional
        The torch signature the arguments are bound to (documentation and errors).
    """

    magnitude: MagnitudeFn
    K: KFn
    rowwise: bool = False
    model: str = ""
    k_rule: str = ""
    rows_last: Union[KFn, None] = None
    signature: Union[inspect.Signature, None] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("magnitude", "K"):
            if not callable(getattr(self, name)):
                raise TypeError(f"OpModel.{name} must be callable, got {show(getattr(self, name))}")
        if self.rows_last is not None and not callable(self.rows_last):
            raise TypeError(f"OpModel.rows_last must be callable or None, got {show(self.rows_last)}")


def _torch_model(op: str, spec: str, magnitude: Callable[[Call, Any], np.ndarray], K: Callable[[Call], float],
                 *, rowwise: bool = False, rows_last: Callable[[Call], bool] | None = None,
                 model: str = "", k_rule: str = "") -> OpModel:
    """A built-in model: the call is bound to the torch signature ``spec`` (torch's defaults)."""
    sig = signature(spec)

    def mag(args: Sequence[Any], kwargs: Mapping[str, Any], dtype: Any) -> np.ndarray:
        return magnitude(Call(op, sig, args, kwargs), dtype)

    def k(args: Sequence[Any], kwargs: Mapping[str, Any]) -> float:
        return K(Call(op, sig, args, kwargs))

    def last(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        assert rows_last is not None
        return rows_last(Call(op, sig, args, kwargs))

    return OpModel(magnitude=mag, K=k, rowwise=rowwise, model=model, k_rule=k_rule,
                   rows_last=last if rows_last else None, signature=sig)
