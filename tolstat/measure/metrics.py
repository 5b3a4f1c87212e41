"""Element-wise error metrics of a kernel output against its float64 reference.

This is the first step of tolstat's data flow (kernel outputs -> **metrics** -> error
dataset -> fitted models -> tolerance table -> checks). It imports nothing else of
tolstat but the dtype table.

Definitions (also in ``docs/schema.md``):

* signed error ``d = actual - expected`` in float64 (``actual`` upcast exactly);
* absolute error ``|d|``;
* relative error ``|d| / max(|expected|, rel_floor)``, with ``rel_floor`` by default the
  smallest positive normal number of the target dtype;
* ULP distance in the *target* dtype: ``expected`` rounded to the target (round to
  nearest even; a reference beyond the format's range is at infinite distance), mapped to the ordered integer
  line (``-0 == +0``), distance = absolute difference of the two integers — the logic of
  ``numpy.testing``'s ``nulp_diff``, computed by numba for every supported width.

A NaN or Inf in ``actual`` where ``expected`` is finite is an *infinite* error: it is
counted (``n_nonfinite``) and reported, never dropped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numba
import numpy as np

from tolstat._base.dtypes import TargetDtype, finfo, round_to_format, target_dtype
from tolstat._base.validate import float_array
from tolstat._base import numba_cache as _numba_cache

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

__all__ = [
    "metric_covariates","ErrorMetrics", "error_metrics", "ulp_distance", "as_array", "ordered_int"]


# ---------------------------------------------------------------------------
# array conversion
# ---------------------------------------------------------------------------
def as_array(x: Any, *, name: str = "array") -> np.ndarray:
    """Convert a kernel output or reference to a numpy array without copying if possible.

    Accepts numpy arrays, torch tensors (any device; moved to CPU, bfloat16 kept exact
    as ``ml_dtypes.bfloat16``), objects with ``__dlpack__`` or ``__array__``, and
    Python scalars/sequences.

    Raises
    ------
    TypeError
        If the input cannot be converted to an array.
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _torch_to_numpy(x)
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__array__"):
        return np.asarray(x)
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except Exception as exc:  # numpy refuses bfloat16/float8 DLPack dtypes
            from tolstat.measure.dlpack import from_dlpack_lowp

            try:
                return from_dlpack_lowp(x, name=name)
            except TypeError as low:
                raise TypeError(f"{name}: cannot import {type(x).__name__} via DLPack: {exc}; "
                                f"{low}") from exc
    try:
        return np.asarray(x)
    except Exception as exc:
        raise TypeError(f"{name}: cannot convert {type(x).__name__} to an array") from exc


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch  # noqa: PLC0415 - optional dependency, only reached with a torch input

    import ml_dtypes

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    special = {
        getattr(torch, "float8_e4m3fn", None): ml_dtypes.float8_e4m3fn,
        getattr(torch, "float8_e5m2", None): ml_dtypes.float8_e5m2,
    }
    if t.dtype in special and t.dtype is not None:
        return t.contiguous().view(torch.uint8).numpy().view(special[t.dtype])
    return t.numpy()


def _to_float64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


# ---------------------------------------------------------------------------
# ULP distance (numba kernel on the ordered integer representation)
# ---------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def _ulp_kernel(a_bits: np.ndarray, e_bits: np.ndarray, nbits: int, out: np.ndarray) -> None:
    """Distance on the ordered integer line between two arrays of bit patterns (uint64)."""
    sign_shift = np.uint64(nbits - 1)
    mag_mask = (np.uint64(1) << sign_shift) - np.uint64(1)
    for i in range(a_bits.size):
        a = a_bits[i]
        e = e_bits[i]
        sa = a >> sign_shift
        se = e >> sign_shift
        ma = a & mag_mask
        me = e & mag_mask
        if sa == se:
            d = ma - me if ma >= me else me - ma
        else:
            d = ma + me  # across zero: both magnitudes; -0 and +0 both have magnitude 0
        out[i] = np.float64(d)


