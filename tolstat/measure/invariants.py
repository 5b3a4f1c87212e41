"""Operator invariants: properties a correct output keeps exactly, in units of rounding noise.

A softmax row sums to 1, a masked position stays 0, a normalised row keeps the
reference row's mean and spread. Each invariant is a function
``fn(actual, expected, scale) -> float`` registered for an op
(:func:`register_invariant`); :func:`tolstat.measure.noise.run_statistics` stores its value
as the per-run statistic ``inv_<name>``. numpy only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["InvariantFn", "invariant_values", "invariants", "register_invariant"]


InvariantFn = Callable[[np.ndarray, np.ndarray, np.ndarray], float]
_INVARIANTS: dict[str, dict[str, InvariantFn]] = {}


def register_invariant(op: str, name: str, fn: InvariantFn, *, replace: bool = False) -> None:
    """Register an operator invariant, computed by :func:`run_statistics` for ``op``.

    Parameters
    ----------
    op : str
        Operator name (as passed to ``run_statistics(op=...)``).
    name : str
        Statistic name; stored as ``inv_<name>``. Letters, digits and ``_`` only.
    fn : callable
        ``fn(actual, expected, scale) -> float``: float64 arrays of the same shape, rows
        along the last axis, ``scale`` the noise scale ``s_i``. It returns a nonnegative
        statistic in units of rounding noise (0 when the invariant holds exactly; large
        when it is violated). A non-finite output that differs from its reference never
        reaches it (the statistics are ``inf`` then); a matched non-finite pair (equal
        infinities, or NaN in both) does, and is exact (``inf - inf`` is NaN there; it is
        called with invalid-operation warnings silenced).
    replace : bool, default False
        Allow replacing an invariant of the same name.

    Raises
    ------
    ValueError
        Bad name, or the name is taken and ``replace`` is False.
    TypeError
        ``fn`` is not callable.
    """
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be a non-empty string, got {op!r}")
    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise ValueError(f"invariant name must be letters, digits and '_', got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    table = _INVARIANTS.setdefault(op, {})
    if name in table and not replace:
        raise ValueError(f"invariant {name!r} of op {op!r} is already registered (replace=True)")
    table[name] = fn


def invariants(op: str | None) -> dict[str, InvariantFn]:
    """The invariants registered for an op (name -> function; empty if none)."""
    return dict(_INVARIANTS.get(op or "", {}))


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def _proj_stat(d: np.ndarray, s: np.ndarray, w: np.ndarray | None = None) -> float:
    """max over rows |sum_j w_j d_j| / sqrt(sum_j w_j^2 s_j^2): a matched filter
    (``w = None``: all ones). Entries where ``d`` is not finite (a matched non-finite pair,
    ``inf - inf`` or ``nan - nan``: exact) do not contribute."""
    d, s = _rows(d), _rows(s)
    w = None if w is None else _rows(w)
    ok = np.isfinite(d)
    if not ok.all():
        d, s = np.where(ok, d, 0.0), np.where(ok, s, 0.0)
        w = None if w is None else np.where(ok, w, 0.0)
    if w is None:
        num = np.abs(d.sum(-1))
        den = np.sqrt(np.einsum("ij,ij->i", s, s))
    else:
        num = np.abs(np.einsum("ij,ij->i", w, d))
        ws = w * s
        den = np.sqrt(np.einsum("ij,ij->i", ws, ws))
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(num == 0, 0.0, num / den)
    return float(t.max()) if t.size else 0.0


def _inv_softmax_row_sum(a, e, s):
    """Rows of a softmax sum to 1: |sum_j a_j - sum_j e_j| in units of sqrt(sum s_j^2)."""
    return _proj_stat(a - e, s)


def _inv_masked_zero(a, e, s):
    """Masked (exactly zero probability) positions stay exactly zero: count of violations."""
    return float(np.count_nonzero((e == 0) & (a != 0)))


def _inv_log_softmax_lse(a, e, s):
    """exp of a log-softmax row sums to 1: sum_j p_j d_j in units of sqrt(sum p_j^2 s_j^2)."""
    return _proj_stat(a - e, s, np.exp(e))


def _inv_row_mean(a, e, s):
    """A normalised row keeps the reference row's mean (mean 0 before the affine step)."""
    return _proj_stat(a - e, s)


def _inv_row_scale_centred(a, e, s):
    """A normalised row keeps the reference row's spread: projection of d on ref - mean."""
    r = _rows(e)
    return _proj_stat(a - e, s, r - r.mean(-1, keepdims=True))


def _inv_row_scale(a, e, s):
    """An RMS-normalised row keeps the reference row's scale: projection of d on ref."""
    return _proj_stat(a - e, s, e)


register_invariant("softmax", "row_sum", _inv_softmax_row_sum)
register_invariant("softmax", "masked_zero", _inv_masked_zero)
register_invariant("log_softmax", "row_lse", _inv_log_softmax_lse)
register_invariant("layer_norm", "row_mean", _inv_row_mean)
register_invariant("layer_norm", "row_scale", _inv_row_scale_centred)
register_invariant("rms_norm", "row_scale", _inv_row_scale)


def invariant_values(a: np.ndarray, e: np.ndarray, s: np.ndarray, finite: np.ndarray, row_axis: int,
                      inv: dict[str, InvariantFn], op: str | None) -> dict[str, float]:
    """``inv_<name>`` of each invariant (``s`` already 1 where ``finite`` is False)."""
    out: dict[str, float] = {}
    am, em, sm = (np.moveaxis(x, row_axis, -1) if x.ndim else x for x in (a, e, s))
    if not finite.all():
        am = np.where(np.moveaxis(finite, row_axis, -1) if finite.ndim else finite, am, em)
    for k, fn in inv.items():
        with np.errstate(invalid="ignore"):  # inf - inf of a matched non-finite pair
            v = float(fn(am, em, sm))
        if not (v >= 0):  # NaN or negative
            raise ValueError(f"invariant {k!r} of op {op!r} returned {v!r}; it must be >= 0")
        out[f"inv_{k}"] = v
    return out
