"""Hardware shift: does a tolerance table calibrated on one error dataset hold on another?

Given two error datasets ``A`` (where a table is calibrated, e.g. the CPU emulation) and
``B`` (where it would be used, e.g. a GPU), :func:`shift` reports per (op, dtype) present
in both:

1. **The score.** A table is calibrated on A with :func:`tolstat.select` (``by=("op",
   "dtype")``: all of A's hardware pooled into one ``"*"`` entry per group, at the given
   ``fp_budget``, ``confidence`` and ``form``). Its max-error statistic defines the run
   score: with a ``form``, the normalised score ``max_i |d_i| / s(|ref_i|, covariates)``
   with the scale model ``s`` fitted on A; without, the plain run ``max_abs``. The runs of
   A and of B are scored by the same function, :func:`tolstat.models.scale.run_scores`, with
   A's scale model.
2. **Two-sample comparison of the scores.** ``scipy.stats.ks_2samp`` (two-sided; its p-value
   decides) and ``scipy.stats.anderson_ksamp`` (midrank variant; its p-value is interpolated
   from tables and clipped to [0.001, 0.25]). The KS p-values are adjusted over the groups
   compared with Holm's method (``statsmodels.stats.multitest.multipletests``); a group is
   flagged ``shift`` when its adjusted p-value is below ``1 - confidence``. Effect sizes:
   the ratios B/A of the median, 90% and 99% quantiles of the scores (numpy ``linear``
   quantiles).
3. **What A's table does on B.** Every run of B is checked against the group's threshold
   (flagged when its score exceeds it, as :func:`tolstat.check` does). The realised
   false-positive rate ``k/n`` comes with an exact (Clopper-Pearson) two-sided interval at
   ``confidence`` (``scipy.stats.binomtest(k, n).proportion_ci``). Status ``within``: ``k/n
   <= fp_budget``; ``above``: the rate is over the budget but the interval still reaches
   it (not significant); ``broken``: the whole interval lies above the budget, i.e. the
   budget is exceeded at one-sided level ``(1 - confidence) / 2``.

Assumptions. The KS and AD tests assume the runs within each dataset are independent and
identically distributed and the two datasets independent of each other. Datasets collected
on the *same* inputs (the corpus's cases with the same seed) are paired run for run; the
independent-sample tests ignore that pairing, which for positively correlated scores
makes them conservative (a shift is harder to flag, never easier). The FP interval treats
B's runs as independent Bernoulli trials; runs of the same case under several kernel
variants are not independent, so with many variants per case the interval is too narrow.
A table calibrated with too few runs for the budget cannot be built for a group: the group
is kept with the tests and the reason, without FP numbers.

Functions used (statistics defined elsewhere, not re-implemented here):
:func:`tolstat.select` (table, scale model, threshold) and
:func:`tolstat.models.scale.run_scores` (run scores of A and B).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import xarray as xr
from scipy import stats

from tolstat.dataset.schema import validate
from tolstat._base.inference import clopper_pearson, holm
from tolstat.calibration.decision import beyond_calibrated_size, exceeds, run_values
from tolstat.models.scale import ScaleModel, run_scores
from tolstat.calibration.selection import select
from tolstat.calibration.options import SelectOptions
from tolstat.calibration.table import ToleranceTable

__all__ = ["ShiftResult", "shift", "evaluation_shift_report"]


_STATUS = ("within", "above", "broken")


@dataclass
class ShiftResult:
    """Outcome of :func:`shift`.

    Attributes
    ----------
    data : xarray.Dataset
        One entry per (op, dtype) in both datasets (dim ``group``, coords ``op``,
        ``dtype``): ``n_a``, ``n_b`` (runs), ``n_inexact_a/b`` (scores that may be lower
        bounds), ``median_a/b``, ``q90_a/b``, ``q99_a/b`` (score quantiles),
        ``ratio_median``, ``ratio_q90``, ``ratio_q99`` (B / A), ``ks_stat``, ``ks_p``,
        ``ad_stat``, ``ad_p``, ``p_holm`` (Holm-adjusted KS p-value), ``shift`` (bool),
        ``threshold`` (A's table), ``method`` (how it was calibrated), ``n_exceed_b``,
        ``fp_rate_b``, ``fp_ci_low``, ``fp_ci_high``, ``fp_status`` (``within`` /
        ``above`` / ``broken`` / ``""`` without a threshold), ``note``. Attrs hold the
        settings and the groups found in one dataset only (JSON).
    table : ToleranceTable
        The table calibrated on A.
    only_a, only_b : list of (op, dtype)
        Groups present in one dataset only (not compared).
    """

    data: xr.Dataset
    table: ToleranceTable
    only_a: list[tuple[str, str]] = field(default_factory=list)
    only_b: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fp_budget(self) -> float:
        """The false-positive budget the table on A was calibrated for."""
        return float(self.data.attrs["fp_budget"])

    @property
    def confidence(self) -> float:
        """Confidence of the table, the tests' level (``1 - confidence``) and the FP interval."""
        return float(self.data.attrs["confidence"])

    def _groups_where(self, mask: np.ndarray) -> list[tuple[str, str]]:
        d = self.data
        return [(str(o), str(t)) for o, t, m in zip(d["op"].values, d["dtype"].values, mask) if m]

    @property
    def shifted(self) -> list[tuple[str, str]]:
        """Groups whose score distribution differs between A and B (Holm-adjusted KS)."""
        return self._groups_where(np.asarray(self.data["shift"].values, dtype=bool))

    @property
    def broken(self) -> list[tuple[str, str]]:
        """Groups where A's table breaks its false-positive budget on B (significantly)."""
        return self._groups_where(np.asarray(self.data["fp_status"].values) == "broken")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: settings, one row per group, and the groups not compared."""
        d = self.data
        rows = []
        for i in range(d.sizes["group"]):
            row: dict[str, Any] = {"op": str(d["op"].values[i]), "dtype": str(d["dtype"].values[i])}
            for v in d.data_vars:
                x = d[v].values[i]
                if isinstance(x, (np.bool_, bool)):
                    row[v] = bool(x)
                elif isinstance(x, (np.integer,)):
                    row[v] = int(x)
                elif isinstance(x, (np.floating, float)):
                    row[v] = _jf(x)
                else:
                    row[v] = str(x)
            rows.append(row)
        return {
            "fp_budget": self.fp_budget, "confidence": self.confidence, "form": d.attrs["form"] or None,
            "hardware_a": json.loads(d.attrs["hardware_a"]), "hardware_b": json.loads(d.attrs["hardware_b"]),
            "groups": rows, "only_a": [list(g) for g in self.only_a], "only_b": [list(g) for g in self.only_b],
            "shifted": [list(g) for g in self.shifted], "broken": [list(g) for g in self.broken],
            "functions": d.attrs["functions"],
        }

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Return (and, with ``path``, atomically write) the report as JSON."""
        return report_json(self.to_dict(), path)

    def to_text(self) -> str:
        """A summary table: one line per group, then the groups not compared."""
        d = self.data
        a = d.attrs
        head = (f"hardware shift: A={', '.join(json.loads(a['hardware_a']))} -> "
                f"B={', '.join(json.loads(a['hardware_b']))}; table on A: fp_budget={self.fp_budget:g}, "
                f"confidence={self.confidence:g}, form={a['form'] or 'none (max_abs)'}")
        rows = [("op", "dtype", "n_a", "n_b", "B/A med", "B/A q90", "B/A q99", "KS", "p_holm", "shift",
                 "FP on B", f"{100 * self.confidence:g}% CI", "status")]
        for i in range(d.sizes["group"]):
            g = lambda v: d[v].values[i]  # noqa: E731
            has_fp = str(g("fp_status")) != ""
            rows.append((
                str(g("op")), str(g("dtype")), str(int(g("n_a"))), str(int(g("n_b"))),
                _fmt(g("ratio_median")), _fmt(g("ratio_q90")), _fmt(g("ratio_q99")), _fmt(g("ks_stat"), ".3f"),
                _fmt(g("p_holm"), ".2g"), "SHIFT" if bool(g("shift")) else "-",
                f"{int(g('n_exceed_b'))}/{int(g('n_b'))} = {float(g('fp_rate_b')):.3g}" if has_fp else "n/a",
                f"[{float(g('fp_ci_low')):.3g}, {float(g('fp_ci_high')):.3g}]" if has_fp else "",
                (str(g("fp_status")).upper() if str(g("fp_status")) == "broken" else str(g("fp_status")))
                if has_fp else ("not scored" if math.isnan(float(g("ks_stat"))) else "no threshold"),
            ))
        widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
        lines = [head, ""] + ["  ".join(c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in
                                        enumerate(zip(r, widths))) for r in rows]
        notes = [f"  {d['op'].values[i]}/{d['dtype'].values[i]}: {d['note'].values[i]}"
                 for i in range(d.sizes["group"]) if str(d["note"].values[i])]
        if notes:
            lines += ["", "notes:"] + notes
        lines.append("")
        lines.append(f"{len(self.shifted)} of {d.sizes['group']} groups shifted (Holm-adjusted KS p < "
                     f"{1 - self.confidence:.3g}); budget broken in {len(self.broken)}"
                     + (": " + ", ".join(f"{o}/{t}" for o, t in self.broken) if self.broken else ""))
        if self.only_a:
            lines.append("only in A (not compared): " + ", ".join(f"{o}/{t}" for o, t in self.only_a))
        if self.only_b:
            lines.append("only in B (not compared): " + ", ".join(f"{o}/{t}" for o, t in self.only_b))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _jf(v: Any) -> Any:
    v = float(v)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _fmt(v: Any, spec: str = ".3g") -> str:
    v = float(v)
    return "nan" if math.isnan(v) else format(v, spec)


def _groups(ds: xr.Dataset) -> dict[tuple[str, str], np.ndarray]:
    keys = list(zip(np.asarray(ds["op"].values).astype(str), np.asarray(ds["dtype"].values).astype(str)))
    out: dict[tuple[str, str], list[int]] = {}
    for i, k in enumerate(keys):
        out.setdefault(k, []).append(i)
    return {k: np.asarray(v) for k, v in out.items()}


def _ratio(b: float, a: float) -> float:
    if a == 0.0:
        return 1.0 if b == 0.0 else math.inf
    return b / a


def _finite_for_ranks(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replace +inf scores (non-finite outputs) by a value above every finite score.

    Both tests depend on the pooled ranks only, so this keeps them exact.
    """
    fin = np.concatenate([a[np.isfinite(a)], b[np.isfinite(b)]])
    big = (float(fin.max()) if fin.size else 1.0) * 2.0 + 1.0
    return np.where(np.isfinite(a), a, big), np.where(np.isfinite(b), b, big)


def _anderson(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "p-value capped/floored": documented above
        try:
            res = stats.anderson_ksamp([a, b], variant="midrank")
        except TypeError:  # scipy < 1.17 has no `variant`; midrank is its default
            res = stats.anderson_ksamp([a, b])
        except ValueError:  # all scores equal: no distinct observations
            return math.nan, math.nan
    return float(res.statistic), float(res.pvalue)


def _table_group(table: ToleranceTable, op: str, dtype: str) -> tuple[ScaleModel | None, float, str, str]:
    """Scale model, threshold, method and reason of the table's group (op, dtype, '*')."""
    d = table.data
    i = table.groups.index((op, dtype, "*"))
    sj = str(d["scale_json"].values[i])
    model = ScaleModel.from_dict(json.loads(sj)) if sj else None
    return model, float(d["threshold"].values[i, 0]), str(d["method"].values[i, 0]), str(d["reason"].values[i, 0])


def _compare_scores(xa: np.ndarray, xb: np.ndarray, vb: np.ndarray, thr: float, reason: str, fp_budget: float,
                    confidence: float) -> dict[str, Any]:
    """Quantile ratios and two-sample tests of the scores of A and B, and the FP rate of B at ``thr``."""
    row: dict[str, Any] = {}
    for q, name in ((0.5, "median"), (0.9, "q90"), (0.99, "q99")):
        qa, qb = float(np.quantile(xa, q)), float(np.quantile(xb, q))
        row[f"{name}_a"], row[f"{name}_b"] = qa, qb
        row[f"ratio_{name}"] = _ratio(qb, qa)
    ra, rb = _finite_for_ranks(xa, xb)
    ks = stats.ks_2samp(ra, rb)
    row["ks_stat"], row["ks_p"] = float(ks.statistic), float(ks.pvalue)
    row["ad_stat"], row["ad_p"] = _anderson(ra, rb)
    if math.isnan(thr):
        row["note"] = f"no threshold on A: {reason}"
    else:
        k, n = int(np.sum(exceeds(vb, thr))), int(vb.size)
        lo, hi = clopper_pearson(k, n, float(confidence))
        rate = k / n
        status = "within" if rate <= fp_budget else ("broken" if lo > fp_budget else "above")
        row.update(n_exceed_b=k, fp_rate_b=rate, fp_ci_low=float(lo), fp_ci_high=float(hi), fp_status=status)
    return row


def shift(
    a: xr.Dataset,
    b: xr.Dataset,
    *,
    fp_budget: float = 0.01,
    confidence: float = 0.95,
    form: str | None = "allclose",
    cluster: str | None = None,
    options: SelectOptions | None = None,
) -> ShiftResult:
    """Compare two error datasets and test a table calibrated on ``a`` against ``b``.

    See the module docstring for every statistic and its assumptions.

    Parameters
    ----------
    a : xarray.Dataset
        Error dataset the table is calibrated on (e.g. the CPU emulation).
    b : xarray.Dataset
        Error dataset of the other hardware (e.g. a GPU).
    fp_budget : float, default 0.01
        False-positive budget per check of the table calibrated on ``a``, in (0, 1).
    confidence : float, default 0.95
        Confidence of the table; also the level of the tests (``1 - confidence``) and
        of the FP interval.
    form : {"allclose", "size_aware", "normalised", "baseline"} or None, default "allclose"
        Noise-scale model of the score (:func:`tolstat.select`); None scores runs by
        their plain ``max_abs``.
    cluster : str, optional
        As in :func:`tolstat.select`: a run label whose runs form one unit.
    options : SelectOptions, optional
        Further settings of :func:`tolstat.select`
        (:class:`~tolstat.calibration.options.SelectOptions`); shift calibrates with
        ``by=("op", "dtype")``, ``statistic="max_abs"`` and ``on_error="skip"``.

    Returns
    -------
    ShiftResult

    Raises
    ------
    ValueError
        Bad ``fp_budget``/``confidence``/``form``, invalid datasets, or no (op, dtype)
        in common.
    TypeError
        ``a`` or ``b`` is not an ``xarray.Dataset``.
    """
    for name, ds in (("a", a), ("b", b)):
        if not isinstance(ds, xr.Dataset):
            raise TypeError(f"shift: {name} must be an error dataset (xarray.Dataset), got {type(ds).__name__}")
    a = validate(a)
    b = validate(b)
    ga, gb = _groups(a), _groups(b)
    common = sorted(set(ga) & set(gb))
    only_a = sorted(set(ga) - set(gb))
    only_b = sorted(set(gb) - set(ga))
    if not common:
        raise ValueError(f"shift: no (op, dtype) in both datasets (A has {sorted(ga)}, B has {sorted(gb)})")
    a_common = a.isel(run=np.sort(np.concatenate([ga[k] for k in common])))
    # select validates fp_budget, confidence and form and names them in its errors
    table = select(a_common, fp_budget=fp_budget, confidence=confidence, form=form, by=("op", "dtype"),
                   statistic="max_abs", on_error="skip", cluster=cluster, options=options)
    alpha = 1.0 - float(confidence)
    rows: list[dict[str, Any]] = []
    for op, dt in common:
        sa = a.isel(run=ga[(op, dt)])
        sb = b.isel(run=gb[(op, dt)])
        model, thr, method, reason = _table_group(table, op, dt)
        row: dict[str, Any] = {"n_a": int(sa.sizes["run"]), "n_b": int(sb.sizes["run"]), "threshold": thr,
                               "method": method, "note": ""}
        try:
            if form is not None and model is None:
                raise ValueError(f"no scale model could be fitted on A: {reason}")
            # the score distributions compared: the statistic itself (its law, correctly rounded
            # runs included); the false-positive count: the decision values a check compares
            ra, rb = run_scores(sa, model, "max_abs"), run_scores(sb, model, "max_abs")
            xa, ia, xb, ib = ra.scores, ra.n_inexact, rb.scores, rb.n_inexact
            name = "max_abs" if model is None else "max_score"
            vb = run_values(sb, name, model)
            try:  # B's outputs larger than A's: carried as a check carries them
                ent = table.entry(op, dt, "*")
            except KeyError:
                ent = None
            if ent is not None and "n_elements" in sb:
                vb = beyond_calibrated_size({name: vb}, ent, np.asarray(sb["n_elements"].values))[name]
        except ValueError as exc:  # e.g. B lacks a covariate of A's scale model
            row.update(note=f"not scored: {exc}", n_inexact_a=0, n_inexact_b=0)
            rows.append(row)
            continue
        row.update(n_inexact_a=ia, n_inexact_b=ib)
        row.update(_compare_scores(xa, xb, vb, thr, reason, fp_budget, confidence))
        if ia or ib:
            row["note"] = (row["note"] + "; " if row["note"] else "") + \
                f"{ia} A / {ib} B run score(s) may be lower bounds (truncated front)"
        rows.append(row)
    p_holm = holm(np.array([r.get("ks_p", math.nan) for r in rows]))
    data = _dataset(common, rows, p_holm, alpha)
    data.attrs.update({
        "fp_budget": float(fp_budget), "confidence": float(confidence), "form": form or "",
        "hardware_a": json.dumps(sorted(set(np.asarray(a["hardware"].values).astype(str).tolist()))),
        "hardware_b": json.dumps(sorted(set(np.asarray(b["hardware"].values).astype(str).tolist()))),
        "only_a": json.dumps([list(g) for g in only_a]), "only_b": json.dumps([list(g) for g in only_b]),
        "functions": "tolstat.select (table on A: scale model and threshold); tolstat.models.scale.run_scores "
                     "(scores of A and B); tolstat.calibration.decision.run_values (what tolstat.check compares on B); scipy.stats.ks_2samp, scipy.stats.anderson_ksamp, "
                     "tolstat._base.inference.clopper_pearson (exact interval); statsmodels multipletests (holm)",
    })
    return ShiftResult(data=data, table=table, only_a=only_a, only_b=only_b)


def _dataset(common: Sequence[tuple[str, str]], rows: Sequence[dict[str, Any]], p_holm: np.ndarray,
             alpha: float) -> xr.Dataset:
    floats = ("median_a", "median_b", "q90_a", "q90_b", "q99_a", "q99_b", "ratio_median", "ratio_q90",
              "ratio_q99", "ks_stat", "ks_p", "ad_stat", "ad_p", "threshold", "fp_rate_b", "fp_ci_low",
              "fp_ci_high")
    ints = ("n_a", "n_b", "n_inexact_a", "n_inexact_b", "n_exceed_b")
    dim = ("group",)
    vars_: dict[str, Any] = {}
    for v in ints:
        vars_[v] = (dim, np.array([int(r.get(v, 0)) for r in rows], dtype=np.int64))
    for v in floats:
        vars_[v] = (dim, np.array([float(r.get(v, math.nan)) for r in rows], dtype=np.float64))
    vars_["p_holm"] = (dim, p_holm)
    vars_["shift"] = (dim, np.nan_to_num(p_holm, nan=1.0) < alpha)
    for v in ("method", "fp_status", "note"):
        vars_[v] = (dim, np.array([str(r.get(v, "")) for r in rows], dtype=str))
    return xr.Dataset(vars_, coords={"op": (dim, np.array([g[0] for g in common], dtype=str)),
                                     "dtype": (dim, np.array([g[1] for g in common], dtype=str))})


def evaluation_shift_report(calibration: xr.Dataset, datasets: Sequence[str | os.PathLike[str]], *,
                            fp_budget: float, confidence: float) -> str:
    """Shift report of ``evaluate``'s calibration data (A) against each error dataset in ``datasets`` (B).

    Only B's runs of the (op, dtype) groups and, where both datasets carry the ``dims``
    label, of the problem shapes that ``evaluate`` calibrated on are compared (so a
    ``--quick`` evaluation, with small shapes only, is not compared with a GPU dataset's
    larger shapes). ``tolstat evaluate --shift-against FILE`` prints it.
    """
    from tolstat.dataset.io import open_errors

    paths = [Path(p) for p in datasets]

    def keys(ds: xr.Dataset, with_dims: bool) -> list[tuple[str, ...]]:
        cols = [np.asarray(ds[c].values).astype(str) for c in (("op", "dtype", "dims") if with_dims
                                                                  else ("op", "dtype"))]
        return list(zip(*cols))

    out = []
    for p in paths:
        gpu = open_errors(p)
        with_dims = "dims" in gpu.coords and "dims" in calibration.coords
        have = set(keys(calibration, with_dims))
        keep = np.array([k in have for k in keys(gpu, with_dims)])
        if not keep.any():
            out.append(f"{p.name}: no (op, dtype{', shape' if with_dims else ''}) in common with the "
                       "evaluation; not compared")
            continue
        res = shift(calibration, gpu.isel(run=np.flatnonzero(keep)), fp_budget=fp_budget, confidence=confidence)
        dropped = int((~keep).sum())
        extra = (f" ({dropped} of its runs left out: ops, dtypes or shapes the evaluation did not calibrate)"
                 if dropped else "")
        out.append(f"error dataset {p.name}{extra}:\n{res.to_text()}")
    return "\n\n".join(out)


def report_json(d: Any, path: str | os.PathLike[str] | None = None) -> str:
    """``d`` as the JSON text of a report (sorted keys, no NaN), written atomically to
    ``path`` when given (its folder must exist); the text is returned either way."""
    text = json.dumps(d, indent=1, sort_keys=True, allow_nan=False) + "\n"
    if path is not None:
        p = Path(path)
        if not p.parent.exists():
            raise FileNotFoundError(f"path: directory {os.fspath(p.parent)!r} does not exist")
        from tolstat._base.util import atomic_write_text

        atomic_write_text(p, text)
    return text