@numba.njit(cache=True, nogil=True)
def _ordered_kernel(bits: np.ndarray, nbits: int, out: np.ndarray) -> None:
    sign_shift = np.uint64(nbits - 1)
    mag_mask = (np.uint64(1) << sign_shift) - np.uint64(1)
    for i in range(bits.size):
        b = bits[i]
        m = np.int64(b & mag_mask)
        out[i] = -m if (b >> sign_shift) else m


def _bits(x: np.ndarray, td: TargetDtype) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=td.np_dtype).view(td.uint_dtype).astype(np.uint64).ravel()


def ordered_int(x: Any, dtype: Any) -> np.ndarray:
    """Map values of a target dtype to the ordered integer line (``-0 == +0``).

    Consecutive representable values map to consecutive integers; used for ULP
    arithmetic. NaN payloads map to meaningless integers: mask them first.
    """
    td = target_dtype(dtype)
    arr = np.asarray(as_array(x))
    out = np.empty(arr.size, dtype=np.int64)
    _ordered_kernel(_bits(arr, td), td.bits, out)
    return out.reshape(arr.shape)


def ulp_distance(actual: Any, expected: Any, dtype: Any) -> np.ndarray:
    """ULP distance between ``actual`` and ``expected`` counted in ``dtype``.

    Parameters
    ----------
    actual : array_like
        Kernel output (any float dtype; rounded to ``dtype`` if not already in it).
    expected : array_like
        Reference (float64 or the target dtype); rounded to ``dtype`` with round to
        nearest even. A finite reference that overflows the format (rounds beyond its
        largest finite value) is at distance ``inf`` from every output.
    dtype : str or dtype
        The target dtype in which steps are counted.

    Returns
    -------
    numpy.ndarray of float64
        Number of representable values of ``dtype`` between the two; ``inf`` where
        exactly one side is non-finite or the infinities differ in sign, ``0`` where both
        are NaN or the same infinity.
    """
    td = target_dtype(dtype)
    a = as_array(actual, name="actual")
    e = as_array(expected, name="expected")
    float_array("actual", a)
    float_array("expected", e)
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: actual {a.shape} vs expected {e.shape}")
    if td.name in _FUSED_ULP and a.dtype == td.np_dtype and e.dtype == np.float64:
        return _ulp_fused(a, e, td)
    return _ulp_general(a, e, td)


#: 16-bit formats whose ULP distance to a float64 reference is one numba pass
_FUSED_ULP = ("float16", "bfloat16")


def _ulp_fused(a: np.ndarray, e: np.ndarray, td: TargetDtype) -> np.ndarray:
    """:func:`_ulp_general` for a 16-bit ``actual`` in ``td`` and a float64 ``expected``:
    the same rounding (to nearest even, after clamping to +-max), overflow rule and
    non-finite rule, element by element in one pass (tested equal)."""
    p, emin, vmax, edge, odd = _ulp16_constants(td.name)
    out = np.empty(a.size, dtype=np.float64)
    _ulp16_kernel(np.ascontiguousarray(a).view(np.uint16).ravel(), np.ascontiguousarray(e).ravel(), p, emin,
                  vmax, edge, odd, out)
    return out.reshape(a.shape)


@functools.lru_cache(maxsize=None)
def _ulp16_constants(name: str) -> tuple[int, int, float, float, bool]:
    """The constants :func:`_ulp16_kernel` takes for the 16-bit format ``name`` (computed
    once per format): precision, smallest normal exponent, largest finite value, the
    overflow edge (largest finite value plus half an ULP) and whether its significand is odd."""
    td = target_dtype(name)
    fi = finfo(td.np_dtype)
    p = int(fi.nmant) + 1
    emin = int(np.log2(td.tiny)) + 1
    _, ex = np.frexp(np.float64(td.max))
    edge = td.max + float(np.ldexp(1.0, int(ex) - p - 1))
    odd = bool(int(np.array(td.max, dtype=td.np_dtype).view(td.uint_dtype)) & 1)
    return p, emin, float(td.max), edge, odd


