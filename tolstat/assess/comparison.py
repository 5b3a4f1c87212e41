"""Cross-validated comparison of tolerance methods on the user's own error tables.

``tolstat.compare(errors)`` answers, for an error dataset of *correct* runs (and
optionally a set of known-bad runs): which tolerance method, at which false-positive
budget, keeps its promise on this data, how tight is it, how stable across resamples,
and how many bad runs does it catch?

Protocol
--------
1. **Folds.** The correct runs are split into ``folds`` folds, deterministically from
   ``seed``. With ``cluster="case"`` the unit of the split is a value of that label, so
   all runs of one case (e.g. several kernel variants run on the same inputs) land in
   the same fold. Buggy runs are assigned to folds the same way (by their cluster label
   when they have it, else run by run) and each is scored once, in its fold.
2. **Calibrate on train, score on test.** For each method, budget and fold, the method
   is calibrated on the other folds (:meth:`tolstat.assess.rules.Rule.fit`), then every
   held-out run gets its check statistic as a fraction of the threshold of its group
   (``ratio``; the check fails when ``ratio > 1``). The statistic is recomputed from the dataset's per-run
   variables exactly as the table defines it (each statistic's
   ``tolstat.models.statistics.Statistic.run_scores``, the function :func:`tolstat.select`
   calibrates on); normalised statistics are exact because the element sample keeps each run's
   Pareto front (``docs/schema.md``). No kernel is re-run.
3. **Measures** per method x group x budget x fold: threshold, held-out false positives
   ``fp / n_test`` with an exact Clopper-Pearson interval at ``confidence``
   (``scipy.stats.binomtest(...).proportion_ci(method="exact")``), tightness (median
   held-out ratio), recall on the buggy runs of the fold. Pooled over folds: the same
   counts summed, the stability of the threshold (max / min over folds), and a verdict.
4. **Verdict.** The promise of a budgeted method is ``P(check of a correct run fails) <=
   budget``. From the pooled held-out counts and the two-sided Clopper-Pearson interval
   at ``confidence``: ``"held"`` when the interval's upper end is ``<= budget`` (the
   data show the rate is within budget), ``"broken"`` when its lower end is ``>
   budget`` (the data show it is above), else ``"consistent"`` (the data do not refute
   the promise but are too few to show it: a method whose rate sits just under its
   budget lands here, and budget ``1e-3`` needs thousands of held-out runs to show
   anything). Static rules make no promise; their verdict only says whether their
   realised rate meets the budget.
   Pooled over folds the rate is that of a threshold calibrated on ``(folds-1)/folds``
   of the runs, averaged over calibration sets.

This module holds :func:`compare`, its result :class:`CompareResult` and the tables the
result is made of (the ``method x group x budget x fold`` dataset and the summary rows).
The methods are the rules of :mod:`tolstat.assess.rules`, built from names
(:data:`~tolstat.assess.rules.METHODS`) or dicts by :func:`~tolstat.assess.rules.make_rule`;
the folds and the calibration and scoring of every fold are :mod:`tolstat.assess.folds`.
The per-fold core, :func:`tolstat.assess.rules.calibrate_and_score`, is what
``tolstat evaluate`` can call on its corpus (one calibration set, one test set).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr

from tolstat._base import validate as _validate
from tolstat._version import __version__
from tolstat.assess.folds import _Cells, _group_index, _Groups, _make_folds, _pool_folds, _score_folds
from tolstat.assess.rules import DEFAULT_METHODS, Rule, _split_key, display_key, make_rule
from tolstat.dataset.schema import concat, validate
from tolstat._base.inference import budget_verdict, clopper_pearson

__all__ = ["CompareResult", "compare"]


#: the summary's verdict for a method whose folds calibrated no group at all
_TOO_FEW = "too few runs"


def _too_few(row: Mapping[str, Any]) -> bool:
    """A budgeted method that had correct runs but scored none: every fold refused every group."""
    return bool(row["budgeted"]) and row["n_runs"] > 0 and row["n_test"] == 0


@dataclass
class CompareResult:
    """Outcome of :func:`compare`.

    Attributes
    ----------
    data : xarray.Dataset
        Dims ``method x group x budget x fold`` (per-fold variables) and ``method x
        group x budget`` (pooled over folds, prefixed ``pooled_``); see
        ``docs/compare.md`` for every variable.
    rows : list of dict
        Tidy summary, one row per (method, budget), pooled over groups and folds.
    group_rows : list of dict
        One row per (method, group, budget), pooled over folds.
    settings : dict
        The arguments of the run.
    run_fold, buggy_fold : numpy.ndarray
        The fold of each correct run (in the order of the correct runs of ``errors``)
        and of each buggy run.
    """

    data: xr.Dataset
    rows: list[dict[str, Any]]
    group_rows: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    run_fold: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    buggy_fold: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def summary(self, per_group: bool = False) -> str:
        """The comparison as a text table (one line per method and budget, or per group too)."""
        src = self.group_rows if per_group else self.rows
        head = ["method", *(["group"] if per_group else []), "budget", "scored", "FP", "FP rate",
                f"{100 * self.settings.get('confidence', 0.95):g}% CI", "verdict", "tightness", "stability",
                "recall"]
        out = [head]
        for r in src:
            ci = "-" if math.isnan(r["fp_hi"]) else f"[{100 * r['fp_lo']:.2f}, {100 * r['fp_hi']:.2f}]%"
            out.append([
                r["method"], *([r["group"]] if per_group else []), f"{r['budget']:g}",
                "-" if not r["n_runs"] else f"{100 * r['n_test'] / r['n_runs']:.0f}%",
                f"{r['fp']}/{r['n_test']}",
                "-" if math.isnan(r["fp_rate"]) else f"{100 * r['fp_rate']:.2f}%", ci,
                _TOO_FEW if _too_few(r) else r["verdict"] + ("" if r["budgeted"] else "*"),
                "-" if math.isnan(r["tightness"]) else f"{r['tightness']:.3f}",
                "-" if math.isnan(r["stability"]) else f"{r['stability']:.3f}",
                "-" if r["n_buggy"] == 0 else f"{r['caught']}/{r['n_buggy']} ({100 * r['recall']:.1f}%)",
            ])
        w = [max(len(row[i]) for row in out) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w[i]) if i < (2 if per_group else 1) else c.rjust(w[i])
                           for i, c in enumerate(row)) for row in out]
        lines.insert(1, "-" * len(lines[0]))
        notes = [("scored: share of the correct runs held out in a fold where the method had a threshold "
                  "for their group"),
                 "* static rule: makes no promise; the verdict says whether its realised rate meets the budget"]
        if any(_too_few(r) for r in src):
            g = self.settings.get("confidence", 0.95)
            from tolstat.models.estimators.orderstat import order_statistic_min_n

            need = ", ".join(f"{order_statistic_min_n(1 - b, g)} at {b:g}"
                             for b in sorted({r["budget"] for r in src if _too_few(r)}, reverse=True))
            notes.append(f"{_TOO_FEW}: no fold could calibrate a threshold for any of the method's groups: the "
                         f"order statistic needs ceil(log(1 - confidence) / log(1 - budget)) calibration units per "
                         f"group or pool ({need}), from the runs outside the held-out fold (and the default's "
                         "noise model fits on a part of them); collect more runs per group or use more folds (--folds 10) "
                         "(the ! lines name each group's count)")
        refused = [r for r in self.group_rows if r["refused_folds"]]
        for r in refused[:8]:
            why = re.sub(r"^group \(.*?\) statistic \w+: ", "", r["reason"])
            why = why.replace(" (n >= ln(1-confidence)/ln(1-budget))", "")
            notes.append(f"! {r['method']} {r['group']} @ {r['budget']:g}: {r['refused_folds']} of "
                         f"{self.settings.get('folds', '?')} folds not calibrated: {why}")
        if len(refused) > 8:
            notes.append(f"! ... {len(refused) - 8} more (group_rows / the 'reason' variable)")
        return "\n".join(lines + notes)

    def __str__(self) -> str:
        return self.summary()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: settings, summary rows, per-group rows."""
        return {"tolstat_version": __version__, "settings": self.settings, "summary": self.rows,
                "groups": self.group_rows}

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (atomically; NaN written as null)."""
        text = json.dumps(_nan_to_none(self.to_dict()), indent=1, default=_json_default) + "\n"
        return _atomic(Path(path), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))

    def to_netcdf(self, path: str | os.PathLike[str]) -> Path:
        """Write :attr:`data` to netCDF-4 (h5netcdf, atomically)."""
        return _atomic(Path(path), lambda tmp: self.data.to_netcdf(tmp, engine="h5netcdf"))

    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """``compare.json``, ``compare.nc`` and ``summary.txt`` (each atomically); the plots are
        :func:`tolstat.cli.plots.plot_compare`'s."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        text = self.summary() + "\n\n" + self.summary(per_group=True) + "\n"
        written = [self.to_json(out / "compare.json"), self.to_netcdf(out / "compare.nc"),
                   _atomic(out / "summary.txt", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))]
        return written


