"""One-pass reductions of a kernel output against its reference (the fast check path).

:func:`tolstat.error_metrics` materialises every element-wise error (absolute, signed,
relative, ULP) as float64 arrays; a check needs only a few numbers of them: the maximum
of one element score, where it is, how many elements exceed the threshold, whether the
output is correctly rounded, and a few sums. The kernels here compute those in one numba
pass over the two arrays, reading a low-precision output through a lookup table of its
bit patterns (the exact float64 value of every 8/16-bit code), so no float64 copy of the
output is made:

* :func:`check_pass`: the largest element score (``|d|``, ``|d| / max(|ref|, floor)``, the
  affine scale of a :class:`tolstat.models.ScaleModel`, or the operator noise scale), its
  first index, the exceedance count, ``max |ref|`` and the correctly rounded flag (the ULP
  distance of :func:`tolstat.measure.metrics.ulp_distance` is 0 everywhere), for finite
  pairs; every operation in the order of the numpy definitions, so the results are
  theirs bit for bit;
* :func:`sum_of_squares` and :func:`error_sums`: numpy's pairwise summation (the order of
  ``numpy.sum``), bit for bit, over values computed on the fly;
* :func:`op_statistics`: the operator-noise statistics of
  :func:`tolstat.measure.noise.record_statistics` (sequential sums, as recorded), with the
  reference rounded to the output format inside the pass (:func:`_round_ref`, on the float64
  bits) and, in the same pass, what an operator-form check needs (the worst element, the
  exceedance count, whether the output is correctly rounded, the magnitude's checks); a
  pair without a non-finite value or scale takes the blocked kernel below with every
  column (the same numbers bit for bit), any other :func:`_op_kernel`, the reference;
* :func:`op_check_statistics`: what an operator-form check reads of :func:`op_statistics`
  (the statistics a combined score can hold, the worst element, the counts), the same
  numbers bit for bit, in blocks whose element-wise part vectorises (its divisions several
  at a time) before the sequential sums; a pair it does not cover (non-finite values, a
  magnitude that fails its tests) is left to :func:`op_statistics`.

A non-finite value in either array makes the check kernels return None: the caller then
takes the general path (NaN/Inf handling, reference checks, messages).

Layer: metrics (imports only :mod:`tolstat._base`, numpy and numba; ml_dtypes through
:func:`tolstat._base.dtypes.finfo` where a bfloat16 or float8 format is read).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from tolstat._base import numba_cache as _numba_cache
from tolstat._base.cast_kernels import decode16 as _decode16, float_bits as _bits, float_from_bits as _from_bits
from tolstat._base.dtypes import finfo, target_dtype

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

__all__ = ["decode_table", "CheckPass", "CHECK_MODES", "CR_MODES", "FormatLayout", "format_layout", "check_pass",
           "sum_of_squares", "error_sums", "OpPass", "op_statistics", "round_params",
           "OP_CHECK_COLUMNS", "op_check_statistics"]

_LUTS: dict[str, np.ndarray] = {}
#: the same tables by the dtype (or type) asked for: a per-call lookup without ``dtype.name``
_LUT_OF: dict[object, tuple[np.ndarray | None]] = {}


def decode_table(dtype: np.dtype) -> np.ndarray | None:
    """float64 value of every bit pattern of an 8- or 16-bit float dtype (None otherwise).

    Built once per dtype with the dtype's own (exact) cast to float64.
    """
    hit = _LUT_OF.get(dtype)
    if hit is not None:
        return hit[0]
    dt = np.dtype(dtype)
    if dt.itemsize not in (1, 2) or dt.kind not in "fV":
        _LUT_OF[dtype] = (None,)
        return None
    key = dt.name
    lut = _LUTS.get(key)
    if lut is None:
        codes = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint8 if dt.itemsize == 1 else np.uint16)
        with np.errstate(invalid="ignore", over="ignore"):
            lut = codes.view(dt).astype(np.float64)
        _LUTS[key] = lut
    _LUT_OF[dtype] = (lut,)
    return lut


# --------------------------------------------------------------------------- check pass
#: element scores of :func:`check_pass`: ``abs`` = ``|d|``, ``rel`` = ``|d| / max(|ref|, floor)``,
#: ``scale`` = ``|d| / s`` with the affine scale of :class:`tolstat.models.ScaleModel`, ``op`` =
#: ``|d| / s`` with the operator noise scale of :func:`tolstat.measure.noise.noise_scale`
CHECK_MODES = {"abs": 0, "rel": 1, "scale": 2, "op": 3}
#: how :func:`check_pass` decides "correctly rounded", for an output stored in the target
#: format: by the rounding interval of its bit pattern (``interval``, 8/16-bit formats,
#: :func:`_cr_interval`), by a float32 rounding (``f32``), by equality (``f64``); for any
#: other output only a necessary condition, to be confirmed by the ULP distance (``loose``)
CR_MODES = {"interval": 1, "f32": 2, "f64": 3, "loose": 4}
_TINY64 = float(np.finfo(np.float64).tiny)
_NO_LUT = np.zeros(1)  # the lut argument of a kernel reading a float32/float64 output


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _elem(ad: float, r: float, mv: float, mode: int, k0: float, k1: float, k2: float, k3: float,
          k4: float) -> tuple[float, float]:
    """``(score, s)`` of one finite element: ``ad = |d|``, ``r = |ref|``, ``mv`` the magnitude.

    The operations and their order are those of the numpy definitions (bit for bit):
    ``rel``: ``ad / max(r, floor)`` (``k0 = floor``), 0 where ``ad == 0``;
    ``scale``: ``s = max(unit * ((atol + rtol * r) + add) * mult, tiny64)`` with
    ``(k0, k1, k2, k3, k4) = (atol, rtol, unit, add, mult)`` (``ScaleModel.scale``), score
    ``ad / s``, 0 where ``ad == 0`` or NaN (``Statistic.elements``);
    ``op``: ``s = ((A * r) + (B * |mv|)) + D`` with ``(k0, k1, k2) = (A, B, D)``
    (``noise_scale``), score ``ad / s``, 0 where NaN.
    """
    if mode == 0:
        return ad, 1.0
    if mode == 1:
        den = r if r > k0 else k0
        return (0.0 if ad == 0.0 else ad / den), den
    if mode == 2:
        t = k2 * ((k0 + k1 * r) + k3) * k4
        s = t if (t != t or t >= _TINY64) else _TINY64
        if ad == 0.0:
            return 0.0, s
        sc = ad / s
        return (0.0 if sc != sc else sc), s
    s = ((k0 * r) + (k1 * abs(mv))) + k2
    sc = ad / s
    return (0.0 if sc != sc else sc), s


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _cr_interval(b: int, ev: float, bounds: np.ndarray) -> bool:
    """True when the output with bit pattern ``b`` (of an 8/16-bit target format) is the
    finite reference ``ev`` rounded to nearest even in the format: ``ev`` is inside the
    rounding interval ``[bounds[2b], bounds[2b+1]]`` of the pattern's value, its ends
    included when the pattern's significand is even (a tie rounds to it). The intervals
    (:func:`_rounding_intervals`) follow :func:`tolstat.measure.metrics.ulp_distance`:
    gradual underflow, ``-0 == +0``, a reference beyond ``max`` clamped to it up to the
    overflow edge ``max + ulp(max)/2``. The ULP distance is then 0.
    """
    lo = bounds[2 * b]
    hi = bounds[2 * b + 1]
    return ((lo < ev) & (ev < hi)) | (((b & 1) == 0) & (lo <= ev) & (ev <= hi))


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _step(av: float, ev: float, mv: float, i: int, mode: int, use_m: bool, k0: float, k1: float, k2: float, k3: float,
          k4: float, c: float, best: float, arg: int, n_exc: int,
          rmax: float) -> tuple[bool, float, int, int, float]:
    """One element of :func:`_pass`: ``(finite, best, arg, n_exc, rmax)`` updated."""
    d = av - ev
    if not (np.isfinite(d) and np.isfinite(ev)):
        return False, best, arg, n_exc, rmax
    ad = abs(d)
    r = abs(ev)
    if r > rmax:
        rmax = r
    sc, s = _elem(ad, r, mv if use_m else r, mode, k0, k1, k2, k3, k4)
    if sc > best:
        best, arg = sc, i
    if mode == 3:
        n_exc += ad > c * s
    else:
        n_exc += sc > c
    return True, best, arg, n_exc, rmax


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pass(a: np.ndarray, lut: np.ndarray, e: np.ndarray, bounds: np.ndarray, mag: np.ndarray, k0: float, k1: float,
          k2: float, k3: float, k4: float, c: float, crm: int, loose: float, lfloor: float, mode: int, use_lut: bool,
          use_m: bool) -> tuple[int, float, int, int, bool, float]:
    """One pass of a check: ``(status, max score, first argmax, #exceeding, correctly rounded,
    max |ref|)``; status 1: a non-finite element (at the returned index) was seen.

    Inlined into one kernel per score, correctly-rounded test and output kind
    (:data:`_KERNELS`), so that ``mode``, ``crm``, ``use_lut`` and ``use_m`` are constants
    there. ``a``: the output's bit patterns decoded by ``lut`` (``use_lut``), or a
    float32/float64 output. Each element is tested for correct rounding until one is not;
    the rest are only scored.
    """
    best, arg, n_exc, cr, rmax = -1.0, 0, 0, True, 0.0
    n = e.size
    i = 0
    while i < n:  # while the output may be correctly rounded
        av = lut[np.intp(a[i])] if use_lut else np.float64(a[i])
        ev = e[i]
        ok, best, arg, n_exc, rmax = _step(av, ev, mag[i] if use_m else 0.0, i, mode, use_m, k0, k1, k2, k3, k4, c,
                                           best, arg, n_exc, rmax)
        if not ok:
            return 1, 0.0, i, 0, False, 0.0
        if crm == 1:
            cr = _cr_interval(np.intp(a[i]), ev, bounds)
        elif crm == 2:
            cr = np.float32(ev) == np.float32(a[i])
        elif crm == 3:
            cr = av == ev
        else:
            aa = abs(av)
            cr = abs(av - ev) <= loose * (aa if aa > lfloor else lfloor)
        i += 1
        if not cr:
            break
    while i < n:  # the rest, once an element is not correctly rounded
        av = lut[np.intp(a[i])] if use_lut else np.float64(a[i])
        ok, best, arg, n_exc, rmax = _step(av, e[i], mag[i] if use_m else 0.0, i, mode, use_m, k0, k1, k2, k3, k4, c,
                                           best, arg, n_exc, rmax)
        if not ok:
            return 1, 0.0, i, 0, False, 0.0
        i += 1
    return 0, best, arg, n_exc, cr, rmax


def _kernel(mode: int, crm: int, use_lut: bool, use_m: bool):  # noqa: ANN202 - a numba dispatcher
    """The :func:`_pass` kernel with these constants (compiled per argument types, cached)."""
    if use_lut and use_m:
        @numba.njit(cache=True, nogil=True, error_model="numpy")
        def k(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, loose, lfloor):  # pragma: no cover - numba
            return _pass(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, crm, loose, lfloor, mode, True, True)
    elif use_lut:
        @numba.njit(cache=True, nogil=True, error_model="numpy")
        def k(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, loose, lfloor):  # pragma: no cover - numba
            return _pass(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, crm, loose, lfloor, mode, True, False)
    elif use_m:
        @numba.njit(cache=True, nogil=True, error_model="numpy")
        def k(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, loose, lfloor):  # pragma: no cover - numba
            return _pass(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, crm, loose, lfloor, mode, False, True)
    else:
        @numba.njit(cache=True, nogil=True, error_model="numpy")
        def k(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, loose, lfloor):  # pragma: no cover - numba
            return _pass(a, lut, e, bounds, mag, k0, k1, k2, k3, k4, c, crm, loose, lfloor, mode, False, False)
    return k


_KERNELS: dict[tuple[int, int, bool, bool], object] = {}


def _get_kernel(mode: int, crm: int, use_lut: bool, use_m: bool):  # noqa: ANN202 - a numba dispatcher
    key = (mode, crm, use_lut, use_m)
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = _kernel(mode, crm, use_lut, use_m)
    return k


class FormatLayout(NamedTuple):
    """What :func:`check_pass` needs of a target format (:func:`format_layout`).

    Attributes
    ----------
    bounds : numpy.ndarray
        For an 8/16-bit format, the rounding interval of every bit pattern's value,
        ``bounds[2b], bounds[2b+1]`` (:func:`_rounding_intervals`; NaN for NaN/Inf
        patterns): the exact test ``cr="interval"``.
    loose, lfloor : float
        The necessary condition of ``cr="loose"``: ``|d_i| <= loose * max(|actual_i|, lfloor)``,
        true wherever the output is correctly rounded, whatever its dtype (a cast to the
        format moves it by at most one spacing, the rounding of the reference by half of one).
    """

    bounds: np.ndarray
    loose: float
    lfloor: float


_LAYOUTS: dict[str, FormatLayout] = {}


def _rounding_intervals(td: object) -> np.ndarray:
    """``[lo, hi]`` of every bit pattern of an 8/16-bit format, flat: the references that
    round to its value (nearest even, :func:`tolstat._base.dtypes.round_to_format`), with
    the rules of :func:`tolstat.measure.metrics.ulp_distance`: a reference beyond ``max`` is
    clamped to it up to the overflow edge ``max + ulp(max)/2``, and ``-0 == +0``. The ends
    are midpoints between neighbours (exact in float64); whether a tie belongs to the
    interval is the parity of the pattern (:func:`_cr_interval`)."""
    lut = decode_table(td.np_dtype)
    nb = td.bits
    maxpat = int(np.array(td.max, dtype=td.np_dtype).view(td.uint_dtype))
    _, ex = np.frexp(np.float64(td.max))
    p = int(finfo(td.np_dtype).nmant) + 1
    edge = td.max + float(np.ldexp(1.0, int(ex) - 1 - p))
    pos = lut[:maxpat + 1]  # the non-negative finite values, increasing with the pattern
    mid = (pos[:-1] + pos[1:]) / 2
    lo = np.concatenate([[-pos[1] / 2], mid])  # zero's interval is symmetric
    hi = np.concatenate([mid, [edge]])
    out = np.full((2 ** nb, 2), np.nan)
    half = 2 ** (nb - 1)
    out[:maxpat + 1, 0], out[:maxpat + 1, 1] = lo, hi
    out[half:half + maxpat + 1, 0], out[half:half + maxpat + 1, 1] = -hi, -lo
    return out.ravel()


def format_layout(dtype: object) -> FormatLayout:
    """The :class:`FormatLayout` of a target dtype (any spelling :func:`target_dtype` takes), made once."""
    td = target_dtype(dtype)
    got = _LAYOUTS.get(td.name)
    if got is None:
        fi = finfo(td.np_dtype)
        p = int(fi.nmant) + 1
        bounds = _rounding_intervals(td) if td.bits <= 16 else np.ones(2)
        got = FormatLayout(bounds, float(2.0 ** (3 - p)), float(td.tiny))
        _LAYOUTS[td.name] = got
    return got


class CheckPass(NamedTuple):
    """Result of :func:`check_pass` (finite pairs only).

    Attributes
    ----------
    value : float
        ``max_i score_i``.
    index : int
        Flat index of its first occurrence (as ``numpy.argmax``).
    actual, expected : float
        float64 values of the pair at ``index``.
    n_exceeding : int
        Elements over their allowance (``score_i > threshold``, or with ``count_abs``
        ``|d_i| > threshold * s_i``).
    correctly_rounded : bool
        Every element is the reference rounded to nearest in the target format (the ULP
        distance is 0 everywhere); with ``cr="loose"`` only a necessary condition of it.
    ref_max_abs : float
        ``max_i |expected_i|``.
    """

    value: float
    index: int
    actual: float
    expected: float
    n_exceeding: int
    correctly_rounded: bool
    ref_max_abs: float


def check_pass(actual: np.ndarray, expected: np.ndarray, *, mode: str,
               coef: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0), threshold: float,
               magnitude: np.ndarray | None = None, cr: str = "loose",
               layout: FormatLayout | None = None) -> CheckPass | None:
    """The numbers a check of one finite pair needs, in one pass; None on a non-finite pair.

    Parameters
    ----------
    actual : numpy.ndarray
        Flat output, any float dtype (8/16-bit formats are read through :func:`decode_table`).
    expected : numpy.ndarray
        Flat, contiguous float64 reference.
    mode : {"abs", "rel", "scale", "op"}
        Element score (:data:`CHECK_MODES`, :func:`_elem`).
    coef : tuple of 5 floats
        The score's coefficients (``rel``: ``(floor, ...)``; ``scale``: ``(atol, rtol,
        unit, add, mult)``; ``op``: ``(A, B, D, ...)``; unused ones 0).
    threshold : float
        Counts ``score_i > threshold``; ``op``: ``|d_i| > threshold * s_i``.
    magnitude : numpy.ndarray, optional
        Flat float64 magnitude of the ``op`` score (default ``|expected|``).
    cr : {"interval", "f32", "f64", "loose"}
        How the correctly rounded flag is computed (:data:`CR_MODES`); the exact modes
        need ``actual`` stored in the target format.
    layout : FormatLayout
        The target format's (:func:`format_layout`); needed by ``cr="interval"`` and
        ``"loose"``.

    Returns
    -------
    CheckPass or None
        None when an element of either array (or their difference) is NaN/Inf.
    """
    a = actual
    e = expected
    k0, k1, k2, k3, k4 = coef
    md = CHECK_MODES[mode]
    use_m = magnitude is not None and md == 3
    lay = _NO_LAYOUT if layout is None else layout
    a, lut, use_lut = _kernel_output(a)  # (an exact ``cr`` needs the target format)
    crm = CR_MODES[cr]
    kern = _KERNELS.get((md, crm, use_lut, use_m)) or _get_kernel(md, crm, use_lut, use_m)
    status, best, arg, n_exc, ok, rmax = kern(a, lut, e, lay.bounds, magnitude if use_m else e, k0, k1, k2, k3, k4,
                                              threshold, lay.loose, lay.lfloor)
    if status:
        return None
    av = float(lut[a[arg]]) if use_lut else float(a[arg])
    return CheckPass(best, arg, av, float(e[arg]), n_exc, ok, rmax)


_NO_LAYOUT = FormatLayout(np.ones(2), 0.0, 0.0)


def _kernel_output(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """How a kernel reads an output: ``(array, lut, use_lut)``, an 8/16-bit float format as
    its bit patterns and their :func:`decode_table`, float32/float64 as they are, any other
    dtype as float64."""
    lut = decode_table(a.dtype)
    if lut is not None:
        return a.view(np.uint8 if a.dtype.itemsize == 1 else np.uint16), lut, True
    if a.dtype != np.float32 and a.dtype != np.float64:
        a = np.asarray(a, dtype=np.float64)
    return a, _NO_LUT, False


# --------------------------------------------------------------------------- numpy's pairwise sums
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pw_sumsq(e: np.ndarray, lo: int, n: int) -> float:
    """``sum(e[lo:lo+n] ** 2)`` in the order of numpy's pairwise summation (bit for bit)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += e[i] * e[i]
        return res
    if n <= 128:
        r0, r1, r2, r3 = e[lo] * e[lo], e[lo + 1] * e[lo + 1], e[lo + 2] * e[lo + 2], e[lo + 3] * e[lo + 3]
        r4, r5, r6, r7 = e[lo + 4] * e[lo + 4], e[lo + 5] * e[lo + 5], e[lo + 6] * e[lo + 6], e[lo + 7] * e[lo + 7]
        i = 8
        top = n - (n % 8)
        while i < top:
            j = lo + i
            r0 += e[j] * e[j]
            r1 += e[j + 1] * e[j + 1]
            r2 += e[j + 2] * e[j + 2]
            r3 += e[j + 3] * e[j + 3]
            r4 += e[j + 4] * e[j + 4]
            r5 += e[j + 5] * e[j + 5]
            r6 += e[j + 6] * e[j + 6]
            r7 += e[j + 7] * e[j + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += e[lo + i] * e[lo + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pw_sumsq(e, lo, n2) + _pw_sumsq(e, lo + n2, n - n2)


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _dv(a: np.ndarray, lut: np.ndarray, e: np.ndarray, i: int, use_lut: bool) -> float:
    """``d_i = actual_i - expected_i`` in float64 (``actual`` decoded by ``lut`` or cast)."""
    if use_lut:
        return lut[np.intp(a[i])] - e[i]  # np.intp: the branch types for a float ``a`` too
    return np.float64(a[i]) - e[i]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _pw_diff(a: np.ndarray, lut: np.ndarray, e: np.ndarray, lo: int, n: int, use_lut: bool) -> tuple[float, float]:
    """``(sum d, sum |d|)`` over ``[lo, lo+n)``, each in numpy's pairwise order (bit for bit)."""
    if n < 8:
        res, rab = 0.0, 0.0
        for i in range(lo, lo + n):
            d = _dv(a, lut, e, i, use_lut)
            res += d
            rab += abs(d)
        return res, rab
    if n <= 128:
        d0, d1, d2, d3 = (_dv(a, lut, e, lo, use_lut), _dv(a, lut, e, lo + 1, use_lut),
                          _dv(a, lut, e, lo + 2, use_lut), _dv(a, lut, e, lo + 3, use_lut))
        d4, d5, d6, d7 = (_dv(a, lut, e, lo + 4, use_lut), _dv(a, lut, e, lo + 5, use_lut),
                          _dv(a, lut, e, lo + 6, use_lut), _dv(a, lut, e, lo + 7, use_lut))
        q0, q1, q2, q3, q4, q5, q6, q7 = abs(d0), abs(d1), abs(d2), abs(d3), abs(d4), abs(d5), abs(d6), abs(d7)
        i = 8
        top = n - (n % 8)
        while i < top:
            j = lo + i
            x0, x1, x2, x3 = (_dv(a, lut, e, j, use_lut), _dv(a, lut, e, j + 1, use_lut),
                              _dv(a, lut, e, j + 2, use_lut), _dv(a, lut, e, j + 3, use_lut))
            x4, x5, x6, x7 = (_dv(a, lut, e, j + 4, use_lut), _dv(a, lut, e, j + 5, use_lut),
                              _dv(a, lut, e, j + 6, use_lut), _dv(a, lut, e, j + 7, use_lut))
            d0 += x0
            d1 += x1
            d2 += x2
            d3 += x3
            d4 += x4
            d5 += x5
            d6 += x6
            d7 += x7
            q0 += abs(x0)
            q1 += abs(x1)
            q2 += abs(x2)
            q3 += abs(x3)
            q4 += abs(x4)
            q5 += abs(x5)
            q6 += abs(x6)
            q7 += abs(x7)
            i += 8
        res = ((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7))
        rab = ((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7))
        while i < n:
            d = _dv(a, lut, e, lo + i, use_lut)
            res += d
            rab += abs(d)
            i += 1
        return res, rab
    n2 = n // 2
    n2 -= n2 % 8
    s1, a1 = _pw_diff(a, lut, e, lo, n2, use_lut)
    s2, a2 = _pw_diff(a, lut, e, lo + n2, n - n2, use_lut)
    return s1 + s2, a1 + a2


def sum_of_squares(expected: np.ndarray) -> float:
    """``numpy.sum(numpy.square(expected))`` of a flat float64 array, bit for bit, without
    the temporary array."""
    return 0.0 + float(_pw_sumsq(expected, 0, expected.size))


def error_sums(actual: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """``(numpy.sum(d), numpy.sum(numpy.abs(d)))`` of ``d = actual - expected`` (float64;
    flat arrays, ``actual`` any float dtype), bit for bit, without the temporary arrays."""
    lut = decode_table(actual.dtype)
    if lut is not None:
        s, sa = _pw_diff(actual.view(np.uint8 if actual.dtype.itemsize == 1 else np.uint16), lut, expected, 0,
                         expected.size, True)
    else:
        a = actual if actual.dtype in (np.float32, np.float64) else np.asarray(actual, dtype=np.float64)
        s, sa = _pw_diff(a, _NO_LUT, expected, 0, expected.size, False)
    return 0.0 + float(s), 0.0 + float(sa)


# --------------------------------------------------------------------------- operator noise
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _op_step(s: float, d: float, b: float, same: bool, sg: float, frac_k: float, mx: float, s2: float, sa: float,
             sz: float, cnt: float, ssz: float, rs2: float, rd: float, rss: float,
             bad: bool) -> tuple[float, float, float, float, float, float, float, float, float, bool, float]:
    """One element of one noise shape of :func:`_op_kernel`: its accumulators, updated, and ``|z|``."""
    dj = d
    bj = b if np.isfinite(b) else 0.0
    if not (np.isfinite(d) and np.isfinite(s)):
        if not same:
            bad = True
        dj = 0.0
        bj = 0.0
        s = 1.0
    z = dj / s
    zb = bj / s
    az = abs(z)
    if az > mx:
        mx = az
    s2 += z * z
    sa += az
    sz += zb
    ssz += sg * zb
    if az > frac_k:
        cnt += 1.0
    rs2 += z * z
    rd += bj
    rss += s * s
    return mx, s2, sa, sz, cnt, ssz, rs2, rd, rss, bad, az


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _op_row(rs2: float, rd: float, rss: float, rowlen: int, rmax: float, rsum: float,
            bmax: float) -> tuple[float, float, float]:
    """The end of a row of :func:`_op_kernel`: its row statistics, updated."""
    ms = rs2 / rowlen
    if ms > rmax:
        rmax = ms
    rsum += np.sqrt(ms)
    num = abs(rd)
    t = 0.0 if num == 0.0 else num / np.sqrt(rss)
    if t > bmax:
        bmax = t
    return rmax, rsum, bmax


_SIGN64 = np.int64(-(2 ** 63))
_EXP_SHIFT = 52


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _round_ref(x: float, p: int, emin: int, maxv: float) -> float:
    """``x`` rounded to nearest even in the output format, as float64; ``x`` itself where
    that is not finite (beyond the range) or ``x`` is not finite.

    ``p`` significand bits (the implicit one included) and ``emin`` the ``frexp`` exponent
    of the smallest normal value, as :func:`tolstat._base.dtypes.round_to_format` rounds
    (gradual underflow); ``p = 0``: float32 (the cast), ``p < 0``: float64 (no rounding).
    In the format's normal range the low ``53 - p`` bits of the float64 pattern are rounded
    to nearest even without a branch (a carry moves into the exponent); below it, ``rint(x / q) * q`` with the
    subnormal spacing ``q`` (exact: powers of two).
    """
    if p < 0 or not np.isfinite(x):
        return x
    if p == 0:
        r = np.float64(np.float32(x))
    else:
        b = _bits(x)
        sign = b & _SIGN64
        ab = b ^ sign
        if (ab >> _EXP_SHIFT) - 1022 >= emin:  # frexp exponent: normal in the format
            sh = 53 - p
            q = np.int64(1) << sh
            # to nearest, ties to even: add half an ULP less one, plus the kept last bit, and cut
            ab = (ab + ((q >> 1) - 1) + ((ab >> sh) & 1)) & ~(q - 1)
            r = _from_bits(ab | sign)
        else:
            qs = math.ldexp(1.0, emin - p)
            r = np.rint(x / qs) * qs
    if abs(r) > maxv:  # beyond the range (inf or NaN in the format): the reference itself
        return x
    return r


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _op_kernel(a: np.ndarray, lut: np.ndarray, use_lut: bool, e: np.ndarray, m: np.ndarray, use_m: bool,
               rp: int, remin: int, rmax: float, A: float, B: float, C: float, D: float, frac_k: float,
               rowlen: int, kq: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Core and row statistics of ``z = d / s`` under the two noise shapes in one pass, and
    what a check of the pair needs.

    ``a``: the output's bit patterns decoded by ``lut`` (``use_lut``), or a float32/float64
    output. ``s0 = (A |e| + B |m|) + D`` and ``s1 = ((A |e| + B |m|) + C |m|) + D``, in
    numpy's order of :func:`tolstat.measure.noise.noise_scale`. Returns
    ``(stats[2, 9], bad[2], info[6])``: per shape max ``|z|``, sum ``z^2``, sum ``|z|``, sum
    ``z``, count ``|z| > k``, max row mean of ``z^2``, sum of row RMS, max row
    ``|sum b| / sqrt(sum s^2)``, sum ``sign(e) b / s``, with ``b = a - RN(e)`` the error
    beyond the correctly rounded reference (:func:`_round_ref` with ``rp, remin, rmax``;
    the bias sums: column 3 is sum ``b / s``); ``bad``: a non-finite mismatch was seen (the
    statistics of that shape are then all ``inf``). Rows are the consecutive runs of
    ``rowlen`` elements; a last, partial row has no row statistics. Sums are sequential,
    element by element (the accumulators are scalars, one set per shape).

    ``info``: the first index of the largest ``|d| / s0`` (the worst element of a check), the
    count of ``|d| > kq s0``, the count of ``b != 0`` (0: correctly rounded), the first
    index of a non-finite ``d`` or ``e`` (-1: none), and, with ``use_m``, the first index
    where ``e`` is finite and ``m`` is not finite and ``>= 0``, and where ``m <
    |e| (1 - 1e-6)`` (-1: none).
    """
    n = e.size
    mx0 = s20 = sa0 = sz0 = cnt0 = ssz0 = rs20 = rd0 = rss0 = 0.0
    mx1 = s21 = sa1 = sz1 = cnt1 = ssz1 = rs21 = rd1 = rss1 = 0.0
    rmax0 = rmax1 = -1.0
    rsum0 = rsum1 = bmax0 = bmax1 = 0.0
    bad0 = bad1 = False
    best = -1.0
    arg = 0
    nexc = 0
    nb = 0
    nonfin = -1
    badm = -1
    lowm = -1
    nrows = n // rowlen
    for row in range(nrows + 1):
        stop = (row + 1) * rowlen if row < nrows else n
        for i in range(row * rowlen, stop):
            av = lut[np.intp(a[i])] if use_lut else np.float64(a[i])
            ev = e[i]
            ae = abs(ev)
            mv = ae
            if use_m:
                mr = m[i]
                mv = abs(mr)
                if np.isfinite(ev):
                    if badm < 0 and not (np.isfinite(mr) and mr >= 0.0):
                        badm = i
                    if lowm < 0 and mr < ae * (1.0 - 1e-6):
                        lowm = i
            base = A * ae + B * mv
            d = av - ev
            b = av - _round_ref(ev, rp, remin, rmax)
            if b != 0.0:
                nb += 1
            same = av == ev or (np.isnan(av) and np.isnan(ev))
            # the sign of e without a branch (a branch on it mispredicts on every other element of
            # mean-zero data: it cost a third of the pass); 0 for 0 and NaN, as before
            sg = np.float64(ev > 0.0) - np.float64(ev < 0.0)
            s0 = base + D
            mx0, s20, sa0, sz0, cnt0, ssz0, rs20, rd0, rss0, bad0, az0 = _op_step(
                s0, d, b, same, sg, frac_k, mx0, s20, sa0, sz0, cnt0, ssz0, rs20, rd0, rss0, bad0)
            mx1, s21, sa1, sz1, cnt1, ssz1, rs21, rd1, rss1, bad1, _ = _op_step(
                (base + C * mv) + D, d, b, same, sg, frac_k, mx1, s21, sa1, sz1, cnt1, ssz1, rs21, rd1, rss1, bad1)
            if np.isfinite(d) and np.isfinite(ev):
                # the worst element's score |d| / s0 is |z| of the first shape (s0 > 0 finite)
                if az0 > best:
                    best = az0
                    arg = i
                if abs(d) > kq * s0:
                    nexc += 1
            elif nonfin < 0:
                nonfin = i
        if row < nrows:
            rmax0, rsum0, bmax0 = _op_row(rs20, rd0, rss0, rowlen, rmax0, rsum0, bmax0)
            rmax1, rsum1, bmax1 = _op_row(rs21, rd1, rss1, rowlen, rmax1, rsum1, bmax1)
            rs20 = rd0 = rss0 = rs21 = rd1 = rss1 = 0.0
    out = np.empty((2, 9))
    out[0, 0], out[0, 1], out[0, 2], out[0, 3], out[0, 4] = mx0, s20, sa0, sz0, cnt0
    out[0, 5], out[0, 6], out[0, 7], out[0, 8] = rmax0, rsum0, bmax0, ssz0
    out[1, 0], out[1, 1], out[1, 2], out[1, 3], out[1, 4] = mx1, s21, sa1, sz1, cnt1
    out[1, 5], out[1, 6], out[1, 7], out[1, 8] = rmax1, rsum1, bmax1, ssz1
    bad = np.zeros(2, dtype=np.bool_)
    bad[0], bad[1] = bad0, bad1
    info = np.empty(6, np.int64)
    info[0], info[1], info[2], info[3], info[4], info[5] = arg, nexc, nb, nonfin, badm, lowm
    return out, bad, info


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _round_ref_select(x: float, p: int, emin: int, maxv: float, qinv: float, qs: float) -> float:
    """:func:`_round_ref` of ``x``, the same float64 bit for bit, with selects instead of
    branches (a loop of it vectorises): every case is computed and the one
    :func:`_round_ref` takes is kept.

    ``qs = 2**(emin - p)`` is the subnormal spacing and ``qinv = 2**(p - emin)`` its
    inverse (1 where ``p <= 0``), both exact powers of two, so ``x * qinv`` is the correctly
    rounded value of the same real number as ``x / qs``: the same float64.
    """
    b = _bits(x)
    sign = b & _SIGN64
    ab = b ^ sign
    sh = 53 - p  # p >= -1: a shift by at most 54
    q = np.int64(1) << sh
    normal = _from_bits(((ab + ((q >> 1) - 1) + ((ab >> sh) & 1)) & ~(q - 1)) | sign)
    sub = np.rint(x * qinv) * qs
    r = normal if (ab >> _EXP_SHIFT) - 1022 >= emin else sub
    r = r if p > 0 else np.float64(np.float32(x))
    return x if (p < 0 or not np.isfinite(x) or abs(r) > maxv) else r


#: ``(shift, scale, special)`` of :func:`_decode16` by output dtype name
_DECODE16 = {"float16": (42, 2.0 ** 1008, 0x7C00), "bfloat16": (45, 2.0 ** 896, 0x7F80)}
#: ``(dec16, shift, scale, special)`` of :func:`_blocked_output` by the output's dtype
_D16_OF: dict[object, tuple[bool, int, float, int]] = {}


#: elements per block of :func:`_op_blocked_kernel` (its buffers, 11 rows of this many
#: float64, stay in the L1 cache)
_CHECK_BLOCK = 256


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _op_block(av: np.ndarray, e: np.ndarray, m: np.ndarray, use_m: bool, buf: np.ndarray, cnt: int, rows: bool,
              full: bool, rp: int, remin: int, rmax: float, qinv: float, qs: float, A: float, B: float, C: float,
              D: float, kq: float, frac_k: float, mchk: int) -> tuple[int, int, int, int, int, int, int]:
    """The element-wise part of :func:`_op_blocked_kernel` on one block of ``cnt`` elements
    (``av``: the output as float64, ``e`` and ``m`` the block's reference and magnitude):
    ``buf`` rows 0-7 get ``|z|``, ``z^2``, ``x`` and ``sign(e) x`` of each noise shape
    (``z = d / s``, ``x = b / s``), with ``rows`` rows 8-10 get ``b``, ``s0^2`` and
    ``s1^2``; returns ``(#b != 0, #|d| > kq s0, #elements to refer, #|z0| > frac_k,
    #|z1| > frac_k, #bad magnitudes, #low magnitudes)``, the last four counted with
    ``full`` only (0 without).

    No reduction but integer counts, so the loop vectorises (the divisions four at a time);
    each value is computed by the operations of :func:`_op_kernel`, in its order. An
    element is referred (to :func:`_op_kernel`) where ``d``, ``e``, ``b`` or a scale is not
    finite or ``d / s0`` is NaN (``0 / 0``: :func:`_op_kernel`'s worst element skips it),
    and, without ``full``, by ``mchk``, where the magnitude is not a finite value ``>= 0``
    (1, 2) or is below ``|e| (1 - 1e-6)`` (2); with ``full`` those two tests are counted
    (:func:`_op_kernel` reports their first index), not referred.
    """
    nb = 0
    nexc = 0
    refer = 0
    nk0 = 0
    nk1 = 0
    nbad = 0
    nlow = 0
    for k in range(cnt):
        ev = e[k]
        ae = abs(ev)
        mv = ae
        mbad = False
        mlow = False
        if use_m:
            mr = m[k]
            mv = abs(mr)
            if full or mchk > 0:
                mbad = not (np.isfinite(mr) and mr >= 0.0)
                mlow = mr < ae * (1.0 - 1e-6)
        base = A * ae + B * mv
        s0 = base + D
        s1 = (base + C * mv) + D
        d = av[k] - ev
        b = av[k] - _round_ref_select(ev, rp, remin, rmax, qinv, qs)
        sg = np.float64(ev > 0.0) - np.float64(ev < 0.0)
        z0 = d / s0
        z1 = d / s1
        x0 = b / s0
        x1 = b / s1
        az0 = abs(z0)
        az1 = abs(z1)
        buf[0, k] = az0
        buf[1, k] = z0 * z0
        buf[2, k] = x0
        buf[3, k] = sg * x0
        buf[4, k] = az1
        buf[5, k] = z1 * z1
        buf[6, k] = x1
        buf[7, k] = sg * x1
        if rows:
            buf[8, k] = b
            buf[9, k] = s0 * s0
            buf[10, k] = s1 * s1
        nb += b != 0.0
        nexc += abs(d) > kq * s0
        fin = (np.isfinite(d) & np.isfinite(ev) & np.isfinite(b) & np.isfinite(s0) & np.isfinite(s1)
               & (z0 == z0))
        if full:
            nk0 += az0 > frac_k
            nk1 += az1 > frac_k
            nbad += mbad
            nlow += mlow
            refer += not fin
        else:
            refer += (not fin) | (mbad & (mchk > 0)) | (mlow & (mchk > 1))
    return nb, nexc, refer, nk0, nk1, nbad, nlow


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _op_blocked_kernel(a: np.ndarray, lut: np.ndarray, use_lut: bool, e: np.ndarray, m: np.ndarray, use_m: bool,
                       rp: int, remin: int, rmax: float, qinv: float, qs: float, A: float, B: float, C: float,
                       D: float, rowlen: int, use_rows: bool, kq: float, mchk: int, dec16: bool, shift: int,
                       scale: float, special: int, full: bool, frac_k: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_op_kernel`'s numbers, bit for bit, in blocks: the element-wise values of a
    block in a vectorised loop (:func:`_op_block`), then its sums and maxima, element by
    element in the order of :func:`_op_kernel` (sequential sums, as recorded); for a pair
    without a non-finite value, scale or ``0 / 0`` (else it refers the pair).

    Arguments as :func:`_op_kernel` (``rowlen`` with ``use_rows``: rows of that length, the
    row statistics; without, none), ``qinv`` and ``qs`` those of :func:`_round_ref_select`,
    ``mchk`` the magnitude tests (:func:`_op_block`, without ``full``); with ``dec16``, ``a``
    holds the bit patterns of a float16 or bfloat16 output, decoded by :func:`_decode16`
    with ``shift, scale, special`` (the same values as ``lut``'s but for a NaN's payload: a
    NaN output is referred anyway).

    Returns ``(stats[2, 9], info[6])``: with ``full`` (the record's pass), every column of
    :func:`_op_kernel`; without (a check's pass), NaN in column 2 (sum ``|z|``) and 4
    (count ``|z| > k``), and in columns 5-7 without ``use_rows``. ``info``: 0 or 1 (an
    element to refer: the pair needs :func:`_op_kernel`, and no other number of the result
    is meaningful), the first index of the largest ``|d| / s0``, the count of ``|d| > kq
    s0``, the count of ``b != 0``, and, with ``full``, :func:`_op_kernel`'s first bad and
    first low magnitude (-1 without, or none).
    """
    n = e.size
    blk = _CHECK_BLOCK
    buf = np.empty((11, blk))
    avb = np.empty(blk)
    mx0 = s20 = sa0 = sz0 = ssz0 = rs20 = rd0 = rss0 = 0.0
    mx1 = s21 = sa1 = sz1 = ssz1 = rs21 = rss1 = 0.0
    rmax0 = rmax1 = -1.0
    rsum0 = rsum1 = bmax0 = bmax1 = 0.0
    arg = 0
    nexc = 0
    nb = 0
    nk0 = 0
    nk1 = 0
    badm = -1
    lowm = -1
    info = np.zeros(6, np.int64)
    nrows = n // rowlen if use_rows else 0
    row = 0
    row_end = rowlen if nrows > 0 else n + 1  # past the last full row: never reached
    lo = 0
    while lo < n:
        hi = min(lo + blk, n)
        cnt = hi - lo
        ab = a[lo:hi]
        eb = e[lo:hi]
        mb = m[lo:hi]
        if dec16:  # the decoding apart: table loads would keep the block's loop from vectorising
            for k in range(cnt):
                avb[k] = _decode16(ab[k], shift, scale, special)
        elif use_lut:
            for k in range(cnt):
                avb[k] = lut[np.intp(ab[k])]
        else:
            for k in range(cnt):
                avb[k] = np.float64(ab[k])
        # one call per combination of the flags: each loop compiled without their branches
        if full:
            c = _op_block(avb, eb, mb, use_m, buf, cnt, True, True, rp, remin, rmax, qinv, qs, A, B, C, D, kq,
                          frac_k, 0)
        elif use_rows:
            c = _op_block(avb, eb, mb, use_m, buf, cnt, True, False, rp, remin, rmax, qinv, qs, A, B, C, D, kq,
                          frac_k, mchk)
        else:
            c = _op_block(avb, eb, mb, use_m, buf, cnt, False, False, rp, remin, rmax, qinv, qs, A, B, C, D, kq,
                          frac_k, mchk)
        c_nb, c_exc, refer, c_k0, c_k1, c_bad, c_low = c
        if refer:
            info[0] = 1
            info[4] = info[5] = -1
            return np.full((2, 9), np.nan), info
        nb += c_nb
        nexc += c_exc
        nk0 += c_k0
        nk1 += c_k1
        if (c_bad > 0 and badm < 0) or (c_low > 0 and lowm < 0):  # their first index, as _op_kernel
            for k in range(cnt):
                mr = mb[k]
                if badm < 0 and not (np.isfinite(mr) and mr >= 0.0):
                    badm = lo + k
                if lowm < 0 and mr < abs(eb[k]) * (1.0 - 1e-6):
                    lowm = lo + k
        if not use_rows:
            for k in range(cnt):
                az = buf[0, k]
                if az > mx0:  # the first largest: the worst element
                    mx0 = az
                    arg = lo + k
                s20 += buf[1, k]
                sz0 += buf[2, k]
                ssz0 += buf[3, k]
                az = buf[4, k]
                if az > mx1:
                    mx1 = az
                s21 += buf[5, k]
                sz1 += buf[6, k]
                ssz1 += buf[7, k]
        else:
            i = lo
            while i < hi:
                stop = hi if hi < row_end else row_end
                for k in range(i - lo, stop - lo):
                    az = buf[0, k]
                    if az > mx0:
                        mx0 = az
                        arg = lo + k
                    if full:
                        sa0 += az
                    s20 += buf[1, k]
                    sz0 += buf[2, k]
                    ssz0 += buf[3, k]
                    rs20 += buf[1, k]
                    rd0 += buf[8, k]  # the row's sum of b: the same for both shapes
                    rss0 += buf[9, k]
                    az = buf[4, k]
                    if az > mx1:
                        mx1 = az
                    if full:
                        sa1 += az
                    s21 += buf[5, k]
                    sz1 += buf[6, k]
                    ssz1 += buf[7, k]
                    rs21 += buf[5, k]
                    rss1 += buf[10, k]
                i = stop
                if i == row_end:
                    rmax0, rsum0, bmax0 = _op_row(rs20, rd0, rss0, rowlen, rmax0, rsum0, bmax0)
                    rmax1, rsum1, bmax1 = _op_row(rs21, rd0, rss1, rowlen, rmax1, rsum1, bmax1)
                    rs20 = rd0 = rss0 = rs21 = rss1 = 0.0
                    row += 1
                    row_end = (row + 1) * rowlen if row < nrows else n + 1
        lo = hi
    out = np.full((2, 9), np.nan)
    out[0, 0], out[0, 1], out[0, 3], out[0, 8] = mx0, s20, sz0, ssz0
    out[1, 0], out[1, 1], out[1, 3], out[1, 8] = mx1, s21, sz1, ssz1
    if use_rows:
        out[0, 5], out[0, 6], out[0, 7] = rmax0, rsum0, bmax0
        out[1, 5], out[1, 6], out[1, 7] = rmax1, rsum1, bmax1
    if full:
        out[0, 2], out[0, 4] = sa0, np.float64(nk0)
        out[1, 2], out[1, 4] = sa1, np.float64(nk1)
    info[1], info[2], info[3], info[4], info[5] = arg, nexc, nb, badm, lowm
    return out, info


#: ``(p, emin, max)`` of :func:`_round_ref` per output format
_ROUND: dict[str, tuple[int, int, float]] = {}


def round_params(dtype: object) -> tuple[int, int, float]:
    """The rounding parameters of :func:`_round_ref` for a target dtype (any spelling)."""
    td = target_dtype(dtype)
    got = _ROUND.get(td.name)
    if got is None:
        if td.name == "float64":
            got = (-1, 0, float(np.finfo(np.float64).max))
        elif td.name == "float32":
            got = (0, 0, float(np.finfo(np.float32).max))
        else:
            fi = finfo(td.np_dtype)
            got = (int(fi.nmant) + 1, int(np.log2(td.tiny)) + 1, float(td.max))
        _ROUND[td.name] = got
    return got


_NO_REFERRAL = np.zeros(2, dtype=np.bool_)


class OpPass(NamedTuple):
    """Result of :func:`op_statistics`.

    Attributes
    ----------
    stats : numpy.ndarray
        ``(2, 9)``: the sums and maxima of :func:`_op_kernel` per noise shape.
    bad : numpy.ndarray
        ``(2,)`` bool: a non-finite mismatch under that shape.
    worst : int
        Flat index of the first largest ``|d| / s0`` over finite elements.
    n_exceeding : int
        Elements with ``|d| > kq s0``.
    n_rounding_off : int
        Elements whose output differs from the correctly rounded reference (0: the output
        is correctly rounded, where it is stored in the output format).
    nonfinite : int
        First flat index of a non-finite difference or reference, -1 if none.
    bad_magnitude, low_magnitude : int
        With a magnitude: the first flat index where the reference is finite and the
        magnitude is not a finite value ``>= 0``, and where it is below ``|expected| (1 - 1e-6)``;
        -1 if none.
    """

    stats: np.ndarray
    bad: np.ndarray
    worst: int
    n_exceeding: int
    n_rounding_off: int
    nonfinite: int
    bad_magnitude: int
    low_magnitude: int


def op_statistics(actual: np.ndarray, expected: np.ndarray, magnitude: np.ndarray | None, *,
                  coef: tuple[float, float, float, float], frac_k: float, rowlen: int | None, dtype: object,
                  kq: float = np.inf) -> OpPass:
    """:func:`_op_kernel` on flat views; ``coef = (A, B, C, D)``; ``rowlen`` None: no row statistics.

    ``actual`` (any float dtype; 8/16-bit formats are read through :func:`decode_table`),
    ``expected`` (float64) and ``magnitude`` (float64, not yet made absolute) have one shape
    with rows along the last axis; ``dtype`` is the output format whose rounding of the
    reference the bias sums use; ``kq`` the threshold of the exceedance count.

    A pair without a non-finite value or scale takes :func:`_op_blocked_kernel` (``full``:
    every number of :func:`_op_kernel`, bit for bit, its element-wise part vectorised); one
    it refers, :func:`_op_kernel`.
    """
    a = np.ravel(actual)
    e = np.ravel(expected)
    m = e if magnitude is None else np.ravel(magnitude)
    a, lut, use_lut, dec16, shift, scale, special = _blocked_output(a)
    rp, remin, rmax = round_params(dtype)
    rl = int(rowlen) if rowlen else max(1, e.size)
    A, B, C, D = (float(c) for c in coef)
    use_m = magnitude is not None
    qs = math.ldexp(1.0, remin - rp) if rp > 0 else 1.0
    st, info = _op_blocked_kernel(a, lut, use_lut, e, m, use_m, rp, remin, rmax, 1.0 / qs, qs, A, B, C, D, rl,
                                  True, float(kq), 0, dec16, shift, scale, special, True, float(frac_k))
    if not info[0]:
        return OpPass(st, _NO_REFERRAL.copy(), int(info[1]), int(info[2]), int(info[3]), -1, int(info[4]),
                      int(info[5]))
    st, bad, info = _op_kernel(a, lut, use_lut, e, m, use_m, rp, remin, rmax, A, B, C, D, float(frac_k), rl,
                               float(kq))
    return OpPass(st, bad, int(info[0]), int(info[1]), int(info[2]), int(info[3]), int(info[4]), int(info[5]))


def _blocked_output(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, bool, int, float, int]:
    """How :func:`_op_blocked_kernel` reads an output: :func:`_kernel_output`'s ``(array,
    lut, use_lut)`` (what :func:`_op_kernel` reads) and ``(dec16, shift, scale, special)``: a
    float16 or bfloat16 output is decoded from its bits by :func:`_decode16`, not the table."""
    d16 = decode16_params(a.dtype)
    a, lut, use_lut = _kernel_output(a)
    return a, lut, use_lut, *d16


def decode16_params(dtype: np.dtype) -> tuple[bool, int, float, int]:
    """``(dec16, shift, scale, special)`` of :func:`_decode16` for an output of ``dtype``:
    ``dec16`` True for float16 and bfloat16 (read as their bit patterns), ``(False, 0,
    1.0, 0)`` otherwise."""
    d16 = _D16_OF.get(dtype)
    if d16 is None:  # ``dtype.name`` costs microseconds per call: once per dtype
        got = _DECODE16.get(dtype.name)
        d16 = _D16_OF[dtype] = (False, 0, 1.0, 0) if got is None else (True, *got)
    return d16


#: the columns of :attr:`OpPass.stats` :func:`op_check_statistics` computes: the statistics of
#: :data:`tolstat.measure.noise.SCORE_CORE` (max, sum ``z^2``, sum ``x``, row statistics, sum
#: ``sign(e) x``); the mean ``|z|`` and the count ``|z| > k`` (columns 2 and 4) are NaN
OP_CHECK_COLUMNS = (0, 1, 3, 5, 6, 7, 8)


def op_check_statistics(actual: np.ndarray, expected: np.ndarray, magnitude: np.ndarray | None, *,
                        coef: tuple[float, float, float, float], rowlen: int | None, dtype: object, kq: float,
                        magnitude_checks: int = 0) -> OpPass | None:
    """:func:`op_statistics` for a check: the same numbers, bit for bit, but the
    statistics no combined score holds (NaN, see :data:`OP_CHECK_COLUMNS`), in blocks whose
    element-wise part vectorises (:func:`_op_blocked_kernel`); None where the pair needs
    :func:`op_statistics` (a non-finite difference, reference or scale, or a magnitude
    :func:`op_statistics` reports).

    Parameters
    ----------
    actual, expected, magnitude, coef, rowlen, dtype, kq
        As in :func:`op_statistics` (``frac_k`` does not enter).
    magnitude_checks : {0, 1, 2}
        The magnitude's tests a result must pass (else None): 0 none, 1 a finite value
        ``>= 0`` wherever the reference is finite (``OpPass.bad_magnitude``), 2 also
        ``>= |expected| (1 - 1e-6)`` (``OpPass.low_magnitude``).

    Returns
    -------
    OpPass or None
        ``nonfinite``, ``bad_magnitude`` and ``low_magnitude`` are -1 and ``bad`` False.
    """
    a = np.ravel(actual)
    e = np.ravel(expected)
    m = e if magnitude is None else np.ravel(magnitude)
    a, lut, use_lut, dec16, shift, scale, special = _blocked_output(a)
    rp, remin, rmax = round_params(dtype)
    qs = math.ldexp(1.0, remin - rp) if rp > 0 else 1.0
    A, B, C, D = (float(c) for c in coef)
    rl = int(rowlen) if rowlen else max(1, e.size)
    st, info = _op_blocked_kernel(a, lut, use_lut, e, m, magnitude is not None, rp, remin, rmax, 1.0 / qs, qs,
                                  A, B, C, D, rl, bool(rowlen), float(kq), int(magnitude_checks), dec16,
                                  shift, scale, special, False, 1.0)
    if info[0]:
        return None
    return OpPass(st, _NO_REFERRAL.copy(), int(info[1]), int(info[2]), int(info[3]), -1, -1, -1)