@numba.njit(cache=True, nogil=True)
def _ulp16_kernel(a_bits, e64, p, emin, vmax, edge, odd, out):  # pragma: no cover - numba
    e_bits = e64.view(np.int64)
    vmax_bits = np.array([vmax]).view(np.int64)[0]
    inf_bits = ((1 << (15 - (p - 1))) - 1) << (p - 1)  # exponent field all ones
    for i in range(a_bits.size):
        a = np.int64(a_bits[i])
        ev = e64[i]
        am = a & 0x7FFF
        a_nonfinite = am >= inf_bits
        if a_nonfinite or not np.isfinite(ev):  # both NaN, or the same infinity: 0; else inf
            a_nan = am > inf_bits
            same_inf = a_nonfinite and not a_nan and np.isinf(ev) and ((a >> 15) == 1) == (ev < 0)
            out[i] = 0.0 if (a_nan and ev != ev) or same_inf else np.inf
            continue
        mag = abs(ev)
        if mag > edge or (mag == edge and odd):  # the reference overflows the format
            out[i] = np.inf
            continue
        # c = min(|e|, max) as float64 bits
        cb = vmax_bits if mag > vmax else e_bits[i] & 0x7FFFFFFFFFFFFFFF
        # round to nearest even with gradual underflow (as round_to_format), on the bits:
        # the index on the format's integer line is c / spacing, rounded, plus the
        # exponent's offset (normal values)
        e_field = cb >> 52
        if e_field == 0:  # float64 subnormal (or zero): far below the format's smallest step
            me = 0
        else:
            ue = e_field - 1023
            m53 = (cb & 0xFFFFFFFFFFFFF) | (1 << 52)
            emin_t = emin - 1  # unbiased exponent of the smallest normal
            shift = 52 - (p - 1) + (emin_t - ue if ue < emin_t else 0)
            if shift > 54:
                me = 0
            else:
                q = m53 >> shift
                rem = m53 & ((1 << shift) - 1)
                half = 1 << (shift - 1)
                if rem > half or (rem == half and (q & 1) == 1):
                    q += 1
                me = q + ((ue - emin_t) << (p - 1) if ue >= emin_t else 0)
        sa = a >> 15
        se = 1 if np.signbit(ev) else 0
        if sa == se:
            d = am - me if am >= me else me - am
        else:
            d = am + me
        out[i] = np.float64(d)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _metrics_kernel(a64, e64, rel_floor, signed, abs_err, rel, ref_abs, nonfinite, maxima):  # pragma: no cover - numba
    """Element-wise errors, as the numpy definition: ``signed = a - e``; ``abs = |signed|``
    with the non-finite rule (:func:`_apply_nonfinite`: 0 for both NaN or the same
    infinity, else inf and ``nonfinite``); ``ref_abs = |e|``; ``rel = abs /
    np.maximum(ref_abs, rel_floor)``, 0 where ``abs == 0`` and inf where non-finite.

    Returns the number of NaNs in ``e``, of non-finite errors and of finite ``ref_abs``;
    ``maxima`` gets ``abs.max()``, ``rel.max()`` (NaN-propagating, as numpy's) and the
    largest finite ``ref_abs`` (-inf if none)."""
    n_nan = 0
    n_bad = 0
    n_ref_finite = 0
    max_abs = -np.inf
    max_rel = -np.inf
    max_ref = -np.inf
    for i in range(a64.size):
        av = a64[i]
        ev = e64[i]
        s = av - ev
        signed[i] = s
        ad = abs(s)
        ra = abs(ev)
        ref_abs[i] = ra
        bad = False
        if ev != ev:
            n_nan += 1
        if not (np.isfinite(av) and np.isfinite(ev)):
            both_nan = av != av and ev != ev
            same_inf = np.isinf(av) and np.isinf(ev) and np.sign(av) == np.sign(ev)
            if both_nan or same_inf:
                ad = 0.0
            else:
                ad = np.inf
                bad = True
        abs_err[i] = ad
        nonfinite[i] = bad
        denom = ra if (ra != ra or ra >= rel_floor) else rel_floor  # np.maximum: NaN wins
        r = 0.0 if ad == 0.0 else ad / denom
        r = np.inf if bad else r
        rel[i] = r
        if bad:
            n_bad += 1
        if ad > max_abs or ad != ad:  # once NaN, the maximum stays NaN (numpy's max)
            max_abs = ad
        if r > max_rel or r != r:
            max_rel = r
        if np.isfinite(ra):
            n_ref_finite += 1
            if ra > max_ref:
                max_ref = ra
    maxima[0] = max_abs
    maxima[1] = max_rel
    maxima[2] = max_ref
    return n_nan, n_bad, n_ref_finite


