"""Partial pooling of small groups in the certified engine.

A group with too few calibration units for its own order statistic borrows the scores of
other groups of its pool whose scores are exchangeable with its own: tested (Holm over the
pool's groups), not proved. With shared normalisers (:func:`_pool`) the pool's normalisers
are fitted on the union of its members' fitting parts; with each group's own normalisers
(:func:`_pool_own`) the positive scores, each relative to its group's level, are pooled and
the share of exact runs is bounded per group. Both record their certificates or refusals
in the state of one :func:`tolstat.calibration.engine.certify` call.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping

import numpy as np
from scipy import special as _special
from scipy import stats as _st

from tolstat._base.inference import clopper_pearson_upper, holm
from tolstat.calibration.certificate import _Ctx, _finish, _guarantee_pac, _max_bound, _outlier_flags, _score_floor
from tolstat.calibration.units import fit_normalisers, split_units, unit_scores
from tolstat.models.estimators.orderstat import order_statistic_min_n, order_statistic_rank

__all__ = ["POOL_TAIL_LEVELS", "LEND_MAX_RAISE"]


def _pool_p(x: np.ndarray, rest: np.ndarray) -> float:
    """p-value of "x is exchangeable with rest": three tests, Bonferroni-combined.

    ``3 * min(p_AD, p_MWU, p_tail)`` of the two-sided k-sample Anderson-Darling test (shape
    and tails; scipy floors its p-value at 0.001, so under Holm over ten groups at 0.01 it
    can never refuse by itself), the two-sided Mann-Whitney U test (location; uncapped, so a
    clear shift stays detectable under Holm with many groups) and the one-sided tail-count
    test :func:`_pool_p_shape` (exact, uncapped: a heavier upper tail, where the pooled
    threshold lies; a |t_2| group among |N(0, 1)| groups of 100 units was pooled in 90 % of
    calibrations without it, 4 % with it). 1 without spread.
    """
    both = np.concatenate([x, rest])
    if np.unique(both).size < 2:
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p_ad = float(_st.anderson_ksamp([x, rest]).pvalue)
    p_mw = float(_st.mannwhitneyu(x, rest, alternative="two-sided").pvalue)
    p_tail = _pool_p_shape(x, rest)
    return min(1.0, 3.0 * min(p_ad, p_mw, p_tail))


#: quantiles of the rest of the pool above which :func:`_pool_p_shape` compares tail counts
POOL_TAIL_LEVELS = (0.9, 0.99)

#: how far lent scores may raise a short pool's threshold: at most this factor times the
#: largest score of its exchangeable groups (:func:`_lenders`); beyond it the borrowers are
#: refused, so a far heavier lender never loosens their tolerance more than this
LEND_MAX_RAISE = 2.0


def _pool_p_shape(x: np.ndarray, rest: np.ndarray) -> float:
    """p-value of "the upper tail of ``x`` is no heavier than that of ``rest``" (each group's
    level already removed).

    The pooled threshold lies in the upper tail of the pooled scores, and it keeps a
    group's promise when the group's scores exceed it no more often than the pool's: a
    group whose scores are lighter-tailed or differ only below the tail keeps it with room
    to spare. So the test is one-sided and looks at the tail only: Fisher's exact test of
    the share of ``x`` above each :data:`POOL_TAIL_LEVELS` quantile of ``rest`` against
    the share of ``rest`` there (alternative: larger), Bonferroni-combined,
    ``min(1, k min(p))``. A test of the whole distribution (Kolmogorov-Smirnov) refused
    every corpus operator at 1,500 runs per group, for differences that do not matter to
    the promise. 1 without spread.
    """
    both = np.concatenate([x, rest])
    if np.unique(both).size < 2:
        return 1.0
    ps = []
    for level in POOL_TAIL_LEVELS:
        t = float(np.quantile(rest, level, method="higher"))
        k, kr = int((x > t).sum()), int((rest > t).sum())
        ps.append(float(_st.fisher_exact([[k, x.size - k], [kr, rest.size - kr]], alternative="greater").pvalue))
    return min(1.0, len(ps) * min(ps))


def _pool_fit_sizes(sizes: list[int], n_stats: int, min_fit: int, nmin: int) -> list[int]:
    """Fitting units per pool member: ``min_fit`` in all (fewer, down to 1, when that lets the
    pool reach ``nmin``; none with one statistic), dealt round-robin."""
    kfit = [0] * len(sizes)
    if n_stats <= 1:
        return kfit
    total = sum(sizes)
    tf = min_fit if not (total - min_fit < nmin <= total - 1) else total - nmin
    tf = min(tf, total - len(sizes))
    i = 0
    while sum(kfit) < tf:
        if kfit[i] < sizes[i] - 1:
            kfit[i] += 1
        i = (i + 1) % len(sizes)
    return kfit


def _pool_scores(ctx: _Ctx, members: list[str], cols: list[int], names_union: tuple[str, ...],
                 kfit: list[int]) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
    """Shared normalisers of a pool and each member's pooled scores (and calibration sizes)."""
    fitparts, calparts = {}, {}
    for gn, kA in zip(members, kfit):
        full = ctx.info[gn]["units"].values[:, cols]
        iA, iB = split_units(full.shape[0], kA, ctx.seed)
        fitparts[gn], calparts[gn] = full[iA], full[iB]
    if len(cols) <= 1:
        fitparts = {gn: ctx.info[gn]["units"].values[:, cols] for gn in members}
    qP = np.ones(1) if len(cols) <= 1 else fit_normalisers(
        np.vstack(list(fitparts.values())), quantile=ctx.norm_quantile,
        resolution=dict(zip(names_union, ctx.floors[cols])), names=names_union)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scores = {gn: unit_scores(calparts[gn], qP) for gn in members}
    return qP, scores, {gn: int(calparts[gn].shape[0]) for gn in members}


