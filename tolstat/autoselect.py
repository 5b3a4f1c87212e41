"""The certified forms of :func:`tolstat.select`: ``form="auto"`` (the default) and ``"operator"``.

Both calibrate through :func:`tolstat.certify.certify` (declared clusters as one unit,
split fitting, the order statistic with its PAC promise, pooling across exchangeable
groups, an exact path for exact ops, resolution floors), never through a tail model.

Pooling (small groups borrow the scores of exchangeable groups): a table of several
operators pools scores in units of each group's own normalisers
(``pool_normalisers="own"``); groups of one operator share the pool's normalisers.

Rule of ``form="auto"`` (``docs/selection.md``):

* the error dataset has operator statistics (collected with a ``magnitude``, variables
  with ``role = "op_statistic"``): the **operator** form for every group, the combined
  score ``op_score = max_j T_j / q_j`` over :func:`tolstat.noise.score_statistic_names`
  (measured on the corpus: the most bugs caught at the same false-positive rate);
* otherwise a noise-scale form per group, chosen on the fitting part only: ``allclose``
  and ``size_aware`` are each fitted on one half of the fitting part and scored on the
  other half; the form whose held-out scores have the smaller ratio ``p90 / median``
  (less slack for a typical run) wins. The chosen model is then refitted on the whole
  fitting part and the threshold on ``max_score`` is certified on the remaining runs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import xarray as xr

from ._util import NotEnoughData
from .certify import CertifyResult, GroupCertificate, certify, split_units
from .dataset import covariate_names, label_names
from .estimators.orderstat import order_statistic_min_n
from .noise import score_statistic_names
from .statistics import OP_UNIT_FLOOR, dataset_op_statistics, get as get_statistic

__all__ = ["CERTIFIED_FORMS", "has_op_statistics", "certified_groups"]

CERTIFIED_FORMS = ("auto", "operator")
_OP_REASON = ("the dataset has operator-noise statistics: combined score over the operator statistics "
              "(docs/noise.md; the most powerful form measured on the corpus)")


def has_op_statistics(ds: xr.Dataset) -> bool:
    """True when the error dataset stores operator statistics (``role = "op_statistic"``)."""
    return any(ds[v].attrs.get("role") == "op_statistic" for v in ds.data_vars)


def _label(key: tuple[str, ...]) -> str:
    return "(" + ", ".join(key) + ")"


def _unit_labels(ds: xr.Dataset, cluster: str | None) -> np.ndarray | None:
    if cluster is None:
        return None
    if cluster not in ds.variables:
        raise ValueError(f"cluster={cluster!r} is not a run label of the error dataset; labels are "
                         f"{label_names(ds)}")
    return np.asarray(ds[cluster].values).astype(str)


def _dedup_covariates(ds: xr.Dataset, cluster: str | None) -> np.ndarray:
    """One integer per run coding its covariates and labels (equal codes: equal covariates),
    which tell exact duplicate runs apart."""
    names = [c for c in covariate_names(ds) if c in ds] + [c for c in label_names(ds) if c in ds and c != cluster]
    code = np.zeros(ds.sizes["run"], dtype=np.int64)
    for c in names + ["op", "dtype", "hardware"]:
        if c in ds:
            u, inv = np.unique(np.asarray(ds[c].values), return_inverse=True)
            # combine, then renumber densely (no overflow however many columns)
            code = np.unique(code * np.int64(u.size) + inv.ravel(), return_inverse=True)[1].ravel()
    return code.astype(np.int64)


def _op_names(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The union of score statistics and a (runs, names) mask of those each group uses."""
    per_group = []
    for gi, key in enumerate(keys):
        sel = codes == gi
        names = [n for n in score_statistic_names(key[0]) if n in ds
                 and not np.isnan(np.asarray(ds[n].values, dtype=np.float64)[sel]).all()]
        per_group.append(names)
    union = list(dict.fromkeys(n for names in per_group for n in names))
    if not union:
        raise ValueError("form='operator' needs operator statistics in the error dataset "
                         "(collect / from_pairs with magnitude=...)")
    use = np.zeros((codes.size, len(union)), dtype=bool)
    for gi, names in enumerate(per_group):
        use[np.ix_(codes == gi, [union.index(n) for n in names])] = True
    return union, use