def _ulp_general(a: np.ndarray, e: np.ndarray, td: TargetDtype) -> np.ndarray:
    """ULP distance, any float dtypes (see :func:`ulp_distance`)."""
    a64 = _to_float64(a)
    e64 = _to_float64(e)
    with np.errstate(over="ignore", invalid="ignore"):
        at = a64.astype(td.np_dtype) if a.dtype != td.np_dtype else a
    et = round_to_format(e64, td.name, overflow="clamp")
    out = np.empty(a64.size, dtype=np.float64)
    _ulp_kernel(_bits(at, td), _bits(et, td), td.bits, out)
    out = out.reshape(a64.shape)
    # a finite reference that rounds beyond the largest finite value of the format
    # overflows: no finite output is within any number of ULPs of it (a saturated
    # 65504 for an expected 1e6 in float16 is not 0 ULP)
    out[_overflows(e64, td)] = np.inf
    _apply_nonfinite(out, a64, e64)
    return out


def _overflows(e64: np.ndarray, td: TargetDtype) -> np.ndarray:
    """Finite float64 values that round (nearest even) beyond ``td``'s largest finite value.

    IEEE 754: the value is rounded as if the exponent range were unbounded; it overflows
    when that result exceeds the largest finite value ``max``. The boundary is
    ``max + ulp(max)/2``; a value exactly on it rounds to even, which is past ``max``
    when ``max`` has an odd significand (all IEEE formats) and to ``max`` otherwise
    (float8_e4m3fn, whose all-ones significand is NaN).
    """
    if td.name == "float64":
        return np.zeros(e64.shape, dtype=bool)
    fi = finfo(td.np_dtype)
    p = int(fi.nmant) + 1
    _, ex = np.frexp(np.float64(td.max))
    half_ulp = float(np.ldexp(1.0, int(ex) - p - 1))
    odd = bool(int(np.array(td.max, dtype=td.np_dtype).view(td.uint_dtype)) & 1)
    edge = td.max + half_ulp
    with np.errstate(invalid="ignore"):
        mag = np.abs(e64)
        return np.isfinite(e64) & ((mag > edge) | ((mag == edge) & odd))


def _apply_nonfinite(out: np.ndarray, a64: np.ndarray, e64: np.ndarray) -> np.ndarray:
    """Set the error of non-finite pairs: 0 if both NaN or same infinity, else inf.

    Returns the mask of elements with an infinite error from non-finite values.
    """
    a_fin = np.isfinite(a64)
    e_fin = np.isfinite(e64)
    if a_fin.all() and e_fin.all():
        return np.zeros(a64.shape, dtype=bool)
    both_nan = np.isnan(a64) & np.isnan(e64)
    same_inf = np.isinf(a64) & np.isinf(e64) & (np.sign(a64) == np.sign(e64))
    match = both_nan | same_inf
    bad = ~(a_fin & e_fin) & ~match
    out[match] = 0.0
    out[bad] = np.inf
    return bad


