"""The calibration engine of :func:`tolstat.select`: every form certified by one path.

Each form is a *score definition* whose per-run decision values
(:func:`tolstat.calibration.decision.run_values`, the numbers :func:`tolstat.check` compares) go to
:func:`tolstat.calibration.engine.certify` (independent units, split fitting, the order statistic with
its PAC promise, pooling across exchangeable groups, an exact path for exact ops,
resolution floors), never to a tail model:

* ``form="operator"``, and ``form="auto"`` when the error dataset has operator statistics
  (collected with a ``magnitude``, variables with ``role = "op_statistic"``): the combined
  score ``op_score = max_j T_j / q_j`` over :func:`tolstat.measure.noise.score_statistic_names`
  (measured on the corpus: the most bugs caught at the same false-positive rate);
* ``form="auto"`` without them: a noise-scale form per group, chosen on a fitting part A
  of the units: ``allclose`` and ``size_aware`` are each fitted on one half of A and
  scored on the other half; the form whose held-out positive scores have the smaller
  ratio ``p90 / median`` (less slack for a typical run) wins, is refitted on the whole of
  A, and ``max_score`` is certified on the other units. Too few units to spare A: the
  fit-free scale (:meth:`tolstat.models.ScaleModel.fit_free`);
* a named scale form (``allclose``, ``size_aware``, ``normalised``, ``baseline``): the
  same, with that form;
* ``form=None``: the plain statistic, certified as it is.

Units (:func:`tolstat.dataset.schema.run_units`): declared clusters and runs that share a
reference fingerprint are one unit each. Pooling: a table of several operators of the
operator form pools scores in units of each group's own normalisers
(``pool_normalisers="own"``); the one-statistic forms and groups of one operator share the
pool's normalisers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import xarray as xr

from tolstat._base.util import NotEnoughData, factorize, rows_by_code
from tolstat.calibration.certificate import pool_ref
from tolstat.calibration.certificate import GroupCertificate
from tolstat.calibration.engine import CertifyOptions, CertifyResult, certify
from tolstat.calibration.options import SelectOptions
from tolstat.calibration.units import split_units
from tolstat.dataset.schema import SYSTEM_LABELS, RunUnits, label_names, run_units
from tolstat.calibration.decision import run_values
from tolstat.models.estimators.orderstat import order_statistic_min_n
from tolstat.models.scale import ScaleModel, ScaleOptions
from tolstat.measure.noise import ROW_MAXIMA, score_statistic_names
from tolstat.models.statistics import OP_UNIT_FLOOR, dataset_op_statistics, dataset_rows

__all__ = ["CERTIFIED_FORMS", "has_op_statistics", "certified_groups"]

CERTIFIED_FORMS = ("auto", "operator")
_OP_REASON = ("the dataset has operator-noise statistics: combined score over the operator statistics "
              "(docs/noise.md; the most powerful form measured on the corpus)")


def has_op_statistics(ds: xr.Dataset) -> bool:
    """True when the error dataset stores operator statistics (``role = "op_statistic"``)."""
    return any(ds[v].attrs.get("role") == "op_statistic" for v in ds.data_vars)


def _label(key: tuple[str, ...]) -> str:
    return "(" + ", ".join(key) + ")"


def _group_labels(keys: Sequence[tuple[str, ...]], codes: np.ndarray) -> Any:
    """Each run's group label for :func:`~tolstat.calibration.engine.certify`: a
    :class:`pandas.Categorical` of the runs' group codes (grouped by its codes, without
    hashing a label per run)."""
    import pandas as pd  # comes with xarray

    return pd.Categorical.from_codes(np.asarray(codes, dtype=np.int64), categories=[_label(k) for k in keys])


def _engine_units(ds: xr.Dataset, cluster: str | None, codes: np.ndarray) -> tuple[np.ndarray | None, RunUnits]:
    """Unit labels for :func:`tolstat.calibration.engine.certify` (None: every run is its own unit) and the units.

    Units are defined once (:func:`tolstat.dataset.schema.run_units`): a declared cluster and runs
    that share a reference fingerprint (the same inputs) are one unit each.
    """
    u = run_units(ds, cluster, groups=codes)
    if cluster is None and not u.collapsed:
        return None, u
    return u.ids, u


def _runs_with(ds: xr.Dataset, name: str, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group code, how many of its runs have a value (not NaN) of the variable ``name``."""
    have = ~np.isnan(np.asarray(ds[name].values, dtype=np.float64))
    return np.bincount(np.asarray(codes, dtype=np.int64), weights=have, minlength=n_groups)


