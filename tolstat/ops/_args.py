"""Binding a torch call's arguments to its signature and reading them as float64 arrays."""

from __future__ import annotations

import ast
import inspect
import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__: list[str] = []

_P = inspect.Parameter


def signature(spec: str) -> inspect.Signature:
    """A signature from a parameter list as torch documents it: ``"input, dim=None, *, dtype=None"``.

    Defaults are Python literals without commas.
    """
    params: list[inspect.Parameter] = []
    kind = _P.POSITIONAL_OR_KEYWORD
    for part in (p.strip() for p in spec.split(",")):
        if part == "*":
            kind = _P.KEYWORD_ONLY
            continue
        name, eq, default = (s.strip() for s in part.partition("="))
        params.append(_P(name, kind, default=ast.literal_eval(default) if eq else _P.empty))
    return inspect.Signature(params)


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch object (tensor, parameter, dtype)."""
    return type(x).__module__.split(".")[0] == "torch"


def is_array(x: Any) -> bool:
    """Whether ``x`` is an array input: a numpy array or a tensor-like object (not a Python number)."""
    if isinstance(x, np.ndarray) or (is_torch(x) and hasattr(x, "detach")):
        return True
    return not isinstance(x, (str, bytes, int, float, complex, list, tuple, dict, type(None))) and (
        hasattr(x, "__array__") or hasattr(x, "__dlpack__"))


def show(x: Any) -> str:
    """A short description of a value for an error message."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


def to_f64(x: Any, op: str, arg: str) -> np.ndarray:
    """``x`` as a float64 numpy array (exact for every float format: float16, bfloat16, float8).

    Raises
    ------
    TypeError
        ``x`` is not a real-valued array, tensor or number.
    """
    def bad() -> TypeError:
        return TypeError(f"{op}: argument {arg!r} must be a real-valued array (numpy array or torch "
                         f"tensor), got {show(x)}")

    if is_torch(x) and hasattr(x, "detach"):
        if x.is_complex():
            raise bad()
        return x.detach().cpu().double().numpy()
    if isinstance(x, (str, bytes, type(None), complex)):
        raise bad()
    try:
        if isinstance(x, (np.ndarray, np.generic, bool, int, float, list, tuple)):
            a = np.asarray(x)
        else:
            from tolstat.measure.metrics import as_array

            a = as_array(x, name=arg)
    except (TypeError, ValueError) as exc:
        raise bad() from exc
    if a.dtype.kind in "cOSUMm":
        raise bad()
    try:
        return np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise bad() from exc


#: id(signature) -> (signature, positional-or-keyword names, every name, defaults): what
#: :func:`_fast_bind` reads of a signature, worked out once (the signature kept alive)
_PLANS: dict[int, tuple[inspect.Signature, tuple[str, ...], tuple[str, ...], dict[str, Any]]] = {}


def _fast_bind(sig: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """``sig.bind(*args, **kwargs)`` with the defaults applied, as a dict in the signature's
    order, for a signature of :func:`signature` (positional-or-keyword and keyword-only
    parameters); None where the call is not a plain one (too many positional arguments, an
    unknown or repeated keyword, a missing required argument): ``inspect`` then binds it
    and raises its error."""
    plan = _PLANS.get(id(sig))
    if plan is None or plan[0] is not sig:
        params = list(sig.parameters.values())
        if any(p.kind not in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY) for p in params):
            return None
        plan = _PLANS[id(sig)] = (sig, tuple(p.name for p in params if p.kind == _P.POSITIONAL_OR_KEYWORD),
                                  tuple(p.name for p in params),
                                  {p.name: p.default for p in params if p.default is not _P.empty})
    _, positional, names, defaults = plan
    if len(args) > len(positional):
        return None
    given = dict(zip(positional, args))
    for k, v in kwargs.items():
        if k in given or k not in names:
            return None
        given[k] = v
    out = {}
    for n in names:
        if n in given:
            out[n] = given[n]
        elif n in defaults:
            out[n] = defaults[n]
        else:
            return None
    return out