# ---------------------------------------------------------------------------
# all metrics
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ErrorMetrics:
    """Element-wise errors of one kernel output (all arrays flat, float64).

    Attributes
    ----------
    dtype : str
        Canonical target dtype.
    shape : tuple of int
        Shape of the compared arrays.
    abs : numpy.ndarray
        ``|actual - expected|``; ``inf`` for non-finite mismatches.
    signed : numpy.ndarray
        ``actual - expected``; NaN where that is undefined (NaN actual).
    rel : numpy.ndarray
        ``abs / max(|expected|, rel_floor)``.
    ulp : numpy.ndarray
        ULP distance in the target dtype.
    ref_abs : numpy.ndarray
        ``|expected|`` (NaN where the reference is NaN and ``allow_nan`` was set).
    nonfinite : numpy.ndarray of bool
        Elements whose error is infinite because of a NaN/Inf.
    rel_floor : float
        Floor used for the relative error.
    """

    dtype: str
    shape: tuple[int, ...]
    abs: np.ndarray
    signed: np.ndarray
    rel: np.ndarray
    ulp: np.ndarray
    ref_abs: np.ndarray
    nonfinite: np.ndarray
    rel_floor: float
    #: run-level values found in the pass that made the arrays (:func:`error_metrics`):
    #: ``n_nonfinite``, ``max_abs``, ``max_rel``, the largest finite ``ref_abs`` and how many
    #: are finite; None (metrics built otherwise): computed from the arrays
    scalars: Mapping[str, float] | None = field(default=None, repr=False, compare=False)

    @property
    def n_elements(self) -> int:
        """Number of compared elements."""
        return int(self.abs.size)

    @property
    def n_nonfinite(self) -> int:
        """Number of elements with an infinite error from NaN/Inf values."""
        if self.scalars is not None:
            return int(self.scalars["n_nonfinite"])
        return int(self.nonfinite.sum())


def error_metrics(
    actual: Any,
    expected: Any,
    *,
    dtype: Any = None,
    rel_floor: float | None = None,
    allow_nan: bool = False,
) -> ErrorMetrics:
    """Compute element-wise absolute, signed, relative and ULP error.

    Parameters
    ----------
    actual : array_like
        Kernel output, in its low-precision dtype or already upcast. numpy arrays, torch
        tensors and anything with ``__array__`` / ``__dlpack__`` are accepted.
    expected : array_like
        High-precision (float64) reference of the same shape.
    dtype : str or dtype, optional
        Target dtype in which ULPs are counted. Defaults to ``actual``'s dtype, which
        must then be a supported float format.
    rel_floor : float, optional
        Floor of ``|expected|`` in the relative error. Default: smallest positive
        normal number of the target dtype.
    allow_nan : bool, default False
        If False, a NaN in ``expected`` raises (the reference is broken). If True,
        matching NaNs are zero error and a NaN against a number is an infinite error.

    Returns
    -------
    ErrorMetrics

    Raises
    ------
    TypeError
        Integer, bool or complex arrays; unconvertible inputs.
    ValueError
        Shape mismatch, empty arrays, unknown dtype, NaN in ``expected`` (unless
        ``allow_nan``), negative or non-finite ``rel_floor``.

    Examples
    --------
    >>> import numpy as np
    >>> m = error_metrics(np.float16([1.0, 2.0]), np.array([1.0, 2.001953125]))
    >>> m.ulp.tolist()
    [0.0, 1.0]
    """
    return metrics_with_ulp(actual, expected, dtype=dtype, rel_floor=rel_floor, allow_nan=allow_nan)