def _own_positive_scores(ctx: _Ctx, members: list[str], level: float) -> dict[str, np.ndarray]:
    """Each member's positive part-B scores in units of its own level (``pool_normalisers="own"``).

    ``S`` under the member's own normalisers; its positive part-B scores as ``log S - loc``
    with ``loc`` the median of ``log S`` over the member's positive units (both parts, so
    that it is as precise as the group's data allow), stored in ``ctx.info[g]`` with
    ``loc_upper`` (a distribution-free upper confidence bound of that median at ``level``,
    an order statistic; NaN when too few units are positive) and ``n_pos`` (inexact units
    of both parts: whether a score is positive does not depend on the fitted normalisers,
    so every unit informs the share of inexact runs). Zero scores (correctly rounded runs) are left out: how often a group's
    runs are exact differs between operators and is bounded per group (:func:`_pool_own`).
    """
    out = {}
    for gn in members:
        d = ctx.info[gn]
        s_all = unit_scores(d["v"], d["q"])
        lp = np.sort(np.log(s_all[s_all > 0]))
        d["loc"] = float(np.median(lp)) if lp.size else 0.0
        d["loc_upper"] = (float(lp[int(order_statistic_rank(lp.size, 0.5, level)[0]) - 1])
                          if lp.size >= order_statistic_min_n(0.5, level) else math.nan)
        sB = s_all[d["iB"]]
        d["n_pos"] = int((s_all > 0).sum())  # inexact units of both parts: S > 0 does not depend on q
        out[gn] = np.log(sB[sB > 0]) - d["loc"]
    return out