class Call:
    """The arguments of one call of a torch function, bound to its signature with torch's defaults.

    Parameters
    ----------
    op : str
        Canonical op name (for error messages).
    sig : inspect.Signature
        The torch function's signature.
    args, kwargs
        The call's positional and keyword arguments.
    """

    def __init__(self, op: str, sig: inspect.Signature, args: Sequence[Any],
                 kwargs: Mapping[str, Any] | None) -> None:
        if type(args) not in (tuple, list) and (isinstance(args, (str, bytes)) or not isinstance(args, Sequence)):
            raise TypeError(f"{op}: inputs must be the sequence of the positional arguments of "
                            f"{op}{sig}, got {show(args)}")
        arguments = _fast_bind(sig, args, kwargs or {})
        if arguments is None:  # an irregular call: inspect's binding, and its error
            try:
                bound = sig.bind(*args, **dict(kwargs or {}))
            except TypeError as exc:
                raise TypeError(f"{op}{sig}: {exc}") from None
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        self.op = op
        self.arguments: dict[str, Any] = arguments
        self._f64: dict[str, np.ndarray] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        #: what a model works out of the call once for its magnitude, ``K`` and rows
        self.memo: dict[str, Any] = {}

    def raw(self, name: str) -> Any:
        """The argument as given."""
        return self.arguments[name]

    def error(self, name: str, what: str) -> ValueError:
        """A ValueError naming the op, the argument and its value."""
        return ValueError(f"{self.op}: argument {name!r} {what}, got {show(self.raw(name))}")

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of an array argument (no conversion)."""
        got = self._shapes.get(name)
        if got is not None:
            return got
        x = self.raw(name)
        if not is_array(x):
            raise TypeError(f"{self.op}: argument {name!r} must be an array (numpy array or "
                            f"torch tensor), got {show(x)}")
        got = self._shapes[name] = tuple(int(s) for s in x.shape)
        return got

    def array(self, name: str, *, ndim: Sequence[int] | None = None) -> np.ndarray:
        """An array argument as float64; ``ndim``: the allowed numbers of dimensions."""
        if name not in self._f64:
            x = self.raw(name)
            if not is_array(x):
                raise TypeError(f"{self.op}: argument {name!r} must be an array (numpy array or "
                                f"torch tensor), got {show(x)}")
            self._f64[name] = to_f64(x, self.op, name)
        a = self._f64[name]
        if ndim is not None and a.ndim not in ndim:
            raise self.error(name, f"must have {' or '.join(map(str, ndim))} dimensions")
        return a

    def optional(self, name: str) -> np.ndarray | None:
        """An optional array argument (None stays None); numbers are accepted too."""
        x = self.raw(name)
        if x is None:
            return None
        if name not in self._f64:
            self._f64[name] = to_f64(x, self.op, name)
        return self._f64[name]

    def integer(self, name: str, *, low: int | None = None) -> int:
        """An integer argument (bools refused)."""
        x = self.raw(name)
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"{self.op}: argument {name!r} must be an int, got {show(x)}")
        if low is not None and x < low:
            raise self.error(name, f"must be >= {low}")
        return int(x)

    def ints(self, name: str, n: int, *, low: int = 0) -> tuple[int, ...]:
        """An int or a sequence of ``n`` ints (stride, padding, dilation) as an ``n``-tuple."""
        x = self.raw(name)
        vals = (x,) * n if isinstance(x, (int, np.integer)) else x
        if (not isinstance(vals, (tuple, list)) or len(vals) != n
                or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low for v in vals)):
            raise self.error(name, f"must be an int >= {low} or a sequence of {n} of them")
        return tuple(int(v) for v in vals)

    def number(self, name: str, *, finite: bool = True) -> float:
        """A real-number argument."""
        x = self.raw(name)
        if is_torch(x) and hasattr(x, "item") and x.numel() == 1:
            x = x.item()
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) or (
                finite and not math.isfinite(x)):
            raise TypeError(f"{self.op}: argument {name!r} must be a{' finite' if finite else ''} "
                            f"real number, got {show(x)}")
        return float(x)

    def flag(self, name: str) -> bool:
        """A bool argument."""
        x = self.raw(name)
        if not isinstance(x, (bool, np.bool_)):
            raise TypeError(f"{self.op}: argument {name!r} must be a bool, got {show(x)}")
        return bool(x)

    def choice(self, name: str, options: Sequence[str]) -> str:
        """A string argument among ``options``."""
        x = self.raw(name)
        if x not in options:
            raise self.error(name, f"must be one of {list(options)}")
        return str(x)

    def dim(self, name: str, ndim: int) -> int:
        """A dimension argument normalised to ``[0, ndim)`` (a 0-d tensor has the one dim 0 / -1)."""
        d = self.integer(name)
        n = max(ndim, 1)
        if not -n <= d < n:
            raise self.error(name, f"must be a dimension of a {ndim}-d input (in [{-n}, {n - 1}])")
        return d % n

    def dims(self, name: str, ndim: int) -> tuple[int, ...]:
        """A reduction ``dim``: None or ``()`` (every dimension), an int or a sequence of ints."""
        x = self.raw(name)
        if x is None or (isinstance(x, (tuple, list)) and len(x) == 0):
            return tuple(range(ndim))
        items = list(x) if isinstance(x, (tuple, list)) else [x]
        out = []
        for v in items:
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise self.error(name, "must be None, an int or a sequence of ints")
            n = max(ndim, 1)
            if not -n <= v < n:
                raise self.error(name, f"must name dimensions of a {ndim}-d input")
            out.append(int(v) % n)
        if len(set(out)) != len(out):
            raise self.error(name, "names a dimension twice")
        return tuple(sorted(out)) if ndim else ()
