"""Argument validation shared by every boundary of tolstat (API, files, CLI, plugin).

Foundation layer: imports nothing from the rest of the package. Every checker raises
``ValueError`` or ``TypeError`` with a message that names the argument, the value it got
and what is allowed (see ``docs/errors.md``).
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
from numbers import Real
from typing import Any, Iterable, Mapping

import numpy as np

__all__ = [
    "MIN_BUDGET", "MAX_BUDGET", "unit_interval", "finite_number", "budget", "count",
    "label_name", "label_value", "covariates", "float_array", "code_fingerprint", "duplicate_rows",
]

#: smallest false-positive budget accepted: an order-statistic threshold at this budget
#: needs about 3e9 calibration runs (``n >= log(1 - confidence) / log(1 - budget)``);
#: anything smaller is a typo (``1e-300``) or cannot be calibrated on any realistic data
MIN_BUDGET = 1e-9
#: largest false-positive budget accepted: a check that may fail a correct kernel more
#: often than not is no test (``fp_budget=5`` is a typo for 0.05 or 5%)
MAX_BUDGET = 0.5

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for an error message."""
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


_short = short_repr


def option_object(options: Any, cls: type) -> Any:
    """``options`` checked to be an instance of the option class ``cls`` (``None``: ``cls()``,
    the defaults); a ``TypeError`` naming the class otherwise."""
    if options is None:
        return cls()
    if not isinstance(options, cls):
        raise TypeError(f"options must be a tolstat.{cls.__name__} or None, got {_short(options)} "
                        f"({type(options).__name__})")
    return options


def finite_number(name: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                  lo_open: bool = False, hi_open: bool = False) -> float:
    """``float(value)``, checked to be a finite real number in ``[lo, hi]``.

    Strings, booleans, lists and complex numbers are refused (``TypeError``); NaN, inf
    and values out of range raise ``ValueError``. The message names ``name``, the value
    and the allowed range.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.integer, np.floating)):
        if not (isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"):
            raise TypeError(f"{name} must be a real number, got {_short(value)} ({type(value).__name__})")
    f = float(value)
    lo_s = "-inf" if lo is None else f"{lo:g}"
    hi_s = "inf" if hi is None else f"{hi:g}"
    rng = f"{'(' if lo_open or lo is None else '['}{lo_s}, {hi_s}{')' if hi_open or hi is None else ']'}"
    if not math.isfinite(f):
        raise ValueError(f"{name} must be a finite number in {rng}, got {_short(value)}")
    if lo is not None and (f < lo or (lo_open and f == lo)):
        raise ValueError(f"{name} must lie in {rng}, got {f!r}")
    if hi is not None and (f > hi or (hi_open and f == hi)):
        raise ValueError(f"{name} must lie in {rng}, got {f!r}")
    return f


def unit_interval(name: str, value: Any) -> float:
    """``float(value)``, checked to lie strictly between 0 and 1.

    Raises
    ------
    ValueError
        ``value`` is not a number, or not in the open interval (0, 1); the message names
        the argument and the value.
    """
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1), got {_short(value)}") from None
    if not (0.0 < f < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {f!r}")
    return f


def budget(name: str, value: Any, lo: float = MIN_BUDGET) -> float:
    """A false-positive budget: a probability in ``[lo, MAX_BUDGET]``, by default [1e-9, 0.5].

    Raises
    ------
    ValueError
        Not a number, NaN, or outside the allowed range (the message gives the range and
        why it is bounded).
    """
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a probability in [{lo:g}, {MAX_BUDGET:g}], "
                         f"got {_short(value)}") from None
    if not (lo <= f <= MAX_BUDGET):
        raise ValueError(
            f"{name} must be a probability in [{lo:g}, {MAX_BUDGET:g}] (the largest chance "
            f"that a check of a correct kernel fails; below {lo:g} no realistic calibration "
            f"can support it), got {f!r}"
        )
    return f


def count(name: str, value: Any, minimum: int = 1) -> int:
    """An integer ``>= minimum`` (run counts, cases, sample sizes); bools and floats refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {_short(value)} ({type(value).__name__})")
    if int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {int(value)}")
    return int(value)


def label_name(kind: str, name: Any) -> str:
    """A label or covariate *name*: a non-empty string without commas or control characters.

    Names are stored comma-joined in the dataset attributes, so a comma would split one
    name into two on reading.
    """
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a string, got {_short(name)} ({type(name).__name__})")
    if not name or name.strip() != name:
        raise ValueError(f"{kind} name {name!r} must be non-empty without leading/trailing spaces")
    if "," in name or _CONTROL.search(name):
        raise ValueError(f"{kind} name {name!r} may not contain commas or control characters "
                         "(names are stored comma-separated)")
    return name