class _RestTests:
    """The pool tests of each member against the rest of its pool, from one sort of the pool.

    :func:`_pool_p` and :func:`_pool_p_shape` of ``(scores[g], rest of the pool)`` for every
    member ``g``, without building the rest: the rest is the pool less the member, so its
    ranks, tie counts, quantiles and the Anderson-Darling sums follow from the sorted pool
    (one sort) and the member's own sorted scores. A member of ``n`` scores costs
    ``O(n log N)`` instead of ``O(N log N)``, so testing every member of a pool of ``G``
    groups is linear in ``G`` (it was quadratic: 1,000 groups of 30 runs took 20 s).

    The statistics are the same as scipy's (``anderson_ksamp`` with midranks, for two
    samples; ``mannwhitneyu`` asymptotic with the tie and continuity corrections;
    ``np.quantile(method="higher")``; ``fisher_exact``) up to floating-point rounding;
    where scipy would use the exact Mann-Whitney distribution (at most 8 scores, no ties)
    the reference functions are called. ``tests/test_pool_rest_tests.py`` compares them.
    """

    def __init__(self, scores: Mapping[str, np.ndarray], members: list[str]) -> None:
        self.scores = {g: np.sort(np.asarray(scores[g], dtype=np.float64)) for g in members}
        self.members = list(members)
        Z = np.sort(np.concatenate([self.scores[g] for g in members])) if members else np.empty(0)
        self.Z, N = Z, int(Z.size)
        self.N = N
        zs, first, cnt = np.unique(Z, return_index=True, return_counts=True)
        self.zs, self.first, self.cnt = zs, first, cnt
        self.cum = first + cnt  # #(Z <= zs[j])
        self.ties = bool((cnt > 1).any())
        self.spread = zs.size >= 2
        if not self.spread or N < 4:
            return
        lj = cnt.astype(np.float64)
        B = first + lj / 2.0
        w = (lj / N) / (B * (N - B) - N * lj / 4.0)
        self.B, self.w = B, w
        ld = np.longdouble
        self.W = np.concatenate([[0.0], np.cumsum(w.astype(ld))])
        self.WB = np.concatenate([[0.0], np.cumsum((w * B).astype(ld))])
        self.WB2 = np.concatenate([[0.0], np.cumsum((w * B * B).astype(ld))])
        self.avg_rank = first + (lj + 1.0) / 2.0  # 1-based average rank of each distinct value
        self.tie_term = float(np.sum(lj ** 3 - lj))
        # the normalisation of scipy's k-sample Anderson-Darling statistic (k = 2) depends on N only
        hs_cs = (1.0 / np.arange(N - 1, 1, -1)).cumsum()
        self.h = float(hs_cs[-1] + 1)
        self.g = float((hs_cs / np.arange(2, N)).sum())
        b0 = np.array([0.675, 1.281, 1.645, 1.96, 2.326, 2.573, 3.085])
        b1 = np.array([-0.245, 0.25, 0.678, 1.149, 1.822, 2.364, 3.615])
        b2 = np.array([-0.105, -0.305, -0.362, -0.391, -0.396, -0.345, -0.154])
        self.critical = b0 + b1 + b2  # m = k - 1 = 1
        self.sig = np.array([0.25, 0.1, 0.05, 0.025, 0.01, 0.005, 0.001])
        self.pf = np.polyfit(self.critical, np.log(self.sig), 2)

    def rest(self, gn: str) -> np.ndarray:
        """The rest of the pool for ``gn`` (the reference path; ``O(N)``)."""
        return np.concatenate([self.scores[h] for h in self.members if h != gn])

    # ---- the three tests of _pool_p
    def _ad(self, x: np.ndarray) -> float:
        N, n1 = self.N, x.size
        n2 = N - n1
        u, fu = np.unique(x, return_counts=True)
        p = np.searchsorted(self.zs, u)
        C = np.cumsum(fu).astype(np.float64)  # count of x through u_i
        Cb = C - fu
        # the distinct pool values equal to a score of x: M = #(x < z) + #(x == z) / 2
        Mp = Cb + fu / 2.0
        total = float(np.sum(self.w[p] * (N * Mp - n1 * self.B[p]) ** 2))
        # runs of distinct pool values strictly between the scores of x: M constant
        lo = np.concatenate([[0], p + 1])
        hi = np.concatenate([p, [self.zs.size]])
        c = np.concatenate([[0.0], C])
        keep = hi > lo
        lo, hi, c = lo[keep], hi[keep], c[keep].astype(np.longdouble)
        seg = (N * N * c * c * (self.W[hi] - self.W[lo]) - 2 * N * c * n1 * (self.WB[hi] - self.WB[lo])
               + n1 * n1 * (self.WB2[hi] - self.WB2[lo]))
        total += float(np.sum(seg))
        A2kN = total * (1.0 / n1 + 1.0 / n2) * (N - 1.0) / N
        H, h, g, k = 1.0 / n1 + 1.0 / n2, self.h, self.g, 2
        a = (4 * g - 6) * (k - 1) + (10 - 6 * g) * H
        b = (2 * g - 4) * k ** 2 + 8 * h * k + (2 * g - 14 * h - 4) * H - 8 * h + 4 * g - 6
        cc = (6 * h + 2 * g - 2) * k ** 2 + (4 * h - 4 * g + 6) * k + (2 * h - 6) * H + 4 * h
        d = (2 * h + 6) * k ** 2 - 4 * h * k
        sigmasq = (a * N ** 3 + b * N ** 2 + cc * N + d) / ((N - 1.0) * (N - 2.0) * (N - 3.0))
        A2 = (A2kN - 1) / math.sqrt(sigmasq)
        if A2 < self.critical.min():
            return float(self.sig.max())
        if A2 > self.critical.max():
            return float(self.sig.min())
        return math.exp(float(np.polyval(self.pf, A2)))

    def _mw(self, x: np.ndarray) -> float:
        N, n1 = self.N, x.size
        n2 = N - n1
        u, fu = np.unique(x, return_counts=True)
        R1 = float(np.sum(self.avg_rank[np.searchsorted(self.zs, u)] * fu))
        U1 = R1 - n1 * (n1 + 1) / 2.0
        U = max(U1, n1 * n2 - U1)
        s = math.sqrt(n1 * n2 / 12.0 * ((N + 1) - self.tie_term / (N * (N - 1.0))))
        z = (U - n1 * n2 / 2.0 - 0.5) / s if s > 0 else math.inf
        return min(1.0, max(0.0, 2.0 * float(_special.ndtr(-z))))

    def _rest_higher(self, x: np.ndarray, level: float) -> float:
        """``np.quantile(rest, level, method="higher")`` of the rest of the pool for ``x``."""
        M = self.N - x.size
        i = min(M - 1, int(math.ceil(level * (M - 1))))
        lo, hi = 0, self.zs.size - 1  # smallest j with #(rest <= zs[j]) >= i + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cum[mid] - np.searchsorted(x, self.zs[mid], side="right") >= i + 1:
                hi = mid
            else:
                lo = mid + 1
        return float(self.zs[lo])

    def shape_p(self, gn: str, extreme: bool = False) -> float:
        """:func:`_pool_p_shape` of ``gn``'s scores against the rest (``extreme``: of as many
        scores above every score of the rest, for :func:`_can_refuse`)."""
        x = self.scores[gn]
        M = self.N - x.size
        if M < 1:
            return _pool_p_shape(x, self.rest(gn))
        if not self.spread and not extreme:
            return 1.0
        ps = []
        for level in POOL_TAIL_LEVELS:
            t = self._rest_higher(x, level)
            k_own = int(x.size - np.searchsorted(x, t, side="right"))
            kr = int(self.N - self.cum[int(np.searchsorted(self.zs, t))]) - k_own
            k = x.size if extreme else k_own  # extreme: every score above all of the rest
            ps.append(float(_st.fisher_exact([[k, x.size - k], [kr, M - kr]], alternative="greater").pvalue))
        return min(1.0, len(ps) * min(ps))

    def pool_p(self, gn: str) -> float:
        """:func:`_pool_p` of ``gn``'s scores against the rest of the pool."""
        x = self.scores[gn]
        if not self.spread:
            return 1.0
        n2 = self.N - x.size
        if x.size == 0 or n2 < 1 or self.N < 4 or (x.size <= 8 and not self.ties) or n2 <= 8:
            return _pool_p(x, self.rest(gn))  # scipy's exact or degenerate cases
        return min(1.0, 3.0 * min(self._ad(x), self._mw(x), self.shape_p(gn)))


