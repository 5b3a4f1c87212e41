"""The registry of operator models, keyed by torch function names, and :func:`op_statistics`.

An operator model (:class:`~tolstat.ops.model.OpModel`) turns the arguments of one call of a
torch function into what the operator noise model of :mod:`tolstat.measure.noise` needs per output
element: the magnitude ``m_i`` (the op on absolute inputs, float64), the reduction length
``K`` and whether output rows along the last axis are computed together. The built-in
models (``docs/ops.md`` has the table, :mod:`tolstat.ops` the reasoning) are registered on
first use; :func:`~tolstat.ops.registry.register` adds a user's op.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from tolstat._base.dtypes import target_dtype
from tolstat.ops._args import is_array, is_torch, show, to_f64
from tolstat.ops.model import KFn, OpModel, OpStatistics

__all__ = ["UnknownOpError", "op_statistics", "register", "get", "names",
           "aliases", "canonical_name", "multilinear"]


class UnknownOpError(KeyError):
    """An op name that no model is registered for (a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


_MODELS: dict[str, OpModel] = {}
_ALIASES: dict[str, str] = {}  # alias -> canonical name
_STATE = {"loaded": False}

#: prefixes a torch spelling may carry (``torch.nn.functional.softmax``, ``F.softmax``, ``aten.mm.default``)
_PREFIXES = ("torch.ops.aten.", "torch.nn.functional.", "torch.special.", "torch.Tensor.", "torch.",
             "nn.functional.", "functional.", "Tensor.", "F.", "ops.aten.", "aten.")


def _ensure_builtins() -> None:
    if _STATE["loaded"]:
        return
    _STATE["loaded"] = True
    try:
        from tolstat.ops import _linalg, _pointwise, _reductions

        for mod in (_linalg, _reductions, _pointwise):
            for name, model, al in mod.BUILTINS:
                _add(name, model, al)
    except BaseException:
        _STATE["loaded"] = False
        raise


def _add(name: str, model: OpModel, aliases: Iterable[str] = (), replace: bool = False) -> None:
    """Register without loading the built-ins first."""
    if not isinstance(name, str) or not name.strip():
        raise TypeError(f"op name must be a non-empty str, got {show(name)}")
    if not isinstance(model, OpModel):
        raise TypeError(f"{name}: model must be an OpModel (see tolstat.ops.multilinear), got {show(model)}")
    al = [aliases] if isinstance(aliases, str) else list(aliases)
    for a in [name, *al]:
        if not isinstance(a, str) or not a.strip():
            raise TypeError(f"{name}: an alias must be a non-empty str, got {show(a)}")
        taken = a in _MODELS or a in _ALIASES
        if taken and not replace:
            owner = a if a in _MODELS else _ALIASES[a]
            raise ValueError(f"op name {a!r} is already registered (for {owner!r}); pass replace=True "
                             f"to tolstat.ops.register to replace it")
    for a in [name, *al]:
        if a in _MODELS and a != name:
            del _MODELS[a]
        _ALIASES.pop(a, None)
    _MODELS[name] = model
    for a in al:
        if a != name:
            _ALIASES[a] = name


def register(name: str, model: OpModel, *, aliases: Iterable[str] = (), replace: bool = False) -> None:
    """Register the model of an op under a canonical name and aliases.

    Parameters
    ----------
    name : str
        Canonical name (e.g. the torch function's name, ``"my_matmul"``).
    model : OpModel
        The model, e.g. from :func:`~tolstat.ops.registry.multilinear`.
    aliases : iterable of str, optional
        Other spellings that resolve to ``name`` (``torch.``, ``F.``, ``aten.`` prefixes are
        stripped anyway, see :func:`canonical_name`).
    replace : bool, default False
        Replace an op (or alias) of the same name; otherwise that is an error.

    Raises
    ------
    ValueError
        A name or alias is already registered and ``replace`` is False.
    TypeError
        ``model`` is not an :class:`~tolstat.ops.model.OpModel` or a name is not a non-empty str.
    """
    _ensure_builtins()
    _add(name, model, aliases, replace)


def _normalise(name: str) -> str:
    n = name.strip()
    aten = False
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if n.startswith(p) and len(n) > len(p):
                aten = aten or "aten." in p
                n, changed = n[len(p):], True
                break
    if aten:
        n = n.split(".")[0]
    return n.removesuffix(".default")


def canonical_name(name: str) -> str | None:
    """The canonical op name a spelling resolves to, None if none.

    Exact names and aliases first, then the spelling without its ``torch.``,
    ``torch.nn.functional.``, ``F.``, ``Tensor.``, ``aten.`` prefixes and its aten overload
    suffix (``aten.sum.dim_IntList`` -> ``sum``, ``.default``).
    """
    _ensure_builtins()
    if not isinstance(name, str):
        raise TypeError(f"op name must be a str, got {show(name)}")
    if name in _MODELS:  # the common case, before the spelling is normalised
        return name
    for n in (name, name.strip(), _normalise(name)):
        if n in _MODELS:
            return n
        if n in _ALIASES:
            return _ALIASES[n]
    return None


def get(name: str) -> OpModel:
    """The model of an op, by canonical name or alias.

    Parameters
    ----------
    name : str
        ``"matmul"``, ``"torch.matmul"``, ``"F.softmax"``, ``"aten.mm.default"``, ``"@"``, ...

    Returns
    -------
    OpModel

    Raises
    ------
    UnknownOpError
        (a ``KeyError``) no model is registered under that name; the message names the
        closest known names and how to register one.
    """
    canon = canonical_name(name)
    if canon is None:
        known = sorted(set(_MODELS) | set(_ALIASES))
        close = difflib.get_close_matches(_normalise(name), known, n=4, cutoff=0.6)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownOpError(
            f"no operator model for {name!r}{hint} Known ops: {', '.join(names())}. Register one with "
            f"tolstat.ops.register(name, tolstat.ops.multilinear(fn, K=...)) or "
            f"tolstat.ops.register(name, tolstat.ops.OpModel(...)).")
    return _MODELS[canon]


def names() -> list[str]:
    """The canonical names of the registered ops, sorted."""
    _ensure_builtins()
    return sorted(_MODELS)


def aliases(name: str) -> list[str]:
    """The registered aliases of an op (by any of its names), sorted."""
    canon = canonical_name(name)
    if canon is None:
        get(name)  # raises UnknownOpError
    return sorted(a for a, c in _ALIASES.items() if c == canon)


def op_statistics(op: str, inputs: Sequence[Any], params: Mapping[str, Any] | None = None, *,
                  dtype: Any, reference: Any = None) -> OpStatistics:
    """Magnitude, reduction length and row flag of one call of a torch op.

    Parameters
    ----------
    op : str
        The torch function's name or an alias (``"matmul"``, ``"torch.nn.functional.linear"``,
        ``"F.softmax"``, ``"aten.mm.default"``, ``"attention"``).
    inputs : sequence
        Its positional arguments, exactly as the kernel under test was called: numpy arrays or
        torch tensors of any dtype (bfloat16 included; they are the low-precision inputs the
        kernel saw, converted exactly to float64), and non-array arguments
        (``normalized_shape``, ``dim``) where torch takes them positionally.
    params : mapping, optional
        Its keyword arguments (``{"eps": 1e-5}``, ``{"dim": -1}``); torch's defaults fill the rest.
    dtype : str or dtype
        The kernel's output format (``"float16"``, ``torch.bfloat16``, ...).
    reference : array, optional
        The call's reference (the op's output in float64 on the same inputs). Where the
        op's model has an identity that gives the magnitude from it
        (:attr:`~tolstat.ops.model.OpModel.from_reference`: ``|ref|`` for softmax, rms_norm,
        tanh; ``|ref| + 1`` for log_softmax; ``ref + max(-x, 0)`` for gelu; ...) the
        magnitude is computed that way, without evaluating the op again: the same values up
        to the reference's rounding. A reference of another shape than the op's output is
        not used. :func:`tolstat.check`, :func:`tolstat.collect` and
        :func:`tolstat.from_pairs` pass theirs.

    Returns
    -------
    OpStatistics
        ``magnitude`` (float64, the output's shape), ``K`` (>= 1) and ``rowwise``; pass them to
        :func:`tolstat.measure.noise.record_statistics` as ``magnitude=``, ``K=``, ``rowwise=``.

    Raises
    ------
    UnknownOpError
        No model for ``op``.
    TypeError, ValueError
        Arguments that the torch function would refuse (their number, kinds or shapes); the
        message names the op, the argument and the value.

    Notes
    -----
    Non-finite inputs are allowed: the magnitude is then non-finite (inf or NaN) wherever the
    op on absolute inputs is (an ``inf`` input makes every output it reaches ``inf``;
    ``inf * 0`` and ``inf - inf`` are NaN), which the noise model treats as its
    non-finite outputs.

    Examples
    --------
    >>> import numpy as np
    >>> from tolstat.ops import op_statistics
    >>> a = np.ones((4, 8), np.float16); b = -np.ones((8, 3), np.float16)
    >>> st = op_statistics("torch.matmul", (a, b), dtype="float16")
    >>> st.magnitude[0, 0], st.K, st.rowwise
    (8.0, 8.0, False)
    """
    if not isinstance(op, str):
        raise TypeError(f"op must be the name of a torch function (a str), got {show(op)}")
    target_dtype(dtype)  # validates
    model = get(op)
    args = inputs
    if type(args) not in (tuple, list) and (isinstance(args, (str, bytes)) or not isinstance(args, Sequence)):
        raise TypeError(f"{op}: inputs must be the sequence of the op's positional arguments, got {show(args)}")
    if params is not None and type(params) is not dict and not isinstance(params, Mapping):
        raise TypeError(f"{op}: params must be a mapping of keyword arguments, got {show(params)}")
    kwargs = dict(params or {})
    ref = None
    if reference is not None and model.from_reference is not None:
        ref = reference if isinstance(reference, np.ndarray) and reference.dtype == np.float64 else \
            to_f64(reference, op, "reference")
    with np.errstate(all="ignore"):
        m, k, rows = model.statistics(args, kwargs, dtype, ref)
        m = np.asarray(m, dtype=np.float64)
    if math.isnan(k) or k < 0:
        raise ValueError(f"{op}: the model's reduction length K must be >= 0, got {k!r}")
    return OpStatistics(magnitude=m, K=max(k, 1.0), rowwise=rows)


def _torch_fn(fn: Any) -> bool:
    mod = getattr(fn, "__module__", None) or getattr(getattr(fn, "__objclass__", None), "__module__", "")
    return str(mod).split(".")[0] == "torch"


def _abs_arg(x: Any, torch_fn: bool, i: Any) -> Any:
    if not is_array(x):
        return x
    a = np.abs(to_f64(x, "multilinear", str(i)))
    if torch_fn:
        import torch  # noqa: PLC0415 - optional, only for a torch function

        return torch.from_numpy(a)
    return a


def _result(y: Any) -> np.ndarray:
    if is_torch(y) and hasattr(y, "detach"):
        return y.detach().cpu().double().numpy()
    return np.asarray(y, dtype=np.float64)


def multilinear(fn: Callable[..., Any], *, K: Union[int, float, KFn] = 1, rowwise: bool = False,
                model: str = "") -> OpModel:
    """The generic model of an op that is linear in each input: ``fn`` on absolute inputs.

    ``magnitude = fn(|a|, |b|, ...)`` in float64, where every array argument (numpy array or
    torch tensor, positional or keyword) is replaced by its absolute value in float64 and
    every other argument (``dim``, Python numbers) is passed unchanged. For a product, a
    sum or a contraction with nonnegative coefficients this is ``sum_j |x_j| |y_j|``, the
    covariate of the probabilistic error bound ``sqrt(K) u |x|^T |y|``. ``fn`` gets numpy
    arrays, or float64 torch tensors when it is a torch function (``torch.matmul``,
    ``torch.einsum``).

    Parameters
    ----------
    fn : callable
        The op's float64 formula (``numpy.matmul``, ``lambda a, b: a @ b.T``, ``torch.einsum``).
    K : int, float or callable, default 1
        Reduction length: a number, or ``K(args, kwargs) -> float`` of the call's arguments.
    rowwise : bool, default False
        The op computes output rows (last axis) together.
    model : str, optional
        One line describing the magnitude (default: ``"<fn> on absolute inputs"``).

    Returns
    -------
    OpModel

    Examples
    --------
    >>> import numpy as np
    >>> from tolstat.ops import multilinear
    >>> m = multilinear(np.matmul, K=lambda args, kwargs: args[0].shape[-1])
    >>> m.magnitude((np.array([[1.0, -2.0]]), np.array([[3.0], [4.0]])), {}, "float16")
    array([[11.]])
    """
    if not callable(fn):
        raise TypeError(f"multilinear: fn must be callable, got {show(fn)}")
    if callable(K):
        k_fn: KFn = K
    else:
        if isinstance(K, bool) or not isinstance(K, (int, float, np.integer, np.floating)) or not K >= 1:
            raise ValueError(f"multilinear: K must be a number >= 1 or a callable (args, kwargs) -> K, got {K!r}")
        k_val = float(K)
        k_fn = lambda args, kwargs: k_val  # noqa: E731
    torch_fn = _torch_fn(fn)

    def magnitude(args: Sequence[Any], kwargs: Mapping[str, Any], dtype: Any) -> np.ndarray:
        a = [_abs_arg(x, torch_fn, i) for i, x in enumerate(args)]
        kw = {k: _abs_arg(v, torch_fn, k) for k, v in kwargs.items()}
        return _result(fn(*a, **kw))

    name = getattr(fn, "__name__", type(fn).__name__)
    return OpModel(magnitude=magnitude, K=k_fn, rowwise=bool(rowwise),
                   model=model or f"{name} on absolute inputs",
                   k_rule=f"{float(K):g}" if not callable(K) else "computed")

