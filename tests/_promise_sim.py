"""End-to-end simulation of the promise of :func:`tolstat.select`, through the public API only.

The promise: ``table = tolstat.select(errors, fp_budget=a, confidence=g)`` keeps, with
probability ``>= g`` over calibrations, the probability that a fresh *correct* run fails
``tolstat.check(actual, expected, ..., table=table)`` at or below ``a``.

Unlike ``tests/_certify_sim.py`` (which draws internal run statistics), every step here is
the user's path: *correct* kernels with a known error law produce ``(actual, expected)``
output pairs (``actual`` in float16 or bfloat16, ``expected`` in float64, at most 256
elements); :func:`tolstat.from_pairs` turns ``n`` of them into an error dataset (with a
magnitude array and the covariate ``K`` per pair on the *operator* path);
:func:`tolstat.select` calibrates a table; and the true false-positive (FP) rate of that
table is estimated by :func:`tolstat.check` on ``M`` fresh correct runs of the same family
(one fresh set per cell, reused by every calibration of it; each calibration is still
drawn independently of it; ``Batch.fresh_per_calibration`` draws one per calibration).
``USE_CHECK_RUNS`` (or ``TOLSTAT_PROMISE_CHECK_RUNS=1``) switches the fresh-run decision
to the vectorised ``tolstat.check_runs``, cross-checked against ``tolstat.check`` on the
first table of each cell.

Over ``R`` independent calibrations a *cell* (family, path, form, n, budget) records the
refusal rate (:class:`tolstat.NotEnoughData`, or a NaN threshold with
``on_error="skip"``), the *realised violation rate* (share of the non-refused calibrations
whose estimated FP exceeds the budget), the mean FP, and the Monte-Carlo limit
``1 - g + 2 s.e.`` with ``s.e. = sqrt(v (1 - v) / R_accepted)``, ``v = 1 - g``.

Estimating FP from ``M`` runs
-----------------------------
The FP of one table is estimated by ``count / M`` (``count`` = fresh runs whose check
result has ``not passed``), and a calibration *violates* when ``count / M > a`` (the
"point rule"). This
noise inflates the violation rate when the true FP is near the budget. The harness uses
``M = ceil(fresh_factor / a)`` fresh runs (``fresh_factor = 20`` by default) and reports
the expected inflation (:func:`point_rule_inflation`): the excess of the point rule over
the true violation probability for the *exact* order statistic on all ``n`` independent
units of the calibration (its FP is ``Beta(k, n + 1 - k)`` for the largest valid rank
``k``, so ``count`` is beta-binomial; an upper estimate for a calibration that fits on
part of its units). A cell keeps its promise when ``violation rate <= 1 - g + 2 s.e. + inflation`` (the fast
tests assert this); the grid's verdict (:attr:`CellResult.ok`) fails a cell only when it is
over that line *and* the excess is significant (one-sided binomial p-value of the
violations against ``1 - g + inflation`` below :data:`P_BREAK`), because an exact method
sits just below the line and a grid of hundreds of cells crosses it by chance now and then.
A one-sided exact binomial test (``P(Binom(M, a) >= count) < SIG_LEVEL``) gives a second,
conservative count (``violations_sig``: a calibration with true FP <= a is flagged with
probability < ``SIG_LEVEL``), reported next to it.

One fresh set serving all calibrations of a cell (the fast tests; ``--fresh-set shared``)
shares its own sampling error: it shifts every calibration's estimate the same way, the
violations of a cell are positively correlated, and the binomial s.e. is then optimistic
(measured below, :func:`full_batches` and :func:`quick_batches`). Larger ``M`` shrinks
this; the grids therefore draw a fresh set per calibration when runs are decided per pair
(the same cost per run), and one shared set of ``100 / a`` runs with ``check_runs``. For the
mixture laws the fresh set is stratified so that its mixture weights are exact: the scale
mixture draws one scale per stratum of the scale law; the rare-large-run families draw
half of the fresh runs from the 10x component, weighted by its probability
(:func:`fresh_sample`; a fresh set of 1000 plain draws held 28 instead of 20 rare runs
and made every calibration look 40 % worse).

Used by ``tests/test_promise_end_to_end.py`` and ``benchmarks/promise_table.py``.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import sys
import time
import warnings
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import ml_dtypes
import numpy as np
from scipy import stats

import tolstat

__all__ = [
    "CONFIDENCE", "SIG_LEVEL", "P_BREAK", "HARDWARE", "Pair", "Family", "FAMILIES", "Batch", "CellResult",
    "round_to", "shift_ulps", "point_rule_inflation", "fresh_sample", "excess_pvalue", "build_errors",
    "fresh_passed", "run_batch", "USE_CHECK_RUNS", "use_check_runs", "fast_batches", "quick_batches",
    "full_batches", "cell_names", "select_cells", "markdown_table", "results_json", "reference_min_units", "refused_groups", "expected_outcome",
]

CONFIDENCE = 0.95
#: level of the one-sided binomial test of ``violations_sig``
SIG_LEVEL = 0.01
#: a cell over its limit breaks the promise when the excess is this significant (the grid's
#: verdict; an exact method sits just below the limit, so the 2-s.e. line alone is crossed
#: by chance in a few % of cells, as in ``tests/_certify_sim.py``)
P_BREAK = 1e-3
HARDWARE = "sim"
#: the dtypes of the simulated kernels' outputs
NP_DTYPES: dict[str, Any] = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
#: unit roundoff of float16 (half an ULP at 1): the noise unit of the synthetic laws
U16 = 2.0 ** -11
SIDE = 16  # outputs are SIDE x SIDE = 256 elements
K_LOG2 = (5.0, 9.0)  # K (reduction length) log-uniform over 32 .. 512
#: forms of ``select`` per path; "default" is the call without ``form=`` and "none" is ``form=None``
FORMS = {"plain": ("default", "allclose", "size_aware", "none"), "operator": ("default", "operator")}


# --------------------------------------------------------------------------- pairs and rounding
@dataclass(frozen=True)
class Pair:
    """One kernel output and its float64 reference, with what :func:`tolstat.from_pairs` takes.

    Attributes
    ----------
    op : str
        Operator name (the table group).
    actual : numpy.ndarray
        Kernel output (float16 or ``ml_dtypes.bfloat16``).
    expected : numpy.ndarray
        Float64 reference, same shape.
    magnitude : numpy.ndarray
        The op applied to the absolute inputs (``|A| @ |B|``, float64), for the operator path.
    covariates : dict
        ``{"K": reduction length}``.
    labels : dict
        ``{"case": input id}`` for the clustered families, else empty.
    """

    op: str
    actual: np.ndarray
    expected: np.ndarray
    magnitude: np.ndarray
    covariates: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)


def _ordered(x: np.ndarray) -> np.ndarray:
    """16-bit floats as int32 in their numerical order (adjacent floats differ by 1)."""
    b = x.view(np.uint16).astype(np.int32)
    mag = b & 0x7FFF
    return np.where(b & 0x8000, -mag, mag)


def _from_ordered(o: np.ndarray, dtype: Any) -> np.ndarray:
    bits = (np.abs(o) | np.where(o < 0, 0x8000, 0)).astype(np.uint16)
    return bits.view(dtype)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to nearest (ties to even) in a 16-bit float format, exactly.

    numpy's float64 -> float16 cast rounds once (checked against the neighbour rule in
    ``tests/test_promise_end_to_end.py``). For bfloat16, a cast through float32 (what
    ``ml_dtypes`` does) can round twice; the candidate is corrected by comparing it with
    its two neighbours in float64.

    Parameters
    ----------
    x : numpy.ndarray
        Finite float64 values within the format's range.
    dtype : {"float16", "bfloat16"}

    Returns
    -------
    numpy.ndarray
        ``x`` correctly rounded, in ``dtype``.
    """
    dt = NP_DTYPES[dtype]
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float16":
        return x.astype(np.float16)  # numpy converts float64 to float16 in one rounding
    o = _ordered(np.ascontiguousarray(x.astype(np.float32).astype(dt)))
    cand = np.stack([o - 1, o, o + 1])
    vals = _from_ordered(cand, dt).astype(np.float64)
    err = np.abs(vals - x)
    # ties to even: an odd candidate loses an exact tie
    err = np.where(cand % 2 != 0, np.nextafter(err, np.inf), err)
    best = np.take_along_axis(cand, np.argmin(err, axis=0)[None], axis=0)[0]
    return _from_ordered(best, dt)


