"""Certificates of the certified engine: what each group's threshold promises.

:class:`GroupCertificate` (one group's threshold on the combined score, its promise stated
exactly, and the numbers behind it), the text of the order-statistic promise, and the
state of one :func:`tolstat.calibration.engine.certify` call (``_Ctx``) whose ``_finish``
applies the resolution floor, flags statistics that cannot reach the threshold
(:class:`UnreachableThresholdWarning`) and records the certificate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from tolstat._base.util import NotEnoughData
from tolstat.measure.noise import MID_SUFFIX, SCORE_CORE, combined_score
from tolstat.models.estimators.orderstat import (
    conformal_min_n,
    conformal_rank,
    order_statistic_min_n,
    order_statistic_rank,
)

__all__ = [
    "TOP_SCORES",
    "score_member",
    "UnreachableThresholdWarning",
    "GroupCertificate",
    "OPERATOR_COVARIATES",
    "check_table_certificate",
]

#: calibration scores kept per group (largest first) for re-budgeting
TOP_SCORES = 256


class UnreachableThresholdWarning(UserWarning):
    """A threshold at or above the largest value a statistic can take (it can never fail)."""


@dataclass(frozen=True)
class GroupCertificate:
    """Threshold of one group on the combined score, and exactly what it promises.

    Attributes
    ----------
    group : str
    threshold : float
        A run fails when ``combined_score(stats, normalisers) > threshold``.
    method : str
        ``"order_statistic"`` (PAC, own units), ``"pooled_order_statistic"`` (PAC if the
        group is exchangeable with its pool), ``"exact"`` (all units exactly zero: the
        resolution floor, no probabilistic promise) or ``"conformal"`` (marginal).
    guarantee : str
        The promise, stated exactly with its assumptions.
    fp_budget, confidence : float
    normalisers : dict str -> float
        ``q_j`` of the statistics in the score.
    floor : float
        Resolution floor on ``S`` (``max_j floor_j / q_j``); the threshold is at least this.
    n_runs, n_units, n_duplicates : int
        Runs given, independent units after collapsing, duplicate runs dropped.
    n_clusters : int or None
    n_fit, n_cal : int
        Units of the fitting part A and the calibration part B.
    rank, n_scores : int
        The threshold is the ``rank``-th smallest of ``n_scores`` scores (0 for ``exact``).
    pool : tuple of str
        Groups whose scores were pooled (empty when the group's own units sufficed).
    pool_p : float
        Holm-adjusted p-value of the group's exchangeability test (NaN if not tested).
    reason : str
        Why this method, with the numbers.
    flags : tuple of str
        ``"floor_raised"`` (the floor lifted the threshold), ``"unreachable:<stat>"`` (the
        statistic cannot reach the threshold), ``"never_fails"`` (no statistic can),
        ``"weakly_tested"`` (a pooled group tested on fewer than ``min_test_units`` scores).
    unreachable : tuple of str
        Statistics whose known maximum is at or below their share of the threshold.
    """

    group: str
    threshold: float
    method: str
    guarantee: str
    fp_budget: float
    confidence: float
    normalisers: dict[str, float]
    floor: float
    n_runs: int
    n_units: int
    n_duplicates: int
    n_clusters: int | None
    n_fit: int
    n_cal: int
    rank: int
    n_scores: int
    pool: tuple[str, ...] = ()
    pool_p: float = math.nan
    reason: str = ""
    flags: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    #: the largest calibration scores (at most :data:`TOP_SCORES`, descending) of an
    #: ``order_statistic`` group: what a smaller budget's threshold needs (re-budgeting)
    top_scores: tuple[float, ...] = ()

    def score(self, stats: Mapping[str, Any], *, which: bool = False) -> Any:
        """:func:`~tolstat.measure.noise.combined_score` with this group's normalisers."""
        return combined_score(stats, self.normalisers, which=which)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly dict of every field (tuples as lists)."""
        d = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def passes(self, stats: Mapping[str, Any]) -> np.ndarray:
        """True where a run's combined score is within the threshold (NaN score passes)."""
        s = self.score(stats)
        return ~(s > self.threshold)


#: run covariates an operator-form check reads from a certificate's ``covariates``
OPERATOR_COVARIATES = ("K",)

# The typed form of a table group's certificate: the fields of GroupCertificate that the
# table keeps there (group, threshold, budget and top scores live in the table itself), and
# those the score forms add (forms.certified_groups, selection._select_group). Fields not
# listed are kept as they are (they change no decision).
_CERT_STR = ("form", "form_reason", "method", "guarantee", "reason", "group", "magnitude")
_CERT_BOOL = ("rowwise", "needs_magnitude")
_CERT_COUNT = ("n_runs", "n_units", "n_duplicates", "n_fit", "n_cal", "rank", "n_needed")
_CERT_OPT_COUNT = ("n_clusters", "n_scores", "n_elements_max", "rows_max")
_CERT_NAMES = ("flags", "unreachable", "member_of")


def pool_ref(pool: Sequence[str], cache: dict[int, tuple[Any, dict[str, Any]]] | None = None) -> dict[str, Any]:
    """How a table certificate names a pool: ``{"id": "pool:<sha256 of the sorted members,
    16 hex>", "size": <members>}``; the member groups' certificates list the id under
    ``member_of``. ``cache`` (kept by the caller for one table) holds the refs of pool
    objects already seen, so the groups of one pool, which share the object, cost one
    digest."""
    hit = None if cache is None else cache.get(id(pool))
    if hit is not None and hit[0] is pool:
        return dict(hit[1])
    text = json.dumps(sorted(str(m) for m in pool), separators=(",", ":"))
    ref = {"id": "pool:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], "size": len(pool)}
    if cache is not None:
        cache[id(pool)] = (pool, ref)  # the pool is kept with its ref: its id cannot be reused meanwhile
    return dict(ref)


def _check_pool(v: Any) -> None:
    """A certificate's ``pool``: a list of member names (tables written before pools were
    referenced) or :func:`pool_ref`'s ``{"id", "size"}``."""
    if isinstance(v, list):
        if not all(isinstance(x, str) for x in v):
            raise ValueError(f"certificate pool must be a list of names or {{'id', 'size'}}, got {v!r}")
        return
    if not (isinstance(v, Mapping) and set(v) == {"id", "size"} and isinstance(v["id"], str)
            and v["id"].startswith("pool:") and not isinstance(v["size"], bool) and isinstance(v["size"], int)
            and v["size"] >= 1):
        raise ValueError(f"certificate pool must be a list of names or {{'id': 'pool:<hex>', 'size': n >= 1}}, "
                         f"got {v!r}")


def _cert_number(field_name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"certificate {field_name}: expected a number, got {v!r}")
    return float(v)


def score_member(name: str, op: str) -> bool:
    """True for a statistic the combined score of ``op`` may hold (:func:`score_statistic_names`;
    an ``inv_*`` invariant may be registered after the table is read)."""
    base = name[: -len(MID_SUFFIX)] if name.endswith(MID_SUFFIX) else name
    return base in SCORE_CORE or (base.startswith("inv_") and len(base) > 4)


def _check_normalisers(q: Any, *, op: str, statistic: str, score: bool) -> None:
    if not isinstance(q, Mapping) or not q:
        raise ValueError(f"certificate normalisers must be a non-empty object {{statistic: q}}, got {q!r}")
    for k, v in q.items():
        if score and not score_member(str(k), op):
            raise ValueError(f"certificate normalisers: {k!r} is not a statistic of the combined score of {op} "
                             f"(known: {', '.join(SCORE_CORE)}, their {MID_SUFFIX!r} forms and the op's inv_* "
                             "invariants)")
        if not score and k != statistic:
            raise ValueError(f"certificate normalisers name {k!r}, not the group's statistic {statistic!r}")
        f = _cert_number(f"normalisers[{k!r}]", v)
        if not (math.isfinite(f) and f > 0):
            raise ValueError(f"certificate normalisers[{k!r}] must be finite and > 0, got {v!r}")


def check_table_certificate(cert: Any, *, op: str, statistic: str, certified: bool) -> None:
    """Validate one table group's certificate against its typed form.

    Every field that changes a decision is checked: ``normalisers`` (required by a
    certified group of a combined-score statistic; finite and > 0; named statistics of the
    op's combined score, or the group's own statistic for the one-statistic forms),
    ``rowwise`` and ``needs_magnitude`` (booleans), ``covariates`` (a list of
    :data:`OPERATOR_COVARIATES`), ``n_scores`` (the count re-budgeting uses), ``form``
    (``"operator"`` exactly for a combined-score statistic); the other fields of
    :class:`GroupCertificate` by their types.

    Parameters
    ----------
    cert : object
        The certificate as read (a JSON object).
    op : str
        The group's op (which invariants its score may hold).
    statistic : str
        The group's max-error statistic (``op_score``, ``max_score``, ``max_abs``, ...).
    certified : bool
        The group has a threshold (a refused group's certificate has no normalisers).

    Raises
    ------
    ValueError
        ``"certificate <field> ..."``: the field, the value and what is allowed.
    """
    from tolstat.models.statistics import get as get_statistic

    if not isinstance(cert, Mapping):
        raise ValueError(f"certificate must be an object, got {type(cert).__name__}")
    score = get_statistic(statistic).kind == "score"
    for k in _CERT_STR:
        if k in cert and not isinstance(cert[k], str):
            raise ValueError(f"certificate {k} must be a string, got {cert[k]!r}")
    if "cluster" in cert and not (cert["cluster"] is None or isinstance(cert["cluster"], str)):
        raise ValueError(f"certificate cluster must be a run label name or null, got {cert['cluster']!r}")
    for k in _CERT_BOOL:
        if k in cert and not isinstance(cert[k], bool):
            raise ValueError(f"certificate {k} must be true or false, got {cert[k]!r}")
    for k in _CERT_COUNT + _CERT_OPT_COUNT:
        v = cert.get(k)
        if k in cert and not (v is None and k in _CERT_OPT_COUNT):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"certificate {k} must be an integer >= 0, got {v!r}")
    if cert.get("rows_max") == 0:
        raise ValueError("certificate rows_max must be >= 1 (an output has at least one row), got 0")
    for k in _CERT_NAMES:
        if k in cert and not (isinstance(cert[k], list) and all(isinstance(x, str) for x in cert[k])):
            raise ValueError(f"certificate {k} must be a list of names, got {cert[k]!r}")
    if "pool" in cert:
        _check_pool(cert["pool"])
    if "covariates" in cert:
        cov = cert["covariates"]
        if not (isinstance(cov, list) and all(isinstance(x, str) for x in cov)):
            raise ValueError(f"certificate covariates must be a list of names, got {cov!r}")
        unknown = [x for x in cov if x not in OPERATOR_COVARIATES]
        if unknown:
            raise ValueError(f"certificate covariates: unknown covariate {unknown[0]!r} (an operator-form check "
                             f"reads {', '.join(map(repr, OPERATOR_COVARIATES))})")
    if "floor" in cert:
        f = _cert_number("floor", cert["floor"])
        if not (math.isfinite(f) and f >= 0):
            raise ValueError(f"certificate floor must be finite and >= 0, got {cert['floor']!r}")
    if cert.get("pool_p") is not None:
        p = _cert_number("pool_p", cert["pool_p"])
        if not (0.0 <= p <= 1.0 or math.isnan(p)):
            raise ValueError(f"certificate pool_p must lie in [0, 1] or be null, got {cert['pool_p']!r}")
    if "units" in cert and not isinstance(cert["units"], Mapping):
        raise ValueError(f"certificate units must be an object, got {cert['units']!r}")
    form = cert.get("form")
    if form is not None and score != (form == "operator"):
        want = "form 'operator'" if score else "not the operator form"
        raise ValueError(f"certificate form {form!r} does not match the group's statistic {statistic!r} ({want})")
    if "normalisers" in cert:
        _check_normalisers(cert["normalisers"], op=op, statistic=statistic, score=score)
    elif score and certified:
        raise ValueError(f"certificate has no 'normalisers' (the normalisers q_j of the combined score "
                         f"{statistic} = max_j T_j / q_j are needed to check the group)")


def _guarantee_pac(a: float, g: float, n: int, r: int, *, clusters: bool) -> str:
    unit = "cluster (declared clusters are one unit each)" if clusters else "run"
    return (f"PAC: with probability >= {g:g} over the calibration units, the probability that the "
            f"check of a new correct {unit} fails is <= {a:g}. Assumes the units are independent and "
            f"identically distributed and a new run comes from the same distribution; the threshold is "
            f"the {r}-th smallest of {n} scores, valid at finite n because the normalisers were fitted on "
            "other units (or cannot change the ranks).")


def _max_bound(n: int, g: float) -> float:
    """The budget that the largest of ``n`` independent scores certifies at confidence ``g``:
    ``1 - (1 - g)^(1/n)`` (``P(all n below the (1 - a)-quantile) = (1 - a)^n``)."""
    return float(-math.expm1(math.log1p(-g) / n))


@dataclass
class _Ctx:
    """Shared state of one :func:`~tolstat.calibration.engine.certify` call."""

    a: float
    g: float
    rule: str
    names: tuple[str, ...]
    floors: np.ndarray
    uppers: np.ndarray
    clusters_declared: bool
    seed: int
    norm_quantile: float
    own_pool: bool = False
    accept_outliers: bool = False
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    certs: dict[str, GroupCertificate] = field(default_factory=dict)
    refused: dict[str, NotEnoughData] = field(default_factory=dict)
    _ranks: dict[int, int] = field(default_factory=dict)

    @property
    def nmin(self) -> int:
        p = 1.0 - self.a
        return order_statistic_min_n(p, self.g) if self.rule == "order_statistic" else conformal_min_n(self.a)

    def rank_of(self, k: int) -> int:
        if k not in self._ranks:
            self._ranks[k] = (int(order_statistic_rank(k, 1.0 - self.a, self.g)[0]) if self.rule == "order_statistic"
                              else int(conformal_rank(k, self.a)[0]))
        return self._ranks[k]

    def need(self, d: dict[str, Any]) -> int:
        """Units the group alone would need: B's minimum plus the smallest fitting part (1)."""
        return self.nmin + (0 if d["v"].shape[1] <= 1 else 1)

    def refuse(self, gname: str, msg: str, need: int) -> None:
        u = self.info.get(gname, {}).get("units")
        if u is not None and u.n < u.n_runs:
            msg += (f" ({u.n_runs} runs are only {u.n} independent units: runs that share a reference, a cluster or "
                    "identical statistics are one unit; distinct inputs are needed)")
        self.refused[gname] = NotEnoughData(f"group {gname}: {msg}", n_needed=int(need), group=gname)


#: a threshold more than this many times the next smaller calibration score (or the
#: resolution floor, when larger) is set by a run far beyond the rest (:func:`_outlier_flags`)
OUTLIER_RATIO = 100.0


class OutlierRunWarning(UserWarning):
    """A group's threshold is set by one calibration run far beyond the rest.

    Raised by :func:`tolstat.calibration.engine.certify` (and so by :func:`tolstat.select`)
    when the order statistic that sets a group's threshold is more than
    :data:`OUTLIER_RATIO` times the next smaller calibration score (or the resolution floor);
    the certificate is flagged ``outlier``. ``CertifyOptions(accept_outliers=True)``
    (``SelectOptions(accept_outliers=True)``) accepts such runs: no warning, flag
    ``outlier_accepted``.
    """


def _score_floor(ctx: _Ctx, d: dict[str, Any], q: np.ndarray) -> float:
    """The resolution floor on the combined score of a group (info ``d``) under normalisers ``q``."""
    return float(np.max(ctx.floors[d["active"]] / q))


def _outlier_flags(ctx: _Ctx, gname: str, sorted_scores: np.ndarray, rank: int, floor: float,
                   stat: str | None = None) -> tuple[str, ...]:
    """Flag (and warn about) a threshold set by a run far beyond the rest.

    ``sorted_scores`` ascending, ``rank`` the 1-based rank of the threshold among them,
    ``stat`` the statistic that sets that score (named in the message, for several). The
    threshold is compared with the next smaller score, or the resolution floor where that
    is larger (a lone positive score among correctly rounded runs is no outlier of its own
    kind: it is compared with the floor). Under a continuous law the ratio of the two
    largest of many scores exceeds ``x`` with probability about ``x**-alpha`` for a tail
    of index ``alpha`` (Pareto spacings): 1e-4 at ``x = 100`` for a tail as heavy as
    Student's t with 2 degrees of freedom. A correct kernel's rounding errors are far
    lighter-tailed, so such a gap points at a run that is not a correct run (a failed
    launch, another input distribution, a reference computed differently), or, with
    several statistics, at a normaliser fitted on runs where that statistic was nearly 0.
    """
    if rank < 2 or rank > sorted_scores.size:
        return ()
    top, nxt = float(sorted_scores[rank - 1]), max(float(sorted_scores[rank - 2]), floor)
    if not (nxt > 0.0 and top > OUTLIER_RATIO * nxt):
        return ()
    if ctx.accept_outliers:
        return ("outlier_accepted",)
    by = "" if stat is None else (f" (statistic {stat}; with several statistics the gap may also come from its "
                                  "normaliser, fitted on runs where it was nearly 0: more calibration runs help)")
    warnings.warn(
        f"group {gname}: its threshold {top:.6g} is set by one calibration run {top / nxt:.3g} times the next "
        f"largest score {nxt:.6g} (more than {OUTLIER_RATIO:g} times){by}: a run that far beyond the rest is "
        "rarely a correct run (a failed launch, other inputs, a reference computed differently). Check that run "
        "and drop it, or accept it with SelectOptions(accept_outliers=True) (certify: "
        "CertifyOptions(accept_outliers=True)); the certificate is flagged 'outlier'",
        OutlierRunWarning, stacklevel=4)
    return ("outlier",)


def _finish(ctx: _Ctx, gname: str, raw: float, method: str, guarantee: str, q: np.ndarray, an: tuple[str, ...],
            rank: int, n_scores: int, reason: str, pool: tuple[str, ...] = (), pool_p: float = math.nan,
            split: tuple[int, int] | None = None, extra_flags: tuple[str, ...] = (),
            top: tuple[float, ...] = ()) -> None:
    """Apply the floor, flag unreachable statistics and record the group's certificate."""
    d = ctx.info[gname]
    n_fit, n_cal = split if split is not None else (int(d["iA"].size), int(d["iB"].size))
    act = d["active"]
    s_floor = _score_floor(ctx, d, q)
    thr = max(raw, s_floor)
    flags = list(extra_flags)
    if thr > raw:
        flags.append("floor_raised")
        reason += f"; raised from {raw:.6g} to the resolution floor {s_floor:.6g}"
    up = ctx.uppers[act] / q
    unreach = tuple(nm for nm, uq in zip(an, up) if thr >= uq)
    flags += [f"unreachable:{nm}" for nm in unreach]
    if unreach:
        never = len(unreach) == len(an)
        if never:
            flags.append("never_fails")
        msg = (f"group {gname}: threshold {thr:.6g} on the combined score is at or above the largest value "
               f"that {', '.join(unreach)} can reach ({', '.join(f'{nm}: {uq:.6g}' for nm, uq in zip(an, up) if thr >= uq)}"
               f" after normalisation): {'the check can never fail' if never else 'those statistics can never fail the check'}")
        warnings.warn(msg, UnreachableThresholdWarning, stacklevel=4)
        reason += "; " + msg
    u = d["units"]
    ctx.certs[gname] = GroupCertificate(
        group=gname, threshold=float(thr), method=method, guarantee=guarantee, fp_budget=ctx.a, confidence=ctx.g,
        normalisers={str(nm): float(x) for nm, x in zip(an, q)}, floor=s_floor, n_runs=u.n_runs, n_units=u.n,
        n_duplicates=u.n_duplicates, n_clusters=u.n_clusters, n_fit=n_fit,
        n_cal=n_cal, rank=int(rank), n_scores=int(n_scores), pool=pool, pool_p=pool_p,
        reason=reason, flags=tuple(flags), unreachable=unreach, top_scores=top)