def _op_names(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The union of score statistics and a (runs, names) mask of those each group uses."""
    present: dict[str, np.ndarray] = {}  # per statistic: how many runs of each group have it
    per_group = []
    for key in keys:
        names = []
        for n in score_statistic_names(key[0]):
            if n in ds and n not in present:
                present[n] = _runs_with(ds, n, codes, len(keys))
            if n in ds and present[n][len(per_group)] > 0:
                names.append(n)
        per_group.append(names)
    union = list(dict.fromkeys(n for names in per_group for n in names))
    if not union:
        raise ValueError("form='operator' needs operator statistics in the error dataset "
                         "(collect / from_pairs with options=CollectOptions(magnitude=...))")
    by_group = np.zeros((len(keys), len(union)), dtype=bool)
    for gi, names in enumerate(per_group):
        by_group[gi, [union.index(n) for n in names]] = True
    return union, by_group[np.asarray(codes, dtype=np.int64)]


def _certify_options(options: SelectOptions, norm_quantile: float, keys: Sequence[tuple[str, ...]],
                     operator: bool = True) -> CertifyOptions:
    # a pool of several operators of the operator form uses each group's own normalisers
    # (operators differ in how their statistics spread, so scores are pooled in units of
    # each group's own spread); groups of one operator (other dtypes or hardware) share the
    # pool's normalisers, and so do the one-statistic forms, whose scores are already in
    # the units of each group's scale (the exchangeability test decides who pools)
    own = operator and len({k[0] for k in keys}) > 1
    return CertifyOptions(seed=options.seed, pooling=options.pooling, norm_quantile=norm_quantile,
                          pool_normalisers="own" if own else "shared", accept_outliers=options.accept_outliers)


def _operator(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, a: float, g: float, *,
              cluster: str | None, options: SelectOptions) -> tuple[CertifyResult, dict, RunUnits]:
    union, use = _op_names(ds, keys, codes)
    raw = dataset_op_statistics(ds, union)
    stats = {n: np.where(use[:, j], raw[n], np.nan) for j, n in enumerate(union)}
    glab = _group_labels(keys, codes)
    floor = {n: (1.0 if n in OP_UNIT_FLOOR else 0.0) for n in union}
    labels, units = _engine_units(ds, cluster, codes)
    opts = _certify_options(options, 1.0, keys)
    res = certify(stats, glab, fp_budget=a, confidence=g, cluster=labels, floor=floor, on_refusal="record",
                  options=opts)
    if res.refused and opts.pool_normalisers == "own":
        res = _shared_fallback(res, certify(stats, glab, fp_budget=a, confidence=g, cluster=labels, floor=floor,
                                            on_refusal="record",
                                            options=dataclasses.replace(opts, pool_normalisers="shared")))
    # per group: how many runs have row statistics
    have = _runs_with(ds, "op_row_rms_max", codes, len(keys)) if "op_row_rms_max" in ds else np.zeros(len(keys))
    rowwise = {_label(key): bool(have[gi] > 0) for gi, key in enumerate(keys)}
    return res, rowwise, units


def _shared_fallback(own: CertifyResult, shared: CertifyResult) -> CertifyResult:
    """Groups of a pool of several operators that the own-normaliser pool refused, pooled
    with shared normalisers where that pool accepts them.

    The own-normaliser pool (each group's scores in units of its own spread, positive
    scores only) suits operators whose statistics spread differently; operators of one law
    (e.g. the same kernel under ten names) have too few positive scores for it and pool
    better on shared normalisers, every score included. Each path tests exchangeability
    (Holm at ``pool_alpha``); a group accepted by the second path had two tests to pass
    one, so its pooled promise rests on exchangeability tested at up to ``2 pool_alpha``
    (stated in its guarantee).
    """
    groups, refused = dict(own.groups), dict(own.refused)
    for gname in list(refused):
        c = shared.groups.get(gname)
        if c is not None and c.method == "pooled_order_statistic":
            note = (" Pooled with shared normalisers after the own-normaliser pool refused it: exchangeability "
                    "was tested twice, so at up to twice pool_alpha.")
            groups[gname] = dataclasses.replace(c, guarantee=c.guarantee + note,
                                                reason=c.reason + "; own-normaliser pool refused: " + str(refused[gname]))
            del refused[gname]
    return dataclasses.replace(own, groups=groups, refused=refused)


def _n_fit(n: int, nmin: int) -> int:
    """Units that fit the scale model: 20 %, 10 to 200; fewer (down to 10) when that keeps
    ``nmin`` units for the order statistic; else 0 (the fit-free scale,
    :meth:`tolstat.models.ScaleModel.fit_free`), so that no group is refused for the fit."""
    k = min(200, max(10, round(0.2 * n)))
    if n - k >= nmin:
        return int(k)
    return int(n - nmin) if n - nmin >= 10 else 0


def _pick_form(fit: xr.Dataset, scale: ScaleOptions, seed: int) -> tuple[str, str]:
    """allclose vs size_aware, both fitted on one half of the fitting runs and scored on the other."""
    n = fit.sizes["run"]
    if n < 4:
        return "allclose", f"allclose: only {n} fitting runs, too few to compare forms"
    i1, i2 = split_units(n, n // 2, seed + 1)
    half1, half2 = fit.isel(run=i1), fit.isel(run=i2)  # cut once for both forms
    spread = {}
    for form in ("allclose", "size_aware"):
        try:
            model = scale.fit(half1, form, seed=seed)
        except (ValueError, np.linalg.LinAlgError) as exc:
            spread[form] = (math.inf, str(exc))
            continue
        s = run_values(half2, "max_score", model)
        s = s[np.isfinite(s) & (s > 0)]  # correctly rounded runs pass every form alike
        med = float(np.median(s)) if s.size else 0.0
        spread[form] = (float(np.quantile(s, 0.9)) / med if med > 0 else math.inf, "")
    best = min(spread, key=lambda f: spread[f][0])
    txt = ", ".join(f"{f}: {v[0]:.3g}" for f, v in spread.items())
    return best, (f"{best}: no operator statistics in the dataset; of the scale forms fitted on half of the "
                  f"fitting runs it had the smallest held-out p90/median of the normalised max error ({txt})")


def _scale_forms(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, a: float, g: float, *,
                 cluster: str | None, options: SelectOptions,
                 form: str = "auto") -> tuple[CertifyResult, dict, RunUnits]:
    """Scale forms: the model fitted on a part A of the units (``form="auto"``: the better of
    allclose and size_aware, chosen on A), ``max_score`` certified on the other units."""
    scale, seed = options.scale, options.seed
    nmin = order_statistic_min_n(1.0 - a, g)
    labels, units = _engine_units(ds, cluster, codes)
    # the scale fits and scores read neither the signed nor the ULP element samples nor the
    # operator statistics: each group's runs are cut out of the dataset without them
    # (nor the run labels but the dtype: the units were drawn above)
    ds = ds.drop_vars([v for v in ds.data_vars if v in ("sample_signed", "sample_ulp")
                       or ds[v].attrs.get("role") == "op_statistic"]
                      + [c for c in (*SYSTEM_LABELS, *label_names(ds)) if c != "dtype" and c in ds.variables])
    models: dict[str, tuple[str, str, Any, int]] = {}
    cal_rows: list[np.ndarray] = []
    scores: list[np.ndarray | None] = []
    free: dict[Any, list[int]] = {}  # fit-free groups per dtype: scored together, in one pass
    for gi, (key, idx) in enumerate(zip(keys, rows_by_code(codes, len(keys)))):
        names, inv = factorize(units.ids[idx])
        iA, _ = split_units(names.size, _n_fit(names.size, nmin), seed)
        inA = np.isin(inv, iA)
        cal_rows.append(idx[~inA])
        if inA.any():
            fit = ds.isel(run=idx[inA])
            fname, why = _pick_form(fit, scale, seed) if form == "auto" else (form, f"{form}: requested")
            model = scale.fit(fit, fname, seed=seed)
            why += f"; fitted on {iA.size} units not used for the threshold"
            scores.append(run_values(ds, "max_score", model, rows=idx[~inA]))
        else:
            fname, model = "fit_free", ScaleModel.fit_free(key[1])
            why = (f"fit_free: {names.size} units, too few to fit a scale and keep {nmin} for the order statistic "
                   "(or for pooling); eps * (|ref| + ref_rms) needs no fitting run, so every unit certifies")
            free.setdefault(key[1], []).append(gi)
            scores.append(None)
        models[_label(key)] = (fname, why, model, int(inA.sum()))
    for dt, gis in free.items():
        rows = np.concatenate([cal_rows[gi] for gi in gis])
        vals = run_values(ds, "max_score", ScaleModel.fit_free(dt), rows=rows)
        for gi, part in zip(gis, np.split(vals, np.cumsum([cal_rows[gi].size for gi in gis])[:-1])):
            scores[gi] = part
    glab = _group_labels(keys, np.repeat(np.arange(len(keys)), [r.size for r in cal_rows]))
    rows_all = np.concatenate(cal_rows) if cal_rows else np.zeros(0, dtype=np.int64)
    res = certify({"max_score": np.concatenate(scores)}, glab,
                  fp_budget=a, confidence=g, cluster=None if labels is None else np.asarray(labels)[rows_all],
                  on_refusal="record", options=_certify_options(options, 0.9, keys, operator=False))
    return res, models, units


def _stat_entry(c: GroupCertificate | None, exc: NotEnoughData | None, a: float, g: float) -> dict[str, Any]:
    if c is None:
        return {"threshold": math.nan, "estimate": math.nan, "budget": a, "confidence": g, "method": "refused",
                "reason": str(exc), "tail": {}, "top_scores": []}
    return {"threshold": c.threshold, "estimate": math.nan, "budget": a, "confidence": g, "method": c.method,
            "reason": c.reason, "tail": {}, "top_scores": list(c.top_scores)}


def _units_record(units: RunUnits, sel: np.ndarray) -> dict[str, Any]:
    """How a group's runs became independent units (the table records it)."""
    ids = units.ids[sel]
    return {"n_runs": int(ids.size), "n_units": int(factorize(ids, sort=False)[0].size), "by": units.by}


def _certificate(c: GroupCertificate | None, exc: NotEnoughData | None, form: str, why: str,
                 refs: dict[int, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"form": form, "form_reason": why}
    if c is None:
        out.update(method="refused", guarantee="none: the group was refused", reason=str(exc),
                   n_needed=int(getattr(exc, "n_needed", 0) or 0))
        return out
    out.update(method=c.method, guarantee=c.guarantee, reason=c.reason, normalisers=dict(c.normalisers),
               floor=c.floor, pool=pool_ref(c.pool, refs) if c.pool else [],
               pool_p=c.pool_p if math.isfinite(c.pool_p) else None,
               flags=list(c.flags), n_runs=c.n_runs, n_units=c.n_units, n_clusters=c.n_clusters,
               n_duplicates=c.n_duplicates, n_fit=c.n_fit, n_cal=c.n_cal, rank=c.rank, n_scores=c.n_scores)
    return out


def _record_pool_members(groups: list[dict[str, Any]], res: CertifyResult, refs: dict[int, Any]) -> None:
    """Add to each group's certificate the pools it lent its scores to (``member_of``).

    A pooled group's certificate names its pool by :func:`pool_ref` (an id and a size)
    rather than listing the members: listing them in every pooled group made a table of
    ``G`` pooled groups ``O(G^2)`` in size (1,000 groups of 30 runs: 1 million names).
    The members instead carry the id, so the pool is recorded once, in ``O(G)``
    (:meth:`tolstat.ToleranceTable.pool_members` lists it)."""
    by_label = {_label((g["op"], g["dtype"], g["hardware"])): g for g in groups}
    seen: set[int] = set()
    for c in res.groups.values():
        if not c.pool or id(c.pool) in seen:
            continue
        seen.add(id(c.pool))
        ref = pool_ref(c.pool, refs)["id"]
        for m in c.pool:
            cert = by_label[m]["certificate"]
            if ref not in cert.setdefault("member_of", []):
                cert["member_of"].append(ref)


def _plain(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, a: float, g: float, *,
           statistic: str, cluster: str | None, options: SelectOptions) -> tuple[CertifyResult, RunUnits]:
    """``form=None``: the plain statistic of every run, certified as it is (no fit, no split)."""
    labels, units = _engine_units(ds, cluster, codes)
    glab = _group_labels(keys, codes)
    res = certify({statistic: run_values(ds, statistic)}, glab, fp_budget=a, confidence=g, cluster=labels,
                  on_refusal="record", options=_certify_options(options, 1.0, keys, operator=False))
    return res, units


def certified_groups(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, *, form: str | None,
                     a: float, g: float, cluster: str | None = None, statistic: str = "max_abs",
                     on_error: str = "raise",
                     options: SelectOptions | None = None) -> tuple[list[dict[str, Any]], str]:
    """Table group dicts of one :func:`tolstat.select` call and the table's statistic name.

    The one calibration engine: every form is a score definition (the operator combined
    score, a scale form's ``max_score``, a plain statistic) whose per-run decision values
    (:func:`tolstat.calibration.decision.run_values`) are certified by :func:`tolstat.calibration.engine.certify`
    on independent units (:func:`tolstat.dataset.schema.run_units`). Of ``options``
    (:class:`~tolstat.calibration.options.SelectOptions`, default ``SelectOptions()``) it
    uses ``pooling``, ``seed`` and ``scale``, passed on in the
    :class:`~tolstat.calibration.engine.CertifyOptions` it builds for ``certify``.
    """
    options = SelectOptions() if options is None else options
    if not isinstance(options, SelectOptions):
        raise TypeError(f"options must be a SelectOptions, got {type(options).__name__}")
    operator = form == "operator" or (form == "auto" and has_op_statistics(ds))
    models: dict[str, Any] = {}
    if operator:
        res, rowwise, units = _operator(ds, keys, codes, a, g, cluster=cluster, options=options)
        name = "op_score"
    elif form is None:
        res, units = _plain(ds, keys, codes, a, g, statistic=statistic, cluster=cluster, options=options)
        name = statistic
    else:
        res, models, units = _scale_forms(ds, keys, codes, a, g, cluster=cluster, options=options, form=form)
        name = "max_score"
    if res.refused and on_error == "raise":
        raise next(iter(res.refused.values()))
    need_k = "K" in ds
    # how the operator statistics' magnitudes were obtained (tolstat.dataset.records.magnitude_convention)
    magnitude = str(ds["op_max"].attrs.get("magnitude", "unknown")) if "op_max" in ds else "unknown"
    groups = []
    refs: dict[int, Any] = {}  # pool_ref of each pool object, computed once
    rows = rows_by_code(codes, len(keys))
    n_elements = np.asarray(ds["n_elements"].values) if "n_elements" in ds else None
    # the rows of each run, where a group's score holds row maxima (operator form): a check of
    # an output with more rows than every calibration run carries them to its rows
    # (tolstat.measure.noise.row_extrapolation)
    n_rows = dataset_rows(ds) if operator and "shape" in ds and any(
        c is not None and any(k in ROW_MAXIMA for k in c.normalisers) for c in res.groups.values()) else None
    for gi, key in enumerate(keys):
        lab = _label(key)
        c, exc = res.groups.get(lab), res.refused.get(lab)
        entry: dict[str, Any] = {"op": key[0], "dtype": key[1], "hardware": key[2],
                                 "n": int(rows[gi].size), "n_inexact": 0, "scale": None}
        if operator:
            why = "operator: requested" if form == "operator" else "operator: " + _OP_REASON
            cert = _certificate(c, exc, "operator", why, refs)
            cert.update(rowwise=rowwise[lab], needs_magnitude=True, covariates=["K"] if need_k else [],
                        cluster=cluster, magnitude=magnitude)
        elif form is None:
            cert = _certificate(c, exc, "plain", f"plain: the statistic {statistic} as it is (form=None)", refs)
            cert.update(cluster=cluster)
        else:
            fname, why, model, n_fit = models[lab]
            cert = _certificate(c, exc, fname, why, refs)
            cert.update(n_fit=n_fit, cluster=cluster)
            entry["scale"] = model.to_dict()
        entry["statistics"] = {name: _stat_entry(c, exc, a, g)}
        cert["units"] = _units_record(units, rows[gi])
        if n_elements is not None and rows[gi].size:
            # the largest output calibrated: a check of a larger one is outside what the runs
            # show (statistics that take a maximum over elements or rows grow with the size)
            cert["n_elements_max"] = int(n_elements[rows[gi]].max())
        if n_rows is not None and rows[gi].size and c is not None and any(k in ROW_MAXIMA for k in c.normalisers):
            cert["rows_max"] = int(n_rows[rows[gi]].max())
        if c is None and cert["units"]["n_units"] < cert["units"]["n_runs"]:
            cert["reason"] += (f" ({cert['units']['n_runs']} runs are {cert['units']['n_units']} independent units: "
                               f"runs that share a {cert['units']['by']} count once; more distinct inputs are needed)")
        entry["certificate"] = cert
        groups.append(entry)
    _record_pool_members(groups, res, refs)
    return groups, name
