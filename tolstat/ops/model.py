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
#: the magnitude from the call's reference: ``(args, kwargs, reference, dtype) -> ndarray or None``
RefMagnitudeFn = Callable[[Sequence[Any], Mapping[str, Any], np.ndarray, Any], Union[np.ndarray, None]]


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
    from_reference : callable, optional
        ``from_reference(args, kwargs, reference, dtype) -> ndarray or None``: the same
        magnitude computed from the call's reference (the op's exact output, float64) by an
        identity of the op, where that is cheaper than ``magnitude`` (``|softmax(x)|`` is
        ``|ref|``; ``gelu(|x|)`` is ``ref + max(-x, 0)``); None where it does not apply
        (a reference of another shape), and then ``magnitude`` is used. It must agree with
        ``magnitude`` up to the rounding of the reference.
    """

    magnitude: MagnitudeFn
    K: KFn
    rowwise: bool = False
    model: str = ""
    k_rule: str = ""
    rows_last: Union[KFn, None] = None
    signature: Union[inspect.Signature, None] = field(default=None, compare=False)
    from_reference: Union[RefMagnitudeFn, None] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("magnitude", "K"):
            if not callable(getattr(self, name)):
                raise TypeError(f"OpModel.{name} must be callable, got {show(getattr(self, name))}")
        for name in ("rows_last", "from_reference"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise TypeError(f"OpModel.{name} must be callable or None, got {show(getattr(self, name))}")

    def statistics(self, args: Sequence[Any], kwargs: Mapping[str, Any], dtype: Any,
                   reference: np.ndarray | None = None) -> tuple[Any, float, bool]:
        """``(magnitude, K, rows)`` of one call: the magnitude (from ``reference`` where
        :attr:`from_reference` gives it, from the arguments otherwise), the reduction length
        and whether this call's rows lie along the last axis (``rowwise`` and
        :attr:`rows_last`)."""
        return _statistics((args, kwargs), self.magnitude, self.K, self.rows_last, self.from_reference,
                           self.rowwise, dtype, reference)


def _statistics(bound: tuple[Any, ...], magnitude: Callable[..., Any], K: Callable[..., float],
                rows_last: Callable[..., bool] | None, from_reference: Callable[..., Any] | None, rowwise: bool,
                dtype: Any, reference: np.ndarray | None) -> tuple[Any, float, bool]:
    """:meth:`OpModel.statistics` of a call given as the functions' leading arguments ``bound``
    (``(args, kwargs)``, or a built-in model's bound :class:`~tolstat.ops._args.Call`)."""
    m = None
    if reference is not None and from_reference is not None:
        m = from_reference(*bound, reference, dtype)
    if m is None:
        m = magnitude(*bound, dtype)
    rows = rowwise and (rows_last is None or bool(rows_last(*bound)))
    return m, float(K(*bound)), rows


@dataclass(frozen=True)
class _TorchModel(OpModel):
    """A built-in model: the call's arguments bound once to the torch signature per
    :meth:`statistics` (the magnitude, ``K`` and the row flag read the same binding);
    ``parts`` holds the op's name and its functions of a :class:`~tolstat.ops._args.Call`."""

    parts: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def statistics(self, args: Sequence[Any], kwargs: Mapping[str, Any], dtype: Any,
                   reference: np.ndarray | None = None) -> tuple[Any, float, bool]:
        op, magnitude, K, rows_last, from_reference = self.parts
        return _statistics((Call(op, self.signature, args, kwargs),), magnitude, K, rows_last, from_reference,
                           self.rowwise, dtype, reference)


def _torch_model(op: str, spec: str, magnitude: Callable[[Call, Any], np.ndarray], K: Callable[[Call], float],
                 *, rowwise: bool = False, rows_last: Callable[[Call], bool] | None = None,
                 model: str = "", k_rule: str = "",
                 from_reference: Callable[[Call, np.ndarray, Any], np.ndarray | None] | None = None) -> OpModel:
    """A built-in model: the call is bound to the torch signature ``spec`` (torch's defaults)."""
    sig = signature(spec)

    def mag(args: Sequence[Any], kwargs: Mapping[str, Any], dtype: Any) -> np.ndarray:
        return magnitude(Call(op, sig, args, kwargs), dtype)

    def k(args: Sequence[Any], kwargs: Mapping[str, Any]) -> float:
        return K(Call(op, sig, args, kwargs))

    def last(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        assert rows_last is not None
        return rows_last(Call(op, sig, args, kwargs))

    def ref(args: Sequence[Any], kwargs: Mapping[str, Any], reference: np.ndarray, dtype: Any) -> np.ndarray | None:
        assert from_reference is not None
        return from_reference(Call(op, sig, args, kwargs), reference, dtype)

    return _TorchModel(magnitude=mag, K=k, rowwise=rowwise, model=model, k_rule=k_rule,
                       rows_last=last if rows_last else None, signature=sig,
                       from_reference=ref if from_reference else None,
                       parts=(op, magnitude, K, rows_last, from_reference))