def _certify_kwargs(a: float, g: float, seed: int, pooling: bool, norm_quantile: float,
                    keys: Sequence[tuple[str, ...]]) -> dict[str, Any]:
    # a pool of several operators uses each group's own normalisers (operators differ in how
    # their statistics spread, so scores are pooled in units of each group's own spread);
    # groups of one operator (other dtypes or hardware) share the pool's normalisers
    own = len({k[0] for k in keys}) > 1
    return dict(fp_budget=a, confidence=g, seed=seed, pooling=pooling, norm_quantile=norm_quantile,
                on_refusal="record", pool_normalisers="own" if own else "shared")


def _operator(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, a: float, g: float, *,
              cluster: str | None, pooling: bool, seed: int, norm_quantile: float) -> tuple[CertifyResult, dict]:
    union, use = _op_names(ds, keys, codes)
    raw = dataset_op_statistics(ds, union)
    stats = {n: np.where(use[:, j], raw[n], np.nan) for j, n in enumerate(union)}
    glab = np.array([_label(k) for k in keys], dtype=object)[codes]
    floor = {n: (1.0 if n in OP_UNIT_FLOOR else 0.0) for n in union}
    res = certify(stats, glab, cluster=_unit_labels(ds, cluster), covariates=_dedup_covariates(ds, cluster),
                  floor=floor, **_certify_kwargs(a, g, seed, pooling, norm_quantile, keys))
    rowwise = {}
    for gi, key in enumerate(keys):
        sel = codes == gi
        rowwise[_label(key)] = bool("op_row_rms_max" in ds
                                    and not np.isnan(np.asarray(ds["op_row_rms_max"].values)[sel]).all())
    return res, rowwise