def shift_ulps(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Move 16-bit floats by ``k`` representable steps (negative ``k``: downwards)."""
    return _from_ordered(_ordered(np.ascontiguousarray(x)) + np.asarray(k, dtype=np.int32), x.dtype)


# --------------------------------------------------------------------------- error laws
def _draw_k(rng: np.random.Generator) -> int:
    return int(round(2.0 ** rng.uniform(*K_LOG2)))


def _reference(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """A float64 matmul of random inputs: (expected, |A| @ |B|, K)."""
    k = _draw_k(rng)
    a = rng.standard_normal((SIDE, k))
    b = rng.standard_normal((k, SIDE)) / math.sqrt(k)
    return a @ b, np.abs(a) @ np.abs(b), k


def _fp16_matmul(rng: np.random.Generator, op: str) -> Pair:
    """A real correct kernel: fp16 inputs, fp32 accumulation (BLAS sgemm), fp16 output."""
    k = _draw_k(rng)
    a = rng.standard_normal((SIDE, k)).astype(np.float16)
    b = rng.standard_normal((k, SIDE)).astype(np.float16)
    actual = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return Pair(op, actual, a64 @ b64, np.abs(a64) @ np.abs(b64), {"K": float(k)})


def _noisy(expected: np.ndarray, noise: np.ndarray, dtype: str = "float16") -> np.ndarray:
    """``RN(expected + noise * U16 * |expected|)``: a correct kernel with a known relative noise."""
    return round_to(expected + noise * U16 * np.abs(expected), dtype)


def draw_light(rng: np.random.Generator, n: int, op: str = "mm") -> list[Pair]:
    """Light tails: the fp16 matmul with fp32 accumulation, K in 32..512."""
    return [_fp16_matmul(rng, op) for _ in range(n)]


def draw_gauss(rng: np.random.Generator, n: int, op: str = "mm", *, scale: str = "one",
               eps: float = 0.0, stratified: bool = False) -> list[Pair]:
    """Gaussian relative noise with a per-run scale.

    ``scale="one"``: 1; ``"ten"``: 10; ``"loguniform4"``: log-uniform over [1, 4]
    (``stratified``: one uniform draw in each of ``n`` equal strata, shuffled: a fresh set
    whose scales follow the law without sampling error); ``"rare"``: 10 with probability
    ``eps``, else 1.
    """
    out = []
    u = (rng.permutation(n) + rng.random(n)) / n if stratified else None
    for i in range(n):
        e, m, k = _reference(rng)
        if scale == "loguniform4":
            s = 4.0 ** (u[i] if u is not None else rng.random())
        elif scale == "rare":
            s = 10.0 if rng.random() < eps else 1.0
        elif scale == "ten":
            s = 10.0
        else:
            s = 1.0
        out.append(Pair(op, _noisy(e, s * rng.standard_normal(e.shape)), e, m, {"K": float(k)}))
    return out


def draw_heavy(rng: np.random.Generator, n: int, op: str = "mm") -> list[Pair]:
    """Heavy tails: ``RN16(expected + t(df=2) * 2^-11 * |expected|)`` per element."""
    out = []
    for _ in range(n):
        e, m, k = _reference(rng)
        out.append(Pair(op, _noisy(e, rng.standard_t(2.0, e.shape)), e, m, {"K": float(k)}))
    return out


def draw_lattice(rng: np.random.Generator, n: int, op: str = "mm") -> list[Pair]:
    """Lattice (bfloat16): ``RN(expected)`` moved by ``+-k`` ULPs, ``k ~ Geometric(1/2) - 1``."""
    out = []
    for _ in range(n):
        e, m, k = _reference(rng)
        steps = (rng.geometric(0.5, e.shape) - 1) * rng.choice(np.array([-1, 1]), e.shape)
        out.append(Pair(op, shift_ulps(round_to(e, "bfloat16"), steps), e, m, {"K": float(k)}))
    return out


def draw_clustered(rng: np.random.Generator, n: int, op: str = "mm", *, k: int = 3,
                   corr: float = 0.9) -> list[Pair]:
    """``ceil(n / k)`` inputs, each through ``k`` correct variants whose noises correlate by ``corr``.

    Variant ``j`` of input ``i``: ``RN16(e_i + (sqrt(corr) Z_i + sqrt(1 - corr) W_ij) U16 |e_i|)``
    (every variant's noise is N(0, 1), as one fresh run of :func:`draw_gauss`); the label
    ``case = str(i)`` names the input. ``n`` runs (the last input may have fewer variants).
    """
    out: list[Pair] = []
    i = 0
    while len(out) < n:
        e, m, kk = _reference(rng)
        z = rng.standard_normal(e.shape)
        for _ in range(k):
            if len(out) == n:
                break
            noise = math.sqrt(corr) * z + math.sqrt(1.0 - corr) * rng.standard_normal(e.shape)
            out.append(Pair(op, _noisy(e, noise), e, m, {"K": float(kk)}, {"case": str(i)}))
        i += 1
    return out


def draw_duplicates(rng: np.random.Generator, n: int, op: str = "mm", *, copies: int = 3) -> list[Pair]:
    """Exact duplicates: ``ceil(n / copies)`` light-tail runs, each ``copies`` times (the dataset
    concatenated with itself); ``n`` runs."""
    base = draw_light(rng, math.ceil(n / copies), op)
    runs = [Pair(p.op, p.actual.copy(), p.expected.copy(), p.magnitude.copy(), dict(p.covariates))
            for _ in range(copies) for p in base]
    return runs[:n]


def draw_pooled(rng: np.random.Generator, n: int, *, groups: int = 10,
                law: Callable[..., list[Pair]] = draw_light) -> list[Pair]:
    """``groups`` ops (``mm0`` ... ) of one law, ``n`` runs each."""
    return [p for g in range(groups) for p in law(rng, n, f"mm{g}")]


def draw_pooled_one_noisier(rng: np.random.Generator, n: int, *, groups: int = 10) -> list[Pair]:
    """One op (``mm0``) whose error is twice the light law's among ``groups - 1`` ops (``mm1``
    ... ) of the light law, ``n`` runs each: the pool test rejects ``mm0`` (its scores are
    higher), and the light groups, short of units alone, borrow its scores."""
    noisier = [Pair("mm0", round_to(p.expected + 2.0 * (p.actual.astype(np.float64) - p.expected), "float16"),
                    p.expected, p.magnitude, p.covariates) for p in draw_light(rng, n, "mm0")]
    return noisier + [p for g in range(1, groups) for p in draw_light(rng, n, f"mm{g}")]


@dataclass(frozen=True)
class Family:
    """A family of correct kernels with a known error law.

    Attributes
    ----------
    name : str
    law : str
        The error law in words.
    draw : callable
        ``draw(rng, n)``: the calibration runs (``n`` runs per group).
    fresh : callable
        ``fresh(rng, m)``: ``m`` independent fresh correct runs of the checked group.
    strata : tuple of (probability, callable)
        When given (a mixture law), the fresh set is drawn per component instead of from
        ``fresh``: half of it from each component (the rest to the first), each run weighted
        by its component's probability over its count (:func:`fresh_sample`), so that the
        mixture weights carry no sampling error and the rare component is well sampled.
    dtype : str
        Output dtype.
    target_op : str
        The group whose FP is estimated (group 0 of the pooled families).
    groups : int
        Table groups (ops) of one calibration.
    run_units : float
        Independent units per run (``1/k`` for ``k`` clustered variants, ``1/copies`` for
        duplicates): the reference inflation counts units.
    cluster : str, optional
        Run label passed as ``select(cluster=...)`` (declared clusters); the labels are
        dropped from the dataset of an undeclared clustered family.
    mixed_pool : bool
        The groups are not all of one law (a pool with a member of another law): the checked
        group may be refused whatever its units (:func:`expected_outcome` says ``"either"``).
    """

    name: str
    law: str
    draw: Callable[[np.random.Generator, int], list[Pair]]
    fresh: Callable[[np.random.Generator, int], list[Pair]]
    dtype: str = "float16"
    target_op: str = "mm"
    groups: int = 1
    run_units: float = 1.0
    cluster: str | None = None
    keep_labels: bool = False
    strata: tuple[tuple[float, Callable[[np.random.Generator, int], list[Pair]]], ...] = ()
    mixed_pool: bool = False


def fresh_sample(family: Family, rng: np.random.Generator, m: int) -> tuple[list[Pair], np.ndarray]:
    """``m`` fresh correct runs of ``family`` and their weights (summing to 1).

    The FP of a table is estimated by ``sum(weights[failed])``: ``1/m`` each for a plain
    family; for a mixture (``family.strata``), component ``j`` gets ``m_j`` runs of weight
    ``p_j / m_j`` (stratified sampling: unbiased, and the rare component is sampled at
    ``m_j / m`` instead of ``p_j``).
    """
    if not family.strata:
        return family.fresh(rng, m), np.full(m, 1.0 / m)
    k = len(family.strata)
    sizes = [m // k] * k
    sizes[0] += m - sum(sizes)
    pairs: list[Pair] = []
    w = []
    for (prob, law), mj in zip(family.strata, sizes):
        pairs += law(rng, mj)
        w.append(np.full(mj, prob / mj))
    return pairs, np.concatenate(w)


def _families() -> dict[str, Family]:
    p = functools.partial
    fams = [
        Family("light", "fp16 matmul, fp32 accumulation, K 32..512, vs float64 product of the fp16 inputs",
               draw_light, draw_light),
        Family("heavy_t2", "RN16(e + t2 * 2^-11 |e|), e a float64 matmul", draw_heavy, draw_heavy),
        Family("lattice_bf16", "RN_bf16(e) moved by +-k ULPs, k ~ Geometric(1/2) - 1", draw_lattice,
               draw_lattice, dtype="bfloat16"),
        Family("scale_mix4", "RN16(e + s N(0,1) 2^-11 |e|), s log-uniform on [1, 4] per run",
               p(draw_gauss, scale="loguniform4"), p(draw_gauss, scale="loguniform4", stratified=True)),
    ]
    for eps in (0.005, 0.02):
        law = p(draw_gauss, scale="rare", eps=eps)
        fams.append(Family(f"rare{eps * 100:g}pct_10x", f"Gaussian relative noise; {eps:.1%} of runs 10x", law, law,
                           strata=((1.0 - eps, p(draw_gauss, scale="one")), (eps, p(draw_gauss, scale="ten")))))
    for k in (2, 3, 4):
        for corr in (0.5, 0.9):
            law = p(draw_clustered, k=k, corr=corr)
            for declared in (False, True):
                nm = f"clustered_k{k}_c{corr:g}" + ("_declared" if declared else "")
                fams.append(Family(nm, f"{k} variants per input, noise correlation {corr:g}, "
                                   + ("declared (case label, cluster='case')" if declared else "undeclared"),
                                   law, draw_gauss, run_units=1.0 / k, cluster="case" if declared else None,
                                   keep_labels=declared))
    fams.append(Family("duplicates_x3", "light tails, every run 3 identical copies", draw_duplicates, draw_light,
                       run_units=1.0 / 3))
    fams.append(Family("pooled10_light", "10 ops of the light law, n runs each; group mm0 checked",
                       draw_pooled, p(draw_light, op="mm0"), target_op="mm0", groups=10))
    fams.append(Family("pooled10_one_noisier", "mm0 with twice the light law's error among 9 ops of the light law, "
                       "n runs each; group mm1 checked", draw_pooled_one_noisier, p(draw_light, op="mm1"),
                       target_op="mm1", groups=10, mixed_pool=True))
    return {f.name: f for f in fams}


#: name -> :class:`Family`
FAMILIES: dict[str, Family] = _families()


# --------------------------------------------------------------------------- datasets, checks
def build_errors(pairs: Sequence[Pair], family: Family, path: str) -> Any:
    """The error dataset of ``pairs`` through :func:`tolstat.from_pairs` (one call per op).

    ``path="operator"`` passes each pair's magnitude (operator statistics); ``"plain"``
    does not. Covariates (``K``) always; labels only for a declared clustered family.
    """
    by_op: dict[str, list[tuple]] = {}
    for p in pairs:
        lab = p.labels if family.keep_labels else {}
        item = ((p.actual, p.expected, p.magnitude, lab, p.covariates) if path == "operator"
                else (p.actual, p.expected, lab, p.covariates))
        by_op.setdefault(p.op, []).append(item)
    parts = [tolstat.from_pairs(items, op=op, dtype=family.dtype, hardware=HARDWARE, options=tolstat.CollectOptions(progress=False))
             for op, items in by_op.items()]
    return parts[0] if len(parts) == 1 else tolstat.concat(parts)


#: decide fresh runs with the vectorised ``tolstat.check_runs`` instead of :func:`tolstat.check` per pair
#: (the one switch; needs ``hasattr(tolstat, "check_runs")``; the environment variable
#: ``TOLSTAT_PROMISE_CHECK_RUNS=1`` sets it)
USE_CHECK_RUNS = os.environ.get("TOLSTAT_PROMISE_CHECK_RUNS", "") == "1"


def use_check_runs(flag: bool | None = None) -> bool:
    """Whether fresh runs are decided by ``tolstat.check_runs`` (``None``: :data:`USE_CHECK_RUNS`).

    Raises
    ------
    RuntimeError
        Asked for, but this tolstat has no ``check_runs``.
    """
    on = USE_CHECK_RUNS if flag is None else bool(flag)
    if on and not hasattr(tolstat, "check_runs"):
        raise RuntimeError("tolstat.check_runs is not available in this tolstat; decide per pair (tolstat.check)")
    return on


def fresh_passed(table: Any, fresh: Sequence[Pair], family: Family, path: str, *,
                 fresh_errors: Any = None, vectorised: bool = False) -> np.ndarray:
    """Pass (True) / fail of each fresh correct run checked against ``table``.

    ``vectorised=False``: :func:`tolstat.check` per pair (``CheckOptions(magnitude=)`` on the operator
    path; the covariate ``K`` always), ``not result.passed`` is a failure. ``True``:
    ``tolstat.check_runs(fresh_errors, table)`` on the error dataset of the same pairs.
    """
    if vectorised:
        passed = np.asarray(tolstat.check_runs(fresh_errors, table), dtype=bool)
        if passed.shape != (len(fresh),):
            raise ValueError(f"check_runs returned shape {passed.shape}, expected ({len(fresh)},)")
        return passed
    out = np.empty(len(fresh), dtype=bool)
    for i, p in enumerate(fresh):
        r = tolstat.check(p.actual, p.expected, op=p.op, dtype=family.dtype, table=table, hardware=HARDWARE,
                          covariates=p.covariates,
                          options=tolstat.CheckOptions(magnitude=p.magnitude if path == "operator" else None))
        out[i] = bool(r.passed)
    return out


# --------------------------------------------------------------------------- statistics of a cell
def reference_min_units(a: float, g: float) -> int:
    """Units the exact order statistic needs: ``ceil(ln(1 - g) / ln(1 - a))``."""
    return int(math.ceil(math.log(1.0 - g) / math.log1p(-a) - 1e-12))


def _reference_rank(units: int, a: float, g: float) -> int:
    """Largest k such that the k-th largest of ``units`` scores bounds the (1-a)-quantile at g (0: none)."""
    if units < reference_min_units(a, g):
        return 0
    lo, hi = 1, units
    while lo < hi:  # P(FP > a) = betainc-sf increases with k
        mid = (lo + hi + 1) // 2
        if stats.beta.sf(a, mid, units + 1 - mid) <= 1.0 - g:
            lo = mid
        else:
            hi = mid - 1
    return lo


@functools.lru_cache(maxsize=4096)
def point_rule_inflation(units: int, a: float, g: float, m: int) -> float:
    """Expected excess of the point rule's violation rate over the true one (exact order statistic).

    With ``k`` = :func:`_reference_rank`, the true FP of the k-th largest of ``units``
    continuous scores is ``Beta(k, units + 1 - k)`` and the number of ``m`` fresh runs
    failing is beta-binomial; returns ``P(count > floor(m a)) - P(FP > a)`` (0 where the
    order statistic cannot certify).
    """
    k = _reference_rank(int(units), a, g)
    if k == 0:
        return 0.0
    b = units + 1 - k
    c = int(math.floor(m * a + 1e-9))
    return max(0.0, float(stats.betabinom.sf(c, m, k, b)) - float(stats.beta.sf(a, k, b)))


def excess_pvalue(failed: np.ndarray, weights: np.ndarray, family: Family, a: float) -> float:
    """One-sided p-value of "the table's FP exceeds ``a``" from the fresh runs that failed.

    Plain fresh set: exact binomial, ``P(Binom(M, a) >= failures)``. Stratified
    (``family.strata``): normal approximation of the weighted estimate, with each
    component's variance at its observed rate (at least one failure).
    """
    m = failed.size
    if not family.strata:
        return float(stats.binom.sf(int(failed.sum()) - 1, m, a))
    fp, var = 0.0, 0.0
    for w in np.unique(weights):
        sel = weights == w
        mj = int(sel.sum())
        pj = max(float(failed[sel].mean()), 1.0 / mj)
        prob = w * mj
        fp += prob * float(failed[sel].mean())
        var += prob * prob * pj * (1.0 - pj) / mj
    return float(stats.norm.sf((fp - a) / math.sqrt(var))) if var > 0 else float(fp <= a)


@dataclass
class CellResult:
    """Outcome of one cell over its calibrations (see the module docstring)."""

    name: str
    family: str
    path: str
    form: str
    n: int
    budget: float
    confidence: float
    reps: int
    fresh: int
    refused: int = 0
    errors: int = 0
    violations: int = 0
    violations_sig: int = 0
    fps: list[float] = field(default_factory=list)
    thresholds: list[float] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    refusal: str = ""
    error: str = ""
    warnings: list[str] = field(default_factory=list)
    inflation: float = 0.0
    expect: str = "either"
    fresh_shared: bool = True
    seconds: float = 0.0

    @property
    def accepted(self) -> int:
        """Calibrations with a threshold."""
        return self.reps - self.refused - self.errors

    @property
    def refusal_rate(self) -> float:
        return self.refused / self.reps if self.reps else math.nan

    @property
    def violation_rate(self) -> float:
        """Share of accepted calibrations whose estimated FP exceeds the budget (point rule)."""
        return self.violations / self.accepted if self.accepted else math.nan

    @property
    def violation_rate_sig(self) -> float:
        return self.violations_sig / self.accepted if self.accepted else math.nan

    @property
    def se(self) -> float:
        """Monte-Carlo s.e. of a violation rate of ``1 - confidence`` over the accepted calibrations."""
        v = 1.0 - self.confidence
        return math.sqrt(v * (1.0 - v) / self.accepted) if self.accepted else math.nan

    @property
    def limit(self) -> float:
        """``1 - g + 2 s.e.``."""
        return 1.0 - self.confidence + 2.0 * self.se if self.accepted else math.nan

    @property
    def mean_fp(self) -> float:
        return float(np.mean(self.fps)) if self.fps else math.nan

    @property
    def max_fp(self) -> float:
        return float(np.max(self.fps)) if self.fps else math.nan

    @property
    def p_excess(self) -> float:
        """One-sided binomial p-value of "the violation probability exceeds ``1 - g + inflation``"."""
        if not self.accepted:
            return math.nan
        v = min(1.0, 1.0 - self.confidence + self.inflation)
        return float(stats.binom.sf(self.violations - 1, self.accepted, v))

    @property
    def significant_break(self) -> bool:
        """An error, or a violation rate over ``limit + inflation`` with :attr:`p_excess` < :data:`P_BREAK`."""
        return self.errors > 0 or (not self.keeps_promise and self.p_excess < P_BREAK)

    @property
    def keeps_promise(self) -> bool:
        """No errors, and the violation rate within ``limit + inflation`` (vacuously true if all refused)."""
        return self.errors == 0 and (not self.accepted or self.violation_rate <= self.limit + self.inflation)

    @property
    def as_expected(self) -> bool:
        """Refusals as :func:`expected_outcome` says: all refused (``"refuse"``), none (``"threshold"``)."""
        if self.expect == "refuse":
            return self.accepted == 0 and self.errors == 0
        if self.expect == "threshold":
            return self.refused == 0 and self.errors == 0
        return self.errors == 0

    @property
    def ok(self) -> bool:
        """No :attr:`significant_break` and :attr:`as_expected` (the verdict of the grid)."""
        return not self.significant_break and self.as_expected

    def summary(self) -> str:
        """One line for logs and assertion messages."""
        return (f"{self.name}: {self.reps} calibrations, {self.refused} refused (expected: {self.expect}), "
                f"{self.errors} errors, "
                f"violations {self.violations}/{self.accepted} = {self.violation_rate:.3f} (limit "
                f"{self.limit:.3f} + inflation {self.inflation:.3f}; binomial-test violations "
                f"{self.violations_sig}), mean FP {self.mean_fp:.3g}, max FP {self.max_fp:.3g} on M={self.fresh} "
                f"({'one shared fresh set' if self.fresh_shared else 'a fresh set per calibration'})"
                + (f"; first refusal: {self.refusal}" if self.refusal else "")
                + (f"; first error: {self.error}" if self.error else ""))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(accepted=self.accepted, refusal_rate=self.refusal_rate, violation_rate=self.violation_rate,
                 violation_rate_sig=self.violation_rate_sig, se=self.se, limit=self.limit, mean_fp=self.mean_fp,
                 max_fp=self.max_fp, p_excess=self.p_excess, keeps_promise=self.keeps_promise,
                 significant_break=self.significant_break,
                 as_expected=self.as_expected, ok=self.ok)
        return d


# --------------------------------------------------------------------------- one batch of cells
@dataclass(frozen=True)
class Batch:
    """Cells sharing their calibration data: one family, path and n; several budgets and forms.

    Calibration ``r`` draws its runs from ``default_rng([seed, crc32(family), n, r])``
    (independent of path, form and budget, so forms and paths are compared on the same
    runs); the fresh set from ``default_rng([seed, crc32(family), 7919])``.

    Attributes
    ----------
    family : str
        Key of :data:`FAMILIES`.
    path : {"plain", "operator"}
        Without / with operator statistics (magnitude arrays) in the dataset.
    n : int
        Runs per group of one calibration.
    budgets : tuple of float
    forms : tuple of str
        ``"default"`` (no ``form=``), ``"none"`` (``form=None``) or a form name.
    reps : int
        Calibrations R.
    fresh_factor : float
        ``M = ceil(fresh_factor / budget)`` fresh runs per budget.
    confidence : float
    seed : int
    fresh : int, optional
        A fixed ``M`` for every budget (overrides ``fresh_factor``).
    fresh_per_calibration : bool, default False
        Draw a new fresh set for every calibration (``default_rng([seed, crc32(family),
        7919, M, r])``) instead of one per cell: the violations of a cell are then
        independent and the binomial s.e. is exact; costs the generation (and, with
        ``check_runs``, the ``from_pairs``) of the fresh runs per calibration.
    on_error : {"raise", "skip"}
        ``select``'s ``on_error``; a refusal is a :class:`tolstat.NotEnoughData` or a NaN
        threshold of the checked group.
    """

    family: str
    path: str
    n: int
    budgets: tuple[float, ...] = (1e-2,)
    forms: tuple[str, ...] = ("default",)
    reps: int = 50
    fresh_factor: float = 20.0
    confidence: float = CONFIDENCE
    seed: int = 0
    fresh: int | None = None
    fresh_per_calibration: bool = False
    on_error: str = "raise"

    def fresh_size(self, budget: float) -> int:
        if self.fresh is not None:
            return int(self.fresh)
        return int(math.ceil(self.fresh_factor / budget - 1e-9))

    def cell_name(self, form: str, budget: float) -> str:
        return f"{self.family}/{self.path}/{form}/n={self.n}/a={budget:g}"

    def cells(self) -> list[str]:
        return [self.cell_name(f, b) for b in self.budgets for f in self.forms]


def _select_kwargs(form: str, family: Family, budget: float, g: float, on_error: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"fp_budget": budget, "confidence": g}
    if form != "default":
        kw["form"] = None if form == "none" else form
    if family.cluster is not None and form in ("default", "auto", "operator"):
        kw["cluster"] = family.cluster
    if on_error != "raise":
        kw["on_error"] = on_error
    return kw


def _group_index(table: Any, op: str) -> int:
    for i, (o, _dt, hw) in enumerate(table.groups):
        if o == op and hw == HARDWARE:
            return i
    raise KeyError(f"table has no group for op {op!r}: {table.groups}")


def _group_threshold(table: Any, op: str) -> float:
    """The max-error threshold of the group of ``op`` (NaN when any of its statistics is refused)."""
    row = np.asarray(table.data["threshold"].values[_group_index(table, op)], dtype=np.float64)
    return math.nan if np.isnan(row).any() else float(row[0])


def refused_groups(table: Any) -> list[str]:
    """Ops of ``table`` with a NaN threshold (refused with ``on_error="skip"``)."""
    thr = table.data["threshold"].values
    return [o for (o, _d, _h), row in zip(table.groups, thr) if np.isnan(row).any()]


def _decision_key(table: Any) -> str:
    """What :func:`tolstat.check` decides on: thresholds, scale models, certificates without their prose."""
    d = table.data
    certs = []
    for s in (d["certificate_json"].values if "certificate_json" in d else []):
        c = json.loads(str(s)) if str(s) else {}
        certs.append({k: v for k, v in c.items() if k not in ("form_reason", "reason", "guarantee")})
    return json.dumps([table.groups, table.statistics, d["threshold"].values.tolist(),
                       [str(s) for s in d["scale_json"].values], certs], sort_keys=True, default=str)


def run_batch(batch: Batch, *, cells: Iterable[str] | None = None, vectorised: bool | None = None,
              cross_check: int = 1, progress: Callable[[str], None] | None = None) -> list[CellResult]:
    """Run the calibrations of one batch; one :class:`CellResult` per (budget, form).

    Parameters
    ----------
    batch : Batch
    cells : iterable of str, optional
        Only these cell names (default: all of the batch).
    vectorised : bool, optional
        Decide fresh runs with ``tolstat.check_runs`` (default: :data:`USE_CHECK_RUNS`),
        else :func:`tolstat.check` per pair.
    cross_check : int, default 1
        With ``vectorised``: the first ``cross_check`` accepted tables of each cell are also
        decided per pair; a disagreement is recorded as an error of the cell.
    progress : callable, optional
        Called with a line of progress now and then.

    Returns
    -------
    list of CellResult
    """
    fam = FAMILIES[batch.family]
    wanted = set(batch.cells() if cells is None else cells)
    todo = [(b, f) for b in batch.budgets for f in batch.forms if batch.cell_name(f, b) in wanted]
    if batch.path == "plain" and "operator" in batch.forms:
        raise ValueError("form 'operator' needs the operator path")
    vec = use_check_runs(vectorised)
    g = batch.confidence
    crc = zlib.crc32(batch.family.encode())
    cache: dict[tuple[int, ...], tuple[list[Pair], np.ndarray, Any]] = {}

    def fresh_set(m: int, rep: int) -> tuple[list[Pair], np.ndarray, Any]:
        """The fresh set of size ``m`` for calibration ``rep`` (drawn on first use: refused cells draw none)."""
        key = (m, rep) if batch.fresh_per_calibration else (m,)
        if key not in cache:
            for old in [k for k in cache if len(k) == 2 and k[1] != rep]:
                del cache[old]  # the sets of earlier calibrations are not used again
            pairs, w = fresh_sample(fam, np.random.default_rng([batch.seed, crc, 7919, *key]), m)
            cache[key] = (pairs, w, build_errors(pairs, fam, batch.path) if vec else None)
        return cache[key]

    res = {(b, f): CellResult(batch.cell_name(f, b), batch.family, batch.path, f, batch.n, b, g, 0,
                              batch.fresh_size(b)) for b, f in todo}
    units = int(round(batch.n * fam.groups * fam.run_units))
    for r in res.values():
        r.inflation = point_rule_inflation(units, r.budget, g, r.fresh)
        r.expect = expected_outcome(batch, r.budget)
        r.fresh_shared = not batch.fresh_per_calibration
    t0 = time.perf_counter()
    for rep in range(batch.reps if todo else 0):
        rng = np.random.default_rng([batch.seed, crc, batch.n, rep])
        try:
            ds = build_errors(fam.draw(rng, batch.n), fam, batch.path)
        except Exception as exc:  # noqa: BLE001 - from_pairs failed: an error of every cell
            for cell in res.values():
                cell.reps += 1
                cell.errors += 1
                cell.error = cell.error or f"from_pairs: {type(exc).__name__}: {exc}"
            continue
        memo: dict[tuple[int, str], np.ndarray] = {}
        for b, f in todo:
            cell = res[(b, f)]
            cell.reps += 1
            ts = time.perf_counter()
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    table = tolstat.select(ds, **_select_kwargs(f, fam, b, g, batch.on_error))
                for w in caught:
                    nm = type(w.message).__name__
                    if nm not in cell.warnings:
                        cell.warnings.append(nm)
                thr = _group_threshold(table, fam.target_op)
                if math.isnan(thr):
                    cell.refused += 1
                    if not cell.refusal:
                        i = _group_index(table, fam.target_op)
                        cell.refusal = "NaN threshold: " + str(table.data["reason"].values[i, 0])
                    continue
                pairs, weights, fresh_ds = fresh_set(cell.fresh, rep)
                key = (cell.fresh, _decision_key(table))
                if key not in memo:
                    ok = fresh_passed(table, pairs, fam, batch.path, fresh_errors=fresh_ds, vectorised=vec)
                    if vec and len(cell.fps) < cross_check:
                        ref = fresh_passed(table, pairs, fam, batch.path)
                        if (ref != ok).any():
                            raise AssertionError(f"check_runs disagrees with check on {int((ref != ok).sum())} of "
                                                 f"{ok.size} fresh runs (first: run {int(np.argmax(ref != ok))})")
                    memo[key] = ok
                failed = ~memo[key]
            except tolstat.NotEnoughData as exc:
                cell.refused += 1
                cell.refusal = cell.refusal or f"NotEnoughData: {exc}"
                continue
            except Exception as exc:  # noqa: BLE001 - recorded and reported by the cell
                cell.errors += 1
                cell.error = cell.error or f"{type(exc).__name__}: {exc}"
                continue
            finally:
                cell.seconds += time.perf_counter() - ts
            fp = float(weights[failed].sum())
            cell.fps.append(fp)
            cell.thresholds.append(thr)
            meth = ",".join(sorted(set(map(str, table.data["method"].values.ravel()))))
            if meth not in cell.methods:
                cell.methods.append(meth)
            cell.violations += fp > b
            cell.violations_sig += excess_pvalue(failed, weights, fam, b) < SIG_LEVEL
        if progress is not None and (rep + 1) % max(1, batch.reps // 5) == 0:
            progress(f"  {batch.family}/{batch.path}/n={batch.n}: {rep + 1}/{batch.reps} calibrations, "
                     f"{time.perf_counter() - t0:.1f} s")
    return [res[k] for k in todo]


# --------------------------------------------------------------------------- grids
BASE_FAMILIES = ("light", "heavy_t2", "lattice_bf16", "scale_mix4", "rare0.5pct_10x", "rare2pct_10x")
CLUSTER_FAMILIES = tuple(n for n in FAMILIES if n.startswith("clustered_"))


def fast_batches() -> dict[str, Batch]:
    """The batches of the fast tests (``tests/test_promise_end_to_end.py``), by purpose.

    ``fresh_factor=10``: ``M = 1000`` fresh runs at budget 1e-2 (point-rule inflation about
    0.006 at n = 300, :func:`point_rule_inflation`).
    """
    kw = dict(budgets=(1e-2,), fresh_factor=10.0)
    return {
        "light_plain_300": Batch("light", "plain", 300, reps=30, **kw),
        "duplicates_450": Batch("duplicates_x3", "plain", 450, reps=20, **kw),
        "clusters_undeclared_900": Batch("clustered_k3_c0.9", "plain", 900, reps=12, **kw),
        "light_operator_300": Batch("light", "operator", 300, forms=("default", "operator"), reps=16, **kw),
        "pooled_plain_10x30": Batch("pooled10_light", "plain", 30, reps=5, **kw),
        "pooled_operator_10x30": Batch("pooled10_light", "operator", 30, reps=5, **kw),
        "pooled_one_noisier_plain_10x30": Batch("pooled10_one_noisier", "plain", 30, reps=20, on_error="skip", **kw),
        "pooled_one_noisier_operator_10x30": Batch("pooled10_one_noisier", "operator", 30, reps=20, on_error="skip",
                                                   **kw),
    }


def expected_outcome(batch: Batch, budget: float) -> str:
    """``"threshold"``, ``"refuse"`` or ``"either"`` for a cell of ``batch`` at ``budget``.

    With ``u`` independent units (runs / variants for declared clusters, distinct runs for
    duplicates; the whole pool for pooled groups) and ``n_min`` the order statistic's
    minimum (:func:`reference_min_units`): ``u < n_min`` must be refused (no
    distribution-free bound exists); ``u >= n_min`` must get a threshold. A mixed pool
    (``Family.mixed_pool``): either, a group of another law may leave it short. Undeclared
    clusters: ``"either"`` between inputs and runs (refusing is allowed, the promise is
    checked by the violation rate).
    """
    fam = FAMILIES[batch.family]
    if fam.mixed_pool:
        return "either"
    nmin = reference_min_units(budget, batch.confidence)
    runs = batch.n * fam.groups
    units = int(round(runs * fam.run_units))
    if fam.run_units < 1 and fam.cluster is None and not batch.family.startswith("duplicates"):
        return "refuse" if runs < nmin else ("threshold" if units >= nmin else "either")
    return "threshold" if units >= nmin else "refuse"


def full_batches(reps: int = 100, fresh_factor: float | None = None, fresh_per_calibration: bool | None = None,
                 vectorised: bool | None = None) -> list[Batch]:
    """The whole grid (``benchmarks/promise_table.py``; the slow test runs it with fewer reps).

    At n = 1000 and 3000 the FP of a valid table concentrates just below the budget (about
    0.67 a at n = 3000, a = 1e-2), so the error of one *shared* fresh set moves every
    calibration of a cell across the budget together (measured: 85 % "violations" of
    ``light/plain/default/n=3000/a=0.01`` with one shared set of M = 1000, while
    independent sets of 4000 gave fresh-fail rates of 0.005-0.009 for the same tables).
    The defaults therefore depend on how fresh runs are decided (``vectorised``, default
    :data:`USE_CHECK_RUNS`): per pair (:func:`tolstat.check`), a fresh set per calibration
    with ``fresh_factor = 20`` (the decision costs the same per run either way);
    with ``tolstat.check_runs``, one shared set per cell (``from_pairs`` once) with
    ``fresh_factor = 100``, so that its error is about a tenth of the budget.

    * base families x n in (30, 100, 300, 1000, 3000) x budgets (1e-2, 1e-3), plain path with
      the default and the named forms, operator path with the default and ``"operator"``;
    * clustered families (k = 2, 3, 4; correlation 0.5, 0.9; undeclared and declared) at
      n = 300, 1000, 3000 runs, budget 1e-2, the default and every named form on both paths;
    * duplicates (n = 450: 150 cases x 3, and 3000) at 1e-2: default and ``form=None``;
    * 10 pooled groups of 30 and 100 runs (1e-2) and 300 runs (1e-3), default form, both paths;
    * one op with twice the light law's error among nine light ones, 30 runs each (1e-2),
      default form, both paths, ``on_error="skip"`` (the noisier op is refused; a light one,
      ``mm1``, is checked).

    Refusal cells (n below what a budget allows) are kept: they must be refused.
    """
    vec = use_check_runs(vectorised)
    if fresh_per_calibration is None:
        fresh_per_calibration = not vec
    if fresh_factor is None:
        fresh_factor = 100.0 if vec else 20.0
    out: list[Batch] = []
    kw = dict(reps=reps, fresh_factor=fresh_factor, fresh_per_calibration=fresh_per_calibration)
    for f in BASE_FAMILIES:
        for n in (30, 100, 300, 1000, 3000):
            out.append(Batch(f, "plain", n, (1e-2, 1e-3), FORMS["plain"], **kw))
            out.append(Batch(f, "operator", n, (1e-2, 1e-3), FORMS["operator"], **kw))
    for f in CLUSTER_FAMILIES:
        for n in (300, 1000, 3000):
            out += [Batch(f, p, n, (1e-2,), FORMS[p], **kw) for p in ("plain", "operator")]
    for n in (450, 3000):
        out.append(Batch("duplicates_x3", "plain", n, (1e-2,), ("default", "none"), **kw))
        out.append(Batch("duplicates_x3", "operator", n, (1e-2,), ("default",), **kw))
    for n, b in ((30, 1e-2), (100, 1e-2), (300, 1e-3)):
        out += [Batch("pooled10_light", p, n, (b,), ("default",), **kw) for p in ("plain", "operator")]
    out += [Batch("pooled10_one_noisier", p, 30, (1e-2,), ("default",), on_error="skip", **kw)
            for p in ("plain", "operator")]
    return out


def quick_batches(vectorised: bool | None = None) -> list[Batch]:
    """A few-minute subset of the grid (``promise_table.py --quick``): 12 calibrations, M = 10 / a.

    Fresh sets as in :func:`full_batches`: one per calibration when decided per pair (a
    shared set of 1000 put ``pooled10_light/plain`` "over limit" at 3/12 violations, mean FP
    0.0073, where a shared set of 20000 gave 1/12, mean FP 0.0049, for the same tables).
    """
    kw = dict(reps=12, fresh_factor=10.0, fresh_per_calibration=not use_check_runs(vectorised))
    return [
        Batch("light", "plain", 300, (1e-2,), FORMS["plain"], **kw),
        Batch("light", "plain", 1000, (1e-2, 1e-3), ("default",), **kw),
        Batch("light", "operator", 300, (1e-2,), FORMS["operator"], **kw),
        Batch("heavy_t2", "operator", 300, (1e-2,), ("default",), **kw),
        Batch("lattice_bf16", "plain", 300, (1e-2,), ("default", "none"), **kw),
        Batch("rare2pct_10x", "operator", 300, (1e-2,), ("default",), **kw),
        Batch("clustered_k3_c0.9", "operator", 900, (1e-2,), ("default",), **kw),
        Batch("clustered_k3_c0.9_declared", "operator", 1200, (1e-2,), ("default",), **kw),
        Batch("duplicates_x3", "plain", 450, (1e-2,), ("default", "none"), **kw),
        Batch("pooled10_light", "plain", 30, (1e-2,), ("default",), **kw),
        Batch("pooled10_light", "operator", 30, (1e-2,), ("default",), **kw),
    ]


def cell_names(batches: Iterable[Batch]) -> list[str]:
    return [c for b in batches for c in b.cells()]


def select_cells(batches: Iterable[Batch], patterns: Sequence[str] | None) -> list[tuple[Batch, list[str]]]:
    """Batches with their cells matching any of the glob ``patterns`` (all when ``None``)."""
    out = []
    for b in batches:
        names = [c for c in b.cells() if not patterns or any(fnmatch.fnmatchcase(c, p) for p in patterns)]
        if names:
            out.append((b, names))
    return out


# --------------------------------------------------------------------------- reporting
def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.1f}"


def markdown_table(results: Sequence[CellResult]) -> str:
    """The Markdown table of cells (one row per cell)."""
    rows = ["| cell | form | n | budget | calibrations | refused % | expected | violation % | limit 1-g+2se | "
            "inflation | sig. viol. % | mean FP | max FP | M (fresh set) | errors | ok |",
            "|" + "---|" * 16]
    for c in results:
        lim = "-" if not c.accepted else f"{100 * c.limit:.1f}"
        if c.significant_break:
            ok = "**NO** (error)" if c.errors else f"**NO** (promise, p={c.p_excess:.1g})"
        elif not c.as_expected:
            ok = "**NO** (refusals)"
        else:
            ok = "yes" if c.keeps_promise else f"over limit, p={c.p_excess:.2g}"
        rows.append(f"| {c.family}/{c.path} | {c.form} | {c.n} | {c.budget:g} | {c.reps} | {_pct(c.refusal_rate)} | "
                    f"{c.expect} | "
                    f"{_pct(c.violation_rate)} | {lim} | {100 * c.inflation:.1f} | {_pct(c.violation_rate_sig)} | "
                    f"{'-' if not c.fps else f'{c.mean_fp:.2e}'} | {'-' if not c.fps else f'{c.max_fp:.2e}'} | "
                    f"{c.fresh} {'shared' if c.fresh_shared else 'each'} | {c.errors} | {ok} |")
    return "\n".join(rows)


def results_json(results: Sequence[CellResult], **meta: Any) -> str:
    """JSON of the cells (NaN as null)."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean({**meta, "cells": [c.to_dict() for c in results]}), indent=1)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