def _can_refuse(x: np.ndarray, rest: np.ndarray, test: Any, n_tests: int, pool_alpha: float) -> bool:
    """Whether ``test`` could refuse ``x.size`` scores at ``pool_alpha`` after Holm over
    ``n_tests`` groups: its p-value when every score lies above all of ``rest`` (the most
    extreme sample of that size), times ``n_tests`` (Holm's first step), is at most ``pool_alpha``."""
    if x.size == 0 or rest.size == 0:
        return False
    return n_tests * test(np.full(x.size, float(np.max(rest)) + 1.0), rest) <= pool_alpha


def _pool_members(scores: Mapping[str, np.ndarray], members: list[str], test: Any, min_test_units: int,
                  pool_alpha: float, few: bool = False) -> tuple[dict[str, float], list[str]]:
    """Holm-adjusted p-values of ``test(member's scores, rest of the pool)`` for the members
    with at least ``min_test_units`` scores (``few``: or fewer, when the test could still
    refuse them, :func:`_can_refuse`), and the members not rejected at ``pool_alpha``.

    ``test`` is :func:`_pool_p` or :func:`_pool_p_shape`; both are computed against the
    rest of the pool by :class:`_RestTests` (linear in the number of members)."""
    rt = _RestTests(scores, members)
    fast = rt.pool_p if test is _pool_p else rt.shape_p if test is _pool_p_shape else None

    def p_of(gn: str) -> float:
        return fast(gn) if fast is not None else test(scores[gn], rt.rest(gn))

    def could_refuse(gn: str) -> bool:
        if scores[gn].size == 0 or rt.N - scores[gn].size == 0:
            return False
        if test is _pool_p_shape:
            return len(members) * rt.shape_p(gn, extreme=True) <= pool_alpha
        return _can_refuse(scores[gn], rt.rest(gn), test, len(members), pool_alpha)

    testable = [gn for gn in members if scores[gn].size >= min_test_units or (few and could_refuse(gn))]
    raw_p = np.array([p_of(gn) for gn in testable])
    adj = dict(zip(testable, holm(raw_p)))
    return adj, [gn for gn in members if gn in adj and adj[gn] > pool_alpha]