def _atomic(dest: Path, write: Any) -> Path:
    """The package's one atomic writer (unique temporary, one rename, stale cleanup)."""
    from tolstat._base.util import atomic_write

    return atomic_write(dest, write)


def _nan_to_none(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _nan_to_none(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_nan_to_none(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return _nan_to_none(float(o))
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(type(o).__name__)


def _run_level_in_memory(ds: xr.Dataset) -> xr.Dataset:
    """Load the run-level variables and labels of a (possibly dask-backed) dataset; samples stay lazy."""
    names = [n for n, v in ds.variables.items() if v.dims == ("run",) and getattr(v, "chunks", None)]
    if not names:
        return ds
    import dask

    loaded = dict(zip(names, dask.compute(*(ds[n] for n in names))))
    out = ds.copy()
    for n, v in loaded.items():
        if n in out.coords:
            out = out.assign_coords({n: v})
        else:
            out[n] = v
    return out


def _unit_float(name: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1), got {v!r}") from None
    if not 0.0 < f < 1.0:
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {v!r}")
    return f


def compare(
    errors: xr.Dataset,
    *,
    methods: Sequence[str | Mapping[str, Any] | Rule] = DEFAULT_METHODS,
    budgets: Sequence[float] = (1e-2, 1e-3),
    folds: int = 5,
    buggy: xr.Dataset | None = None,
    by: Sequence[str] = ("op", "dtype", "hardware"),
    cluster: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    progress: bool | None = None,
) -> CompareResult:
    """Cross-validated comparison of tolerance methods on an error dataset.

    Parameters
    ----------
    errors : xarray.Dataset
        Error dataset (``docs/schema.md``), in memory or dask-backed. Runs with the
        label ``kind == "buggy"`` (if the dataset has a ``kind`` label) are taken as
        buggy runs; all others must be correct runs.
    methods : sequence
        Names in :data:`tolstat.assess.rules.METHODS`, dicts (:func:`tolstat.assess.rules.make_rule`)
        or :class:`tolstat.assess.rules.Rule` objects.
    budgets : sequence of float
        False-positive budgets per check, each in (0, 1).
    folds : int, default 5
        Number of cross-validation folds (>= 2).
    buggy : xarray.Dataset, optional
        Known-bad runs (same schema); recall is reported when there are any.
    by : sequence of str, default ("op", "dtype", "hardware")
        Groups of thresholds (must contain ``op`` and ``dtype``).
    cluster : str, optional
        Label whose runs must stay in one fold (e.g. ``"case"``). Default: each run is
        its own unit.
    confidence : float, default 0.95
        Confidence of the tolstat thresholds and level of the two-sided Clopper-Pearson
        intervals of the realised false-positive rate.
    seed : int, default 0
        Seed of the fold assignment.
    progress : bool, optional
        tqdm progress bar (default: only on a terminal).

    Returns
    -------
    CompareResult

    Raises
    ------
    ValueError
        Bad arguments (naming the argument and the value), an invalid dataset, or fewer
        units than folds.
    """
    if not isinstance(errors, xr.Dataset):
        raise TypeError(f"errors must be an error dataset (xarray.Dataset), got {type(errors).__name__}")
    g = _unit_float("confidence", confidence)
    bl = _check_budgets(budgets)
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or folds < 2:
        raise ValueError(f"folds must be an integer >= 2, got {folds!r}")
    by = tuple(by)
    if "op" not in by or "dtype" not in by or not set(by) <= {"op", "dtype", "hardware"}:
        raise ValueError(f"by must contain 'op' and 'dtype' (and optionally 'hardware'), got {by!r}")
    rules = _make_rules(methods)

    ds, bug = _split_buggy(errors, buggy)
    split = _make_folds(ds, bug, cluster, int(folds), seed)
    grp = _group_index(ds, bug, by)
    cells = _score_folds(rules, ds, bug, split, grp, bl, g, by, progress)
    pooled = _pool_folds(cells, bl, g)
    data = _result_dataset(cells, pooled, rules, grp, bl, g,
                           {"seed": int(seed), "cluster": cluster or "", "by": ",".join(by)})
    rows, group_rows = _summary_rows(cells, pooled, rules, grp, bl, g, int(ds.sizes["run"]))
    settings = {"methods": [r.name for r in rules], "rules": [r.describe() for r in rules], "budgets": bl,
                "folds": int(folds), "by": list(by), "cluster": cluster, "confidence": g, "seed": int(seed),
                "n_runs": int(ds.sizes["run"]), "n_buggy": 0 if bug is None else int(bug.sizes["run"]),
                "n_units": int(split.n_units)}
    return CompareResult(data, rows, group_rows, settings, split.fold, split.bfold)


def _check_budgets(budgets: Sequence[float] | float) -> list[float]:
    """The budgets as a list of distinct budgets (:func:`tolstat._base.validate.budget`)."""
    if isinstance(budgets, (int, float)):
        budgets = (budgets,)
    bl = [_validate.budget("budget", b) for b in budgets]
    if not bl or len(set(bl)) != len(bl):
        raise ValueError(f"budgets must be distinct budgets, got {list(budgets)!r}")
    return bl


def _make_rules(methods: Sequence[str | Mapping[str, Any] | Rule] | str | Mapping[str, Any] | Rule) -> list[Rule]:
    """The :class:`tolstat.assess.rules.Rule` of each method spec; their names must be distinct."""
    if isinstance(methods, (str, Mapping, Rule)):
        methods = [methods]
    rules = [make_rule(m) for m in methods]
    names = [r.name for r in rules]
    if not rules or len(set(names)) != len(names):
        raise ValueError(f"methods must be a non-empty list with distinct names, got {names}")
    return rules


def _split_buggy(errors: xr.Dataset, buggy: xr.Dataset | None) -> tuple[xr.Dataset, xr.Dataset | None]:
    """Validated correct runs, and the buggy runs (``kind == "buggy"`` of ``errors`` plus ``buggy``)."""
    ds = _run_level_in_memory(validate(errors))
    bugs: list[xr.Dataset] = []
    if "kind" in ds.variables and ds["kind"].dims == ("run",):
        kind = np.asarray(ds["kind"].values).astype(str)
        if (kind == "buggy").any():
            bugs.append(ds.isel(run=np.flatnonzero(kind == "buggy")))
            ds = ds.isel(run=np.flatnonzero(kind != "buggy"))
            if ds.sizes["run"] == 0:
                raise ValueError("errors holds only buggy runs (kind == 'buggy'): no correct runs to calibrate on")
    if buggy is not None:
        if not isinstance(buggy, xr.Dataset):
            raise TypeError(f"buggy must be an error dataset (xarray.Dataset), got {type(buggy).__name__}")
        bugs.append(_run_level_in_memory(validate(buggy)))
    bug = (bugs[0] if len(bugs) == 1 else concat(bugs)) if bugs else None
    return ds, bug


def _result_dataset(cells: _Cells, p: dict[str, np.ndarray], rules: list[Rule], grp: _Groups, bl: list[float],
                    g: float, attrs: dict[str, Any]) -> xr.Dataset:
    """The ``method x group x budget x fold`` dataset of :class:`CompareResult`."""
    lo, hi = clopper_pearson(cells.fp, cells.n_test, g)
    with np.errstate(invalid="ignore", divide="ignore"):
        fp_rate = np.where(cells.n_test > 0, cells.fp / np.maximum(cells.n_test, 1), np.nan)
        recall = np.where(cells.n_bug > 0, cells.caught / np.maximum(cells.n_bug, 1), np.nan)
    b4 = np.array(bl)[None, None, :, None]
    per_fold = {"threshold": cells.thr, "status": cells.status.astype(str), "reason": cells.reason.astype(str),
                "n_train": cells.n_train, "n_test": cells.n_test, "fp": cells.fp, "fp_rate": fp_rate,
                "fp_lo": lo, "fp_hi": hi, "held": hi <= b4, "broken": lo > b4, "tightness": cells.tight,
                "n_buggy": cells.n_bug, "caught": cells.caught, "recall": recall}
    pooled = {"pooled_fp": p["fp"], "pooled_n_test": p["n_test"], "pooled_fp_lo": p["fp_lo"],
              "pooled_fp_hi": p["fp_hi"], "pooled_verdict": p["verdict"].astype(str),
              "pooled_tightness": p["tightness"], "stability": p["stability"], "pooled_n_buggy": p["n_buggy"],
              "pooled_caught": p["caught"]}
    gop, gdt, ghw = zip(*(_split_key(k) for k in grp.names))
    return xr.Dataset(
        {**{k: (("method", "group", "budget", "fold"), v) for k, v in per_fold.items()},
         **{k: (("method", "group", "budget"), v) for k, v in pooled.items()}},
        coords={
            "method": np.array([r.name for r in rules], dtype=str),
            "rule": ("method", np.array([r.describe() for r in rules], dtype=str)),
            "family": ("method", np.array([r.family for r in rules], dtype=str)),
            "budgeted": ("method", np.array([r.budgeted for r in rules], dtype=bool)),
            "group": np.array([display_key(k) for k in grp.names], dtype=str),
            "op": ("group", np.array(gop, dtype=str)),
            "dtype": ("group", np.array(gdt, dtype=str)),
            "hardware": ("group", np.array(ghw, dtype=str)),
            "budget": np.array(bl, dtype=np.float64),
            "fold": np.arange(cells.thr.shape[-1], dtype=np.int64),
        },
        attrs={
            "tolstat_version": __version__,
            "confidence": g,
            **attrs,
            "meaning": ("held-out check statistic / threshold per method, group, budget, fold; "
                        "fp counts held-out correct runs with ratio > 1; held: Clopper-Pearson upper end "
                        "<= budget; broken: lower end > budget; verdict: held (upper <= budget), broken (lower > budget), "
                        "else consistent"),
        },
    )


def _summary_rows(cells: _Cells, p: dict[str, np.ndarray], rules: list[Rule], grp: _Groups, bl: list[float],
                  g: float, n_runs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Tidy rows: per (method, budget) pooled over groups and folds, and per (method, group, budget)."""
    G = len(grp.names)
    group_rows = []
    for mi, rule in enumerate(rules):
        for gj, key in enumerate(grp.names):
            for bi, b in enumerate(bl):
                ix = (mi, gj, bi)
                rs = [str(x) for x in cells.reason[ix] if x]
                group_rows.append(_row(rule, b, int(p["fp"][ix]), int(p["n_test"][ix]), g, float(p["tightness"][ix]),
                                       float(p["stability"][ix]), int(p["n_buggy"][ix]), int(p["caught"][ix]),
                                       group=display_key(key), refused_folds=int(p["refused"][ix]), reason=rs[0] if rs else "",
                                       n_runs=int(np.sum(grp.gi == gj))))
    rows = []
    for mi, rule in enumerate(rules):
        for bi, b in enumerate(bl):
            rs = [np.concatenate(cells.ratios[(mi, gj, bi)]) for gj in range(G) if (mi, gj, bi) in cells.ratios]
            tt = float(np.median(np.concatenate(rs))) if rs else math.nan
            st = p["stability"][mi, :, bi]
            st = st[np.isfinite(st)]
            rows.append(_row(rule, b, int(p["fp"][mi, :, bi].sum()), int(p["n_test"][mi, :, bi].sum()), g, tt,
                             float(st.max()) if st.size else math.nan, int(p["n_buggy"][mi, :, bi].sum()),
                             int(p["caught"][mi, :, bi].sum()), refused_folds=int(p["refused"][mi, :, bi].sum()),
                             reason="", n_runs=n_runs))
    return rows, group_rows


def _row(rule: Rule, budget: float, fp: int, n: int, level: float, tight: float, stab: float, nb: int,
         caught: int, *, group: str | None = None, refused_folds: int = 0, reason: str = "",
         n_runs: int = 0) -> dict[str, Any]:
    lo, hi = clopper_pearson(fp, n, level)
    row: dict[str, Any] = {"method": rule.name, "family": rule.family, "budgeted": rule.budgeted}
    if group is not None:
        row["group"] = group
    row.update({
        "budget": budget, "n_runs": n_runs, "fp": fp, "n_test": n, "fp_rate": fp / n if n else math.nan,
        "fp_lo": lo, "fp_hi": hi, "verdict": budget_verdict(lo, hi, budget), "tightness": tight,
        "stability": stab, "n_buggy": nb, "caught": caught, "recall": caught / nb if nb else math.nan,
        "refused_folds": refused_folds, "reason": reason,
    })
    return row