def label_value(name: str, value: Any) -> str:
    """A label *value* (op, hardware, free labels): text without NUL or control characters.

    A NUL would be cut off by netCDF/HDF5 string storage and silently merge two groups.
    """
    s = value if isinstance(value, str) else str(value)
    m = _CONTROL.search(s)
    if m:
        raise ValueError(f"{name} {s!r} contains the control character {m.group()!r} at position "
                         f"{m.start()}; labels must be printable text")
    return s


def covariates(cov: Mapping[str, Any] | None, *, computed: Iterable[str] = (),
               what: str = "covariates") -> dict[str, float]:
    """Validate run covariates: ``{name: finite real number}``.

    Parameters
    ----------
    cov : mapping or None
        The user's covariates.
    computed : iterable of str
        Names computed by tolstat from the data (``ref_rms``, ``ref_max_abs``,
        ``n_elements``): the user may not override them.

    Raises
    ------
    TypeError
        ``cov`` is not a mapping, or a value is not a real scalar (a list, a string).
    ValueError
        A value is NaN/inf, a name is malformed, or a computed covariate is given.
    """
    if cov is None:
        return {}
    if not isinstance(cov, Mapping):
        raise TypeError(f"{what} must be a mapping {{name: number}}, got {type(cov).__name__}")
    comp = set(computed)
    out: dict[str, float] = {}
    for k, v in cov.items():
        k = label_name("covariate", k)
        if k in comp:
            raise ValueError(f"covariate {k!r} is computed from the reference and cannot be overridden "
                             f"(computed covariates: {sorted(comp)}); remove it from {what}")
        if isinstance(v, np.ndarray) and v.ndim == 0:
            v = v[()]
        out[k] = finite_number(f"covariate {k!r}", v)
    return out


def float_array(name: str, a: np.ndarray) -> np.ndarray:
    """Refuse arrays tolstat cannot measure rounding error of; return ``a``.

    Allowed: real floating dtypes (numpy float16/32/64, ml_dtypes bfloat16 and float8).
    Refused with ``TypeError``: integer/bool (compare exactly), complex (split into real
    and imaginary parts), strings, bytes, objects and structured dtypes.
    """
    dt = a.dtype
    kind = dt.kind
    if dt.names is not None:
        raise TypeError(f"{name} has a structured dtype {dt}: pass one float field at a time "
                        f"(fields: {list(dt.names)})")
    if kind in "biu":
        raise TypeError(
            f"{name} has integer/bool dtype {dt}: tolstat measures floating-point "
            "rounding error; compare integer outputs exactly instead"
        )
    if kind == "c":
        raise TypeError(
            f"{name} has complex dtype {dt}: complex outputs are not supported; "
            "pass real and imaginary parts as separate checks"
        )
    if kind == "f" or (kind == "V" and (dt.name == "bfloat16" or dt.name.startswith("float8"))):
        return a
    raise TypeError(f"{name} has unsupported dtype {dt} (kind {kind!r}); expected a real floating "
                    "dtype (float16/32/64, bfloat16, float8)")


def code_fingerprint(fn: Any) -> str:
    """A hash of a callable's code (bytecode, constants, names, closure values' reprs).

    Two callables with the same name but a different body get different fingerprints;
    the same function object (or a re-definition with the same body) gets the same one.
    ``functools.partial`` objects hash their function and arguments; callable objects
    hash their class's ``__call__``.
    """
    h = hashlib.sha256()
    _feed(h, fn, depth=0)
    return h.hexdigest()[:16]


def _feed(h: Any, obj: Any, depth: int) -> None:
    import functools

    if depth > 4:
        h.update(repr(type(obj)).encode())
        return
    if isinstance(obj, functools.partial):
        _feed(h, obj.func, depth + 1)
        h.update(repr((obj.args, sorted(obj.keywords.items()))).encode())
        return
    fn = getattr(obj, "__func__", obj)  # bound methods
    code = getattr(fn, "__code__", None)
    if code is None and callable(obj) and not isinstance(obj, type):
        call = getattr(type(obj), "__call__", None)
        code = getattr(call, "__code__", None)
        fn = call
    if code is None:
        try:
            h.update(inspect.getsource(obj).encode())
        except (OSError, TypeError):
            h.update(repr(obj).encode())
        return
    _feed_code(h, code)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:  # empty cell
            continue
        if callable(v):
            _feed(h, v, depth + 1)
        else:
            h.update(_safe_repr(v).encode())
    for d in getattr(fn, "__defaults__", None) or ():
        h.update(_safe_repr(d).encode())