def _pool_own(ctx: _Ctx, members: list[str], need_here: list[str], *, min_pool: int, min_test_units: int,
              pool_alpha: float) -> None:
    """Pooled thresholds of a pool of different operators (``pool_normalisers="own"``).

    A new run of group ``g`` fails when its score is positive and, given that, beyond the
    threshold: ``P(fail) = pi_g * P(S > t | S > 0)``. ``pi_g`` (the share of inexact runs)
    differs between operators and is bounded from all the group's own units (Clopper-Pearson,
    one-sided). The positive scores, each group's relative to its own median level
    (:func:`_own_positive_scores`), are pooled and tested for exchangeability
    (:func:`_pool_p_shape`, Holm); the threshold is ``exp(loc_upper + t)``, with ``t`` the
    pooled order statistic at the conditional budget ``fp_budget / pi_upper`` and
    ``loc_upper`` an upper confidence bound of the group's median level (its estimate
    from few units would otherwise shift the group against the pool). The three bounds
    each hold with probability ``1 - (1 - confidence) / 3``, together with probability
    ``>= confidence`` (union bound), and then ``P(fail) <= pi_upper * fp_budget / pi_upper``.
    A group with fewer than ``min_test_units`` positive scores in B is tested on them when
    the test could refuse it (:func:`_can_refuse`); its threshold is then at least its own
    largest part-B score, so its rate is at most ``_max_bound``
    (:mod:`tolstat.calibration.certificate`) whatever its tail.
    Shown by simulation in ``tests/test_certify_own_pool_sim.py``.
    """
    a, g = ctx.a, ctx.g
    third = (1.0 - g) / 3.0
    scores = _own_positive_scores(ctx, members, 1.0 - third)
    adj, ok = _pool_members(scores, members, _pool_p_shape, min_test_units, pool_alpha, few=True)
    pooled = np.sort(np.concatenate([scores[gn] for gn in ok])) if ok else np.empty(0)
    pool = tuple(ok)
    for s in need_here:
        d = ctx.info[s]
        nB, nU, k = int(d["iB"].size), int(d["units"].n), int(d["n_pos"])
        pi_u = clopper_pearson_upper(k, nU, 1.0 - third)
        a_c = min(1.0, a / pi_u)
        if a_c < 1.0 and _pool_refusal(ctx, s, adj, pooled, ok, min_pool, min_test_units, pool_alpha,
                                       need_n=order_statistic_min_n(1.0 - a_c, 1.0 - third)):
            continue
        if a_c >= 1.0:
            t, r, thr = -math.inf, 0, 0.0
        else:
            if not math.isfinite(d["loc_upper"]):
                ctx.refuse(s, f"{nB} calibration units < {ctx.nmin} needed, and too few inexact units to bound "
                           "its level for pooling", ctx.need(d))
                continue
            r = int(order_statistic_rank(pooled.size, 1.0 - a_c, 1.0 - third)[0])
            t = float(pooled[r - 1])
            thr = math.exp(d["loc_upper"] + t)
        weak, own_max = "", ""
        if a_c < 1.0 and scores[s].size < min_test_units:
            # few inexact units: the test refuses only a far heavier tail, so the threshold is
            # at least the group's own largest calibration score, whose promise needs no pool
            s_own = float(unit_scores(d["v"], d["q"], d["iB"]).max())
            if s_own > thr:
                thr, own_max = s_own, f"; raised to its own largest calibration score {s_own:.6g}"
            weak = (f" The test ran on only {scores[s].size} positive scores (fewer than min_test_units = "
                    f"{min_test_units}): it refuses only a tail far heavier than the pool's. Whatever its tail, the "
                    f"threshold is at least the largest of the group's own {nB} calibration scores (independent "
                    f"of its normalisers), so with probability >= {g:g} the rate is <= "
                    f"{_max_bound(nB, g):.3g} (distribution-free: the largest of {nB} independent units).")
        guar = (f"PAC: with probability >= {g:g} over the calibration units, the probability that the check of a "
                f"new correct {'cluster' if ctx.clusters_declared else 'run'} fails is <= {a:g}, as the product of "
                f"the group's share of inexact runs (<= {pi_u:.3g}: Clopper-Pearson bound from {k} of its own {nU} "
                f"units) and the pooled conditional bound at budget {a_c:.3g} (the {r}-th smallest of {pooled.size} "
                f"pooled positive scores, each group's in units of its own median level; the group's level taken "
                f"at an upper confidence bound of its median), three bounds each at confidence {1 - third:.4g} "
                f"(union bound). Assumes independent, identically distributed units, and holds only if the "
                f"group's positive scores, relative to its level, exceed the pooled threshold no more often than "
                f"the pool's: tested (one-sided tail counts above the 0.9 and 0.99 quantiles of the rest of the "
                f"pool, Holm-adjusted p = {adj[s]:.3g} > {pool_alpha:g}), not proved." + weak)
        reason = (f"pooled order statistic: own {nB} calibration units < {ctx.nmin} needed; {k} of its {nU} units "
                  f"inexact; "
                  f"borrowed {pooled.size} positive scores of {len(ok)} exchangeable groups (each with its own "
                  "normalisers and level)"
                  + (f"; tested on only {scores[s].size} positive scores{own_max}" if weak else ""))
        _finish(ctx, s, thr, "pooled_order_statistic", guar, d["q"], d["names"], r, pooled.size, reason,
                pool=pool, pool_p=float(adj[s]), split=(int(d["iA"].size), nB),
                extra_flags=("weakly_tested",) if weak else ())


