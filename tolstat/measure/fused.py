"""One-pass reductions of a kernel output against its reference (the fast check path).

:func:`tolstat.error_metrics` materialises every element-wise error (absolute, signed,
relative, ULP) as float64 arrays; a check needs only a few numbers of them: the maximum
of one element score, where it is, how many elements exceed the threshold and the sums
of the bias statistic. :func:`fused_max` computes those in one numba pass over the two
arrays, reading a low-precision output through a lookup table of its bit patterns (the
exact float64 value of every 8/16-bit code), so no float64 copy of the output is made.

The definitions are those of :mod:`tolstat.measure.metrics` and :mod:`tolstat.models.statistics` for
*finite* pairs; the kernel reports a non-finite value in either array and the caller then
takes the general path (NaN/Inf handling, reference checks, messages). Sums are
sequential, so ``sum_signed``/``sum_abs`` agree with numpy's pairwise sums to float
rounding, not bit for bit; the maximum, its index and the exceedance count are exact.

Layer: metrics (imports only :mod:`tolstat._base.dtypes`, numpy and numba).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from tolstat._base import numba_cache as _numba_cache

_numba_cache.install()  # before this module's @njit(cache=True) kernels: cache outside the package

__all__ = ["FusedMax", "SCORE_MODES", "fused_max", "decode_table"]

#: element scores the kernel computes: ``abs`` = ``|d|``, ``rel`` = ``|d| / max(|ref|, floor)``
SCORE_MODES = {"abs": 0, "rel": 1}

_LUTS: dict[str, np.ndarray] = {}


def decode_table(dtype: np.dtype) -> np.ndarray | None:
    """float64 value of every bit pattern of an 8- or 16-bit float dtype (None otherwise).

    Built once per dtype with the dtype's own (exact) cast to float64.
    """
    dt = np.dtype(dtype)
    if dt.itemsize not in (1, 2) or dt.kind not in "fV":
        return None
    key = dt.name
    lut = _LUTS.get(key)
    if lut is None:
        codes = np.arange(2 ** (8 * dt.itemsize), dtype=np.uint8 if dt.itemsize == 1 else np.uint16)
        with np.errstate(invalid="ignore", over="ignore"):
            lut = codes.view(dt).astype(np.float64)
        _LUTS[key] = lut
    return lut


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _score(d: float, ev: float, mode: int, floor: float) -> float:
    ad = abs(d)
    if mode == 0:
        return ad
    r = abs(ev)
    return 0.0 if ad == 0.0 else ad / (r if r > floor else floor)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _fused_lut(bits: np.ndarray, lut: np.ndarray, e: np.ndarray, mode: int, floor: float,
               c: float) -> tuple[int, float, int, int, float, float]:
    """(status, max score, first argmax, #score > c, sum d, sum |d|); status 1: non-finite seen.

    ``bits``: the output's bit patterns, decoded by ``lut``.
    """
    best, arg, n_exc, s_d, s_ad = -1.0, 0, 0, 0.0, 0.0
    for i in range(e.size):
        ev = e[i]
        d = lut[bits[i]] - ev
        if not (np.isfinite(d) and np.isfinite(ev)):
            return 1, 0.0, i, 0, 0.0, 0.0
        sc = _score(d, ev, mode, floor)
        if sc > best:
            best, arg = sc, i
        n_exc += sc > c
        s_d += d
        s_ad += abs(d)
    return 0, best, arg, n_exc, s_d, s_ad


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _fused_direct(a: np.ndarray, e: np.ndarray, mode: int, floor: float,
                  c: float) -> tuple[int, float, int, int, float, float]:
    """:func:`_fused_lut` for a float32/float64 output."""
    best, arg, n_exc, s_d, s_ad = -1.0, 0, 0, 0.0, 0.0
    for i in range(e.size):
        ev = e[i]
        d = np.float64(a[i]) - ev
        if not (np.isfinite(d) and np.isfinite(ev)):
            return 1, 0.0, i, 0, 0.0, 0.0
        sc = _score(d, ev, mode, floor)
        if sc > best:
            best, arg = sc, i
        n_exc += sc > c
        s_d += d
        s_ad += abs(d)
    return 0, best, arg, n_exc, s_d, s_ad


@dataclass(frozen=True)
class FusedMax:
    """Result of :func:`fused_max` (finite pairs only).

    Attributes
    ----------
    value : float
        ``max_i score_i``.
    index : int
        Flat index of its first occurrence (as ``numpy.argmax``).
    actual, expected : float
        float64 values of the pair at ``index``.
    n_exceeding : int
        Elements with ``score_i > threshold``.
    sum_signed, sum_abs : float
        ``sum_i d_i`` and ``sum_i |d_i|`` (sequential float64 sums).
    """

    value: float
    index: int
    actual: float
    expected: float
    n_exceeding: int
    sum_signed: float
    sum_abs: float


def fused_max(actual: np.ndarray, expected: np.ndarray, *, score: str, threshold: float,
              rel_floor: float = 0.0) -> FusedMax | None:
    """Max element score, its index and the bias sums in one pass; None on a non-finite pair.

    Parameters
    ----------
    actual, expected : numpy.ndarray
        Same shape; ``actual`` any float dtype (8/16-bit formats are read through
        :func:`decode_table`), ``expected`` converted to float64 if it is not.
    score : {"abs", "rel"}
        Element score (:data:`SCORE_MODES`).
    threshold : float
        Counts ``score_i > threshold``.
    rel_floor : float
        Floor of ``|expected|`` of the relative score.

    Returns
    -------
    FusedMax or None
        None when an element of either array (or their difference) is NaN/Inf.
    """
    if score not in SCORE_MODES:
        raise ValueError(f"score must be one of {sorted(SCORE_MODES)}, got {score!r}")
    a = np.ravel(actual)
    e = np.ravel(np.asarray(expected, dtype=np.float64))
    mode, floor, c = SCORE_MODES[score], float(rel_floor), float(threshold)
    lut = decode_table(a.dtype)
    if lut is not None:
        bits = a.view(np.uint8 if a.dtype.itemsize == 1 else np.uint16)
        status, best, arg, n_exc, s_d, s_ad = _fused_lut(bits, lut, e, mode, floor, c)
        av = float(lut[bits[arg]])
    else:
        if a.dtype not in (np.float32, np.float64):
            a = np.asarray(a, dtype=np.float64)
        status, best, arg, n_exc, s_d, s_ad = _fused_direct(a, e, mode, floor, c)
        av = float(a[arg])
    if status:
        return None
    return FusedMax(value=float(best), index=int(arg), actual=av, expected=float(e[arg]),
                    n_exceeding=int(n_exc), sum_signed=float(s_d), sum_abs=float(s_ad))


# --------------------------------------------------------------------------- operator noise
@numba.njit(cache=True, nogil=True, error_model="numpy")
def _op_kernel(a: np.ndarray, e: np.ndarray, rn: np.ndarray, m: np.ndarray, use_m: bool, A: float, B: float,
               C: float, D: float, frac_k: float, rowlen: int) -> tuple[np.ndarray, np.ndarray]:
    """Core and row statistics of ``z = d / s`` under the two noise shapes in one pass.

    ``s0 = (A |e| + B m) + D`` and ``s1 = ((A |e| + B m) + C m) + D``, in numpy's order of
    :func:`tolstat.measure.noise.noise_scale`. Returns ``(stats[2, 9], bad[2])``: per shape max
    ``|z|``, sum ``z^2``, sum ``|z|``, sum ``z``, count ``|z| > k``, max row mean of
    ``z^2``, sum of row RMS, max row ``|sum b| / sqrt(sum s^2)``, sum ``sign(e) b / s``,
    with ``b = a - rn`` the error beyond the correctly rounded reference ``rn`` (the bias
    sums: column 3 is sum ``b / s``);
    ``bad``: a non-finite
    mismatch was seen (the statistics of that shape are then all ``inf``).
    """
    out = np.zeros((2, 9))
    out[:, 5] = -1.0
    bad = np.zeros(2, dtype=np.bool_)
    n = e.size
    rs2 = np.zeros(2)
    rd = np.zeros(2)
    rss = np.zeros(2)
    for i in range(n):
        av = a[i]
        ev = e[i]
        ae = abs(ev)
        mv = m[i] if use_m else ae
        base = A * ae + B * mv
        d = av - ev
        b = av - rn[i]
        same = av == ev or (np.isnan(av) and np.isnan(ev))
        sg = 1.0 if ev > 0 else (-1.0 if ev < 0 else 0.0)
        for j in range(2):
            s = (base + C * mv) + D if j == 1 else base + D
            dj = d
            bj = b if np.isfinite(b) else 0.0
            if not (np.isfinite(d) and np.isfinite(s)):
                if not same:
                    bad[j] = True
                dj = 0.0
                bj = 0.0
                s = 1.0
            z = dj / s
            zb = bj / s
            az = abs(z)
            if az > out[j, 0]:
                out[j, 0] = az
            out[j, 1] += z * z
            out[j, 2] += az
            out[j, 3] += zb
            out[j, 8] += sg * zb
            if az > frac_k:
                out[j, 4] += 1.0
            rs2[j] += z * z
            rd[j] += bj
            rss[j] += s * s
        if (i + 1) % rowlen == 0:
            for j in range(2):
                ms = rs2[j] / rowlen
                if ms > out[j, 5]:
                    out[j, 5] = ms
                out[j, 6] += np.sqrt(ms)
                num = abs(rd[j])
                t = 0.0 if num == 0.0 else num / np.sqrt(rss[j])
                if t > out[j, 7]:
                    out[j, 7] = t
                rs2[j] = 0.0
                rd[j] = 0.0
                rss[j] = 0.0
    return out, bad


def op_statistics(actual: np.ndarray, expected: np.ndarray, magnitude: np.ndarray | None, *,
                  A: float, B: float, C: float, D: float, frac_k: float,
                  rowlen: int | None, rounded: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_op_kernel` on flat float64 views; ``rowlen`` None: no row statistics.

    ``actual``, ``expected`` (and ``magnitude``) are float64 arrays of one shape with rows
    along the last axis; ``rounded`` the reference rounded to the output format (default:
    ``expected``, i.e. bias sums of ``actual - expected``). Returns ``(stats[2, 9], bad[2])`` as the kernel does.
    """
    a = np.ravel(actual)
    e = np.ravel(expected)
    m = e if magnitude is None else np.ravel(magnitude)
    rn = e if rounded is None else np.ravel(rounded)
    rl = int(rowlen) if rowlen else max(1, e.size)
    return _op_kernel(a, e, rn, m, magnitude is not None, float(A), float(B), float(C), float(D),
                      float(frac_k), rl)