def metrics_with_ulp(actual: Any, expected: Any, *, dtype: Any = None, rel_floor: float | None = None,
                     allow_nan: bool = False, ulp: Callable[[], np.ndarray] | None = None) -> ErrorMetrics:
    """:func:`error_metrics`, whose ULP distances ``ulp()`` returns when given: the values
    of :func:`ulp_distance` of the same pair in the same target dtype, computed elsewhere
    (a collection computes them on a second core while this computes the rest); called
    after the pair has been validated."""
    a = as_array(actual, name="actual")
    e = as_array(expected, name="expected")
    float_array("actual", a)
    float_array("expected", e)
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: actual {a.shape} vs expected {e.shape}")
    if a.size == 0:
        raise ValueError("empty arrays: nothing to compare")
    td = target_dtype(a.dtype if dtype is None else dtype)
    if rel_floor is None:
        rel_floor = td.tiny
    if not np.isfinite(rel_floor) or rel_floor < 0:
        raise ValueError(f"rel_floor must be finite and >= 0, got {rel_floor}")

    a64 = np.ascontiguousarray(_to_float64(a)).ravel()
    e64 = np.ascontiguousarray(_to_float64(e)).ravel()
    n = a64.size
    signed, abs_err, rel, ref_abs = (np.empty(n) for _ in range(4))
    nonfinite = np.empty(n, dtype=bool)
    maxima = np.empty(3)
    # one pass (numba): the numpy definitions below, element by element
    n_nan_ref, n_bad, n_ref_finite = _metrics_kernel(a64, e64, float(rel_floor), signed, abs_err, rel, ref_abs,
                                                     nonfinite, maxima)
    if n_nan_ref and not allow_nan:
        first = int(np.flatnonzero(np.isnan(e64))[0])
        idx = np.unravel_index(first, e.shape) if e.ndim else ()
        raise ValueError(
            f"reference (expected) contains {n_nan_ref} NaN value(s), first at "
            f"index {tuple(int(i) for i in idx)}: the reference is broken; pass "
            "allow_nan=True to treat matching NaNs as equal"
        )
    ulp_values = ulp_distance(a.ravel(), e64, td) if ulp is None else ulp().reshape(-1)
    return ErrorMetrics(
        dtype=td.name,
        shape=tuple(int(s) for s in a.shape),
        abs=abs_err,
        signed=signed,
        rel=rel,
        ulp=ulp_values,
        ref_abs=ref_abs,
        nonfinite=nonfinite,
        rel_floor=float(rel_floor),
        scalars={"n_nonfinite": n_bad, "max_abs": float(maxima[0]), "max_rel": float(maxima[1]),
                 "ref_max_finite": float(maxima[2]), "n_ref_finite": n_ref_finite},
    )


def metric_covariates(m: ErrorMetrics, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The built-in run covariates of one output/reference pair, updated by ``extra``.

    ``n_elements``, ``ref_max_abs = max |ref|`` and ``ref_rms = sqrt(mean(ref**2))``
    over the finite reference values: the same definitions as the error dataset's run
    variables (:func:`tolstat.dataset.records.summarize_run`).
    """
    ref = m.ref_abs
    if m.scalars is not None:  # the pass that made the metrics counted the finite values
        ref_max = m.scalars["ref_max_finite"]
        if m.scalars["n_ref_finite"] < ref.size:
            ref = ref[np.isfinite(ref)]
    else:
        ref_max = ref.max() if ref.size else 0.0
        if not np.isfinite(ref_max):  # (a NaN max: some NaN) copy only then
            ref = ref[np.isfinite(ref)]
            ref_max = ref.max() if ref.size else 0.0
    cov: dict[str, Any] = {
        "n_elements": float(m.n_elements),
        "ref_max_abs": float(ref_max) if ref.size else 0.0,
        "ref_rms": float(np.sqrt(np.mean(np.square(ref)))) if ref.size else 0.0,
    }
    cov.update({str(k): v for k, v in (extra or {}).items()})
    return cov