def _n_fit(n: int, nmin: int) -> int:
    """Runs (units) that fit the scale model in the auto path: 20 %, 10 to 200, fewer when
    that lets the rest reach the order statistic's minimum."""
    if n < 4:
        return 0
    k = min(200, max(10, round(0.2 * n)))
    if n - k < nmin <= n - 2:
        k = n - nmin
    return int(min(k, n // 2))


def _pick_form(fit: xr.Dataset, scale: Any, seed: int) -> tuple[str, str]:
    """allclose vs size_aware, both fitted on one half of the fitting runs and scored on the other."""
    n = fit.sizes["run"]
    if n < 4:
        return "allclose", f"allclose: only {n} fitting runs, too few to compare forms"
    i1, i2 = split_units(n, n // 2, seed + 1)
    spread = {}
    for form in ("allclose", "size_aware"):
        try:
            model = scale.fit(fit.isel(run=i1), form, seed=seed)
        except (ValueError, np.linalg.LinAlgError) as exc:
            spread[form] = (math.inf, str(exc))
            continue
        s = get_statistic("max_score").run_scores(fit.isel(run=i2), model).scores
        s = s[np.isfinite(s)]
        med = float(np.median(s)) if s.size else 0.0
        spread[form] = (float(np.quantile(s, 0.9)) / med if med > 0 else math.inf, "")
    best = min(spread, key=lambda f: spread[f][0])
    txt = ", ".join(f"{f}: {v[0]:.3g}" for f, v in spread.items())
    return best, (f"{best}: no operator statistics in the dataset; of the scale forms fitted on half of the "
                  f"fitting runs it had the smallest held-out p90/median of the normalised max error ({txt})")


def _scale_forms(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, a: float, g: float, *,
                 cluster: str | None, pooling: bool, seed: int, scale: Any) -> tuple[CertifyResult, dict]:
    nmin = order_statistic_min_n(1.0 - a, g)
    units = _unit_labels(ds, cluster)
    scores, glab, clab, models = [], [], [], {}
    for gi, key in enumerate(keys):
        idx = np.flatnonzero(codes == gi)
        u = np.asarray(idx.astype(str) if units is None else units[idx])
        names, inv = np.unique(u, return_inverse=True)
        iA, _ = split_units(names.size, _n_fit(names.size, nmin), seed)
        inA = np.isin(inv, iA)
        fit, cal = ds.isel(run=idx[inA]), ds.isel(run=idx[~inA])
        form, why = _pick_form(fit, scale, seed) if fit.sizes["run"] else ("allclose", "allclose: no fitting runs")
        model = scale.fit(fit if fit.sizes["run"] else cal, form, seed=seed)
        if not fit.sizes["run"]:
            why += " (fitted on the calibration runs: the order statistic's promise then does not hold exactly)"
        models[_label(key)] = (form, why, model, int(inA.sum()))
        scores.append(get_statistic("max_score").run_scores(cal, model).scores)
        glab += [_label(key)] * cal.sizes["run"]
        clab += list(u[~inA])
    res = certify({"max_score": np.concatenate(scores)}, np.array(glab, dtype=object),
                  cluster=np.array(clab, dtype=object) if units is not None else None,
                  **_certify_kwargs(a, g, seed, pooling, 0.9, keys))
    return res, models


def _stat_entry(c: GroupCertificate | None, exc: NotEnoughData | None, a: float, g: float) -> dict[str, Any]:
    if c is None:
        return {"threshold": math.nan, "estimate": math.nan, "budget": a, "confidence": g, "method": "refused",
                "reason": str(exc), "tail": {}, "top_scores": []}
    return {"threshold": c.threshold, "estimate": math.nan, "budget": a, "confidence": g, "method": c.method,
            "reason": c.reason, "tail": {}, "top_scores": []}


def _certificate(c: GroupCertificate | None, exc: NotEnoughData | None, form: str, why: str) -> dict[str, Any]:
    out: dict[str, Any] = {"form": form, "form_reason": why}
    if c is None:
        out.update(method="refused", guarantee="none: the group was refused", reason=str(exc),
                   n_needed=int(getattr(exc, "n_needed", 0) or 0))
        return out
    out.update(method=c.method, guarantee=c.guarantee, reason=c.reason, normalisers=dict(c.normalisers),
               floor=c.floor, pool=list(c.pool), pool_p=c.pool_p if math.isfinite(c.pool_p) else None,
               flags=list(c.flags), n_runs=c.n_runs, n_units=c.n_units, n_clusters=c.n_clusters,
               n_duplicates=c.n_duplicates, n_fit=c.n_fit, n_cal=c.n_cal, rank=c.rank, n_scores=c.n_scores)
    return out


def certified_groups(ds: xr.Dataset, keys: Sequence[tuple[str, ...]], codes: np.ndarray, *, form: str,
                     a: float, g: float, cluster: str | None = None, pooling: bool = True, seed: int = 0,
                     scale: Any = None, norm_quantile: float = 1.0,
                     on_error: str = "raise") -> tuple[list[dict[str, Any]], str]:
    """Table group dicts of the ``auto``/``operator`` forms and the table's statistic name."""
    operator = form == "operator" or has_op_statistics(ds)
    if operator:
        res, rowwise = _operator(ds, keys, codes, a, g, cluster=cluster, pooling=pooling, seed=seed,
                                 norm_quantile=norm_quantile)
    else:
        res, models = _scale_forms(ds, keys, codes, a, g, cluster=cluster, pooling=pooling, seed=seed, scale=scale)
    if res.refused and on_error == "raise":
        raise next(iter(res.refused.values()))
    need_k = "K" in ds
    groups = []
    for gi, key in enumerate(keys):
        lab = _label(key)
        c, exc = res.groups.get(lab), res.refused.get(lab)
        entry: dict[str, Any] = {"op": key[0], "dtype": key[1], "hardware": key[2],
                                 "n": int((codes == gi).sum()), "n_inexact": 0, "scale": None}
        if operator:
            why = "operator: requested" if form == "operator" else "operator: " + _OP_REASON
            cert = _certificate(c, exc, "operator", why)
            cert.update(rowwise=rowwise[lab], needs_magnitude=True, covariates=["K"] if need_k else [],
                        cluster=cluster)
            entry["statistics"] = {"op_score": _stat_entry(c, exc, a, g)}
        else:
            fname, why, model, n_fit = models[lab]
            cert = _certificate(c, exc, fname, why)
            cert.update(n_fit=n_fit, cluster=cluster)
            entry["scale"] = model.to_dict()
            entry["statistics"] = {"max_score": _stat_entry(c, exc, a, g)}
        entry["certificate"] = cert
        groups.append(entry)
    return groups, ("op_score" if operator else "max_score")