def _pool(ctx: _Ctx, members: list[str], need_here: list[str], *, min_fit: int, min_pool: int,
          min_test_units: int, pool_alpha: float, own: bool = False) -> None:
    """Pooled thresholds (or refusals) for the small groups ``need_here`` of one pool."""
    a, g, nmin = ctx.a, ctx.g, ctx.nmin
    if len(members) < min_pool:
        for s in need_here:
            ctx.refuse(s, f"{ctx.info[s]['iB'].size} calibration units < {nmin} needed for budget {a:g} at "
                       f"confidence {g:g}, and its pool has {len(members)} group(s) < min_pool = {min_pool}",
                       ctx.need(ctx.info[s]))
        return
    if own:
        _pool_own(ctx, members, need_here, min_pool=min_pool, min_test_units=min_test_units, pool_alpha=pool_alpha)
        return
    names_union = tuple(n_ for n_ in ctx.names if any(n_ in ctx.info[gn]["names"] for gn in members))
    cols = [ctx.names.index(n_) for n_ in names_union]
    kfit = _pool_fit_sizes([ctx.info[gn]["units"].n for gn in members], len(cols), min_fit, nmin)
    qP, scores, ncal = _pool_scores(ctx, members, cols, names_union, kfit)
    adj, ok = _pool_members(scores, members, _pool_p, min_test_units, pool_alpha)
    pooled = np.concatenate([scores[gn] for gn in ok]) if ok else np.empty(0)
    ps = np.sort(pooled)  # once per pool: the members share it
    lenders = _lenders(scores, adj, pooled, pool_alpha) if 0 < pooled.size < nmin else []
    if lenders:
        lent_pool = np.concatenate([pooled] + [scores[gn] for gn in lenders])
        lent_sorted = np.sort(lent_pool)
        # where the lenders' tail sets the threshold far above every score of the
        # exchangeable groups, a far heavier lender would loosen every borrower's tolerance:
        # they are refused instead, as without lenders
        if lent_pool.size >= nmin and (float(lent_sorted[ctx.rank_of(lent_pool.size) - 1])
                                       <= LEND_MAX_RAISE * float(ps[-1])):
            pooled, ps = lent_pool, lent_sorted
        else:
            lenders = []
    pool, member_index = tuple(ok) + tuple(lenders), {gn: i for i, gn in enumerate(members)}
    lent = (f" The exchangeable groups alone had fewer scores than the bound needs; the pool includes the "
            f"scores of {len(lenders)} group(s) rejected for higher scores ({', '.join(lenders)}; refused "
            "themselves), which can only raise this threshold if their upper tail is at least as heavy as the "
            "pool's: checked on their sample (their share of scores above the pool's 0.9 and 0.99 quantiles is "
            "at least the pool's), not proved.") if lenders else ""
    for s in need_here:
        if _pool_refusal(ctx, s, adj, pooled, ok, min_pool, min_test_units, pool_alpha):
            continue
        d = ctx.info[s]
        r = ctx.rank_of(pooled.size)
        thr = float(ps[r - 1])
        act_names = tuple(n_ for n_ in names_union if n_ in d["names"])
        qg = np.array([qP[names_union.index(n_)] for n_ in act_names])
        guar = (_guarantee_pac(a, g, pooled.size, r, clusters=ctx.clusters_declared)
                + f" Holds for this group only if its scores are exchangeable with the pooled scores of "
                f"{len(ok)} groups: tested (Anderson-Darling, Mann-Whitney and upper-tail counts against the rest of the pool, "
                f"Holm-adjusted "
                f"p = {adj[s]:.3g} > {pool_alpha:g}), not proved." + lent)
        reason = (f"pooled order statistic: own {d['iB'].size} calibration units < {nmin} needed; borrowed "
                  f"{pooled.size} scores of {len(ok)} exchangeable groups (normalisers shared by the pool)"
                  + (f" and of {len(lenders)} group(s) rejected for higher scores" if lenders else ""))
        odd = _outlier_flags(ctx, s, ps, r, _score_floor(ctx, d, qg))
        _finish(ctx, s, thr, "pooled_order_statistic", guar, qg, act_names, r, pooled.size, reason,
                pool=pool, pool_p=float(adj[s]), split=(int(kfit[member_index[s]]), ncal[s]), extra_flags=odd)