def _feed_code(h: Any, code: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if inspect.iscode(c):
            _feed_code(h, c)
        else:
            h.update(_safe_repr(c).encode())


def _safe_repr(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"ndarray{v.shape}{v.dtype}:{hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()}"
    if isinstance(v, type) or callable(v):
        return getattr(v, "__qualname__", type(v).__name__)
    r = repr(v)
    return re.sub(r" at 0x[0-9a-f]+", "", r)  # object reprs with addresses are not stable


def duplicate_rows(columns: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """Indices of rows equal, in every column, to an earlier row (exact byte equality).

    Each column is an array whose first axis has length ``rows``; string columns are
    compared as text, float columns bit by bit (so NaN padding compares equal).

    Rows are hashed column by column, those with the most distinct values among the first
    256 rows first; after the first columns (and then at doubling intervals) only the rows
    whose hash so far is shared by another row stay candidates: distinct measurements
    usually differ in their first measured column, so the other columns are read for a few
    rows only. The candidates left at the end are compared
    byte for byte, so a hash collision never makes two rows equal.
    """
    if rows < 2:
        return np.zeros(0, dtype=np.int64)
    cols = {}
    for name in sorted(columns):
        v = np.asarray(columns[name])
        if v.shape[:1] != (rows,):
            raise ValueError(f"column {name!r} has {v.shape[:1]} rows, expected {rows}")
        cols[name] = v
    # the columns with the most distinct values among the first rows first (measurements:
    # most rows differ there), so that few candidates are left for the others
    head = np.arange(min(rows, 256))
    order = sorted(cols, key=lambda k: (-_distinct(_row_bytes(cols[k], head)), k))
    from tolstat._base.label_kernels import shared_hashes

    cand = np.arange(rows, dtype=np.int64)
    h = np.full(rows, 0xCBF29CE484222325, dtype=np.uint64)
    check_at = {0, len(order) - 1} | {2 ** k - 1 for k in range(1, max(len(order), 1).bit_length() + 1)}
    for j, name in enumerate(order):
        _mix_hash(h, _row_bytes(cols[name], cand))
        if j in check_at:
            shared = shared_hashes(h)  # which hashes occur more than once (no sort)
            if not shared.all():
                cand, h = cand[shared], h[shared]
            if cand.size == 0:
                return np.zeros(0, dtype=np.int64)
    # equal rows have equal hashes: the candidates are compared byte by byte, in row order
    mat = np.ascontiguousarray(np.concatenate([_row_bytes(cols[name], cand) for name in sorted(cols)], axis=1))
    rowv = mat.view(np.dtype((np.void, mat.shape[1]))).ravel()
    _, first = np.unique(rowv, return_index=True)
    dup = np.ones(cand.size, dtype=bool)
    dup[first] = False
    return cand[dup].astype(np.int64)


def _distinct(part: np.ndarray) -> int:
    """How many distinct byte rows ``part`` (2-D uint8) holds."""
    if part.shape[1] == 0:
        return 1
    return int(np.unique(np.ascontiguousarray(part).view(np.dtype((np.void, part.shape[1]))).ravel()).size)


def _row_bytes(v: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The bytes of each of ``rows`` of column ``v`` as a ``(len(rows), width)`` uint8 array
    (Python objects compared as their text)."""
    v = v if rows.size == v.shape[0] else v[rows]
    if v.dtype.kind == "O":
        v = v.astype(str)
    n = v.shape[0]
    return np.ascontiguousarray(v).reshape(n, -1).view(np.uint8).reshape(n, -1)


def _mix_hash(h: np.ndarray, part: np.ndarray) -> None:
    """Fold the byte rows ``part`` into the 64-bit hashes ``h`` in place: one numba pass
    (:func:`tolstat._base.label_kernels.mix_row_hashes`), 8 bytes at a time where the width
    allows (every numeric column), else byte by byte."""
    from tolstat._base.label_kernels import mix_row_hashes

    mix_row_hashes(h, part.view(np.uint64) if part.shape[1] % 8 == 0 and part.flags.c_contiguous else part)