def _lenders(scores: Mapping[str, np.ndarray], adj: Mapping[str, float], pooled: np.ndarray,
             pool_alpha: float) -> list[str]:
    """The members rejected from a shared-normaliser pool (Holm-adjusted ``p <= pool_alpha``)
    whose scores may still lend to the others: those whose share of scores above each
    :data:`POOL_TAIL_LEVELS` quantile of the exchangeable groups' ``pooled`` scores is at
    least the pool's own share there (``method="higher"``, as :func:`_pool_p_shape`).

    Called only when the exchangeable groups have fewer scores than the order statistic
    needs. Why the lent scores keep the others' promise: the others' threshold is the
    ``r``-th largest pooled score, and it falls below their ``(1 - a)`` quantile ``q`` only
    when fewer than ``r`` pooled scores reach ``q``. The count of those is a sum of
    binomials; a lender whose scores reach ``q`` at least as often as the others' (an upper
    tail at least as heavy) can only make it larger, so the order statistic's bound holds
    as for exchangeable scores. A lender with a lighter tail could lower it, so lenders are
    only members whose observed tail shares point upward; that is checked on the sample,
    not proved. Under exchangeability (a member rejected by chance, at rate ``pool_alpha``)
    the pooled scores are exchangeable whatever was rejected. A lender itself is refused:
    its heavier tail is what the test saw. :func:`_pool` lends only where the threshold
    stays within :data:`LEND_MAX_RAISE` times the largest score of the exchangeable groups
    (lending in some calibrations only keeps the bound: it can only remove violations), so
    a far heavier lender does not loosen the borrowers' tolerance by more than that.
    """
    if pooled.size == 0:
        return []
    cuts = [float(np.quantile(pooled, lv, method="higher")) for lv in POOL_TAIL_LEVELS]
    shares = [float(np.mean(pooled > t)) for t in cuts]
    out = []
    for gn, p in adj.items():
        x = np.asarray(scores[gn])
        if p <= pool_alpha and x.size and all(np.mean(x > t) >= sh for t, sh in zip(cuts, shares)):
            out.append(gn)
    return out


def _pool_refusal(ctx: _Ctx, s: str, adj: dict[str, float], pooled: np.ndarray, ok: list[str], min_pool: int,
                  min_test_units: int, pool_alpha: float, need_n: int | None = None) -> bool:
    """Refuse ``s`` (and return True) when it cannot borrow from its pool (``need_n``: the
    pooled scores its bound needs, default the order statistic's minimum)."""
    d, a, g, nmin = ctx.info[s], ctx.a, ctx.g, ctx.nmin
    if s not in adj:
        ctx.refuse(s, f"{d['iB'].size} calibration units: fewer than {nmin} for its own threshold and "
                   f"fewer than min_test_units = {min_test_units} {'positive ' if need_n else ''}scores to test "
                   "exchangeability with a pool" + (" (too few for the tail test to be able to refuse it)"
                                                    if need_n else ""), ctx.need(d))
        return True
    if adj[s] <= pool_alpha:
        ctx.refuse(s, f"{d['iB'].size} calibration units < {nmin} needed for budget {a:g} at confidence "
                   f"{g:g}, and its scores "
                   + ("have a heavier upper tail than the pool's (one-sided tail-count" if need_n
                      else "are not exchangeable with the pool (Anderson-Darling, Mann-Whitney and upper-tail count")
                   + f" tests, Holm-adjusted p = {adj[s]:.3g} <= {pool_alpha:g})", ctx.need(d))
        return True
    nmin = nmin if need_n is None else need_n
    if pooled.size < nmin or len(ok) < min_pool:
        ctx.refuse(s, f"{d['iB'].size} calibration units < {nmin} needed; the exchangeable pool has "
                   f"{pooled.size} scores from {len(ok)} groups (need {nmin} scores, {min_pool} groups)", ctx.need(d))
        return True
    return False
