"""An HTML page of a tolerance table on its error dataset (``tolstat report TABLE --errors DS``).

A reviewer of a table wants to see, per group, what the threshold was chosen from and how
close correct runs come to it. The page shows, per ``(op, dtype, hardware)`` group of the
table:

* the entry: form, method, each statistic's threshold, budget and confidence, the
  certificate's guarantee (or why the group was refused);
* the **distribution of the decision values** of the group's runs in the dataset (one
  histogram per statistic, log scale, the threshold drawn on it; correctly rounded runs,
  whose decision value is 0, and non-finite ones counted beside it);
* the runs **nearest the threshold** (largest decision value relative to it): their index,
  labels, covariates and errors;
* the **recall table**, when references are given: what the group's decision and the
  peers' rules catch of the standard wrong outputs (:func:`tolstat.assess.power.power_report`).

The decision values are :func:`tolstat.calibration.decision.entry_run_values`, the numbers
:func:`tolstat.check` compares with the thresholds (one decision, defined once); the
page is one self-contained file (inline CSS and SVG, no script, no network), written
atomically.
"""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tolstat._base.util import atomic_write_text, group_rows
from tolstat.calibration.decision import entry_run_values
from tolstat.calibration.table import ToleranceTable

__all__ = ["table_report_html", "write_table_report"]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 72em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.5em 0 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f3f3f3; } div.scroll { overflow-x: auto; } table.recall { font-size: 0.8em; }
td.text, th.text { text-align: left; }
.refused { color: #a00; font-weight: bold; } .note { color: #555; font-size: 0.9em; }
svg.hist { display: block; margin: 0.5em 0; } svg.hist rect.bar { fill: #4a7ab5; }
svg.hist line.threshold { stroke: #c00; stroke-width: 2; stroke-dasharray: 6 3; }
svg.hist text { font-size: 11px; fill: #333; } svg.hist line.axis { stroke: #333; }
"""


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _g(x: Any, digits: int = 4) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return _e(x)
    if math.isnan(v):
        return "-"
    return f"{v:.{digits}g}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str, text_cols: Sequence[int] = ()) -> str:
    """An HTML table (in a scrolling box); cells are already escaped; the columns ``text_cols`` left-aligned."""
    left = {j % len(head) for j in text_cols} if head else set()

    def cell(tag: str, j: int, v: str) -> str:
        cls_attr = ' class="text"' if j in left else ""
        return f"<{tag}{cls_attr}>{v}</{tag}>"

    out = [f'<div class="scroll"><table class="{cls}"><thead><tr>' + "".join(cell("th", j, _e(h)) for j, h in enumerate(head))
           + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(cell("td", j, v) for j, v in enumerate(r)) + "</tr>" for r in rows]
    return "".join(out) + "</tbody></table></div>"


def _ticks(lo: float, hi: float) -> list[float]:
    """Tick positions (log10 units) between ``lo`` and ``hi``: the powers of ten inside, or
    five evenly spaced values when fewer than two powers fall inside."""
    p = list(range(math.ceil(lo), math.floor(hi) + 1))
    return [float(x) for x in p] if len(p) >= 2 else list(np.linspace(lo, hi, 5))


def histogram_svg(values: Any, threshold: float, *, bins: int = 30, width: int = 640, height: int = 180,
                  title: str = "") -> str:
    """An inline SVG histogram of the positive finite ``values`` on a log scale, with
    ``threshold`` drawn as a dashed line; zero, non-finite and NaN values counted in the caption.

    Parameters
    ----------
    values : array_like
        Decision values of runs.
    threshold : float
        The threshold (not drawn when NaN, infinite or not positive).
    bins : int, default 30
    width, height : int
        Size in pixels.
    title : str
        Accessible title of the figure.

    Returns
    -------
    str
        ``<figure>`` with the SVG and a caption.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    n_zero, n_inf, n_nan = int((v == 0).sum()), int(np.isinf(v).sum()), int(np.isnan(v).sum())
    pos = v[(v > 0) & np.isfinite(v)]
    thr = float(threshold)
    draw_thr = math.isfinite(thr) and thr > 0
    caption = [f"{v.size} runs"]
    if n_zero:
        caption.append(f"{n_zero} with decision value 0 (correctly rounded; not drawn)")
    if n_inf:
        caption.append(f"{n_inf} non-finite (always fail; not drawn)")
    if n_nan:
        caption.append(f"{n_nan} without a value (no statistic applies; not drawn)")
    if draw_thr:
        caption.append(f"{int((pos > thr).sum()) + n_inf} over the threshold {thr:.4g}")
    cap = "<figcaption class=\"note\">" + _e("; ".join(caption)) + "</figcaption>"
    if pos.size == 0:
        return f'<figure class="hist">{cap}</figure>'
    lv = np.log10(pos)
    lo, hi = float(lv.min()), float(lv.max())
    if draw_thr:
        lo, hi = min(lo, math.log10(thr)), max(hi, math.log10(thr))
    pad = 0.05 * (hi - lo) if hi > lo else 0.5
    lo, hi = lo - pad, hi + pad
    counts, edges = np.histogram(lv, bins=bins, range=(lo, hi))
    left, right, top, bottom = 48, 12, 22, 28
    pw, ph = width - left - right, height - top - bottom
    cmax = max(int(counts.max()), 1)

    def x(u: float) -> float:
        return left + (u - lo) / (hi - lo) * pw

    parts = [f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{_e(title)}"><title>{_e(title)}</title>']
    for c, a, b in zip(counts, edges[:-1], edges[1:]):
        if c:
            h = c / cmax * ph
            parts.append(f'<rect class="bar" x="{x(a):.1f}" y="{top + ph - h:.1f}" width="{max(x(b) - x(a) - 1, 1):.1f}" '
                         f'height="{h:.1f}"><title>{int(c)} runs in [{10 ** a:.3g}, {10 ** b:.3g})</title></rect>')
    y0 = top + ph
    parts.append(f'<line class="axis" x1="{left}" y1="{y0}" x2="{left + pw}" y2="{y0}"/>')
    parts.append(f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{y0}"/>')
    parts.append(f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{cmax}</text>')
    parts.append(f'<text x="{left - 4}" y="{y0}" text-anchor="end">0</text>')
    for t in _ticks(lo, hi):
        parts.append(f'<line class="axis" x1="{x(t):.1f}" y1="{y0}" x2="{x(t):.1f}" y2="{y0 + 4}"/>'
                     f'<text x="{x(t):.1f}" y="{y0 + 16}" text-anchor="middle">{10 ** t:.3g}</text>')
    if draw_thr:
        xt = x(math.log10(thr))
        parts.append(f'<line class="threshold" x1="{xt:.1f}" y1="{top - 8}" x2="{xt:.1f}" y2="{y0}">'
                     f'<title>threshold {thr:.6g}</title></line>'
                     f'<text x="{min(xt + 4, width - 4):.1f}" y="{top - 10}" '
                     f'text-anchor="{"start" if xt < left + 0.7 * pw else "end"}">threshold {thr:.4g}</text>')
    parts.append("</svg>")
    return f'<figure class="hist">{"".join(parts)}{cap}</figure>'


def _entry_rows(entry: Any) -> list[list[str]]:
    rows = []
    for name, cal in entry.statistics.items():  # every threshold is set: entry() raises for a refused one
        thr = float(cal.threshold)
        rows.append([_e(name), _g(thr, 6),
                     _e(cal.method), _g(cal.budget), str(int(cal.n)) if cal.n is not None else "-",
                     _e(cal.reason)])
    return rows


_RUN_LABELS = ("run_index", "shape", "seed")


def _nearest_rows(sub: Any, values: dict[str, np.ndarray], entry: Any, k: int) -> tuple[list[str], list[list[str]]]:
    """The ``k`` runs of ``sub`` with the largest decision value relative to its threshold."""
    names = list(values)
    thr = {n: float(entry.statistics[n].threshold) for n in names}
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.stack([np.where(np.isnan(values[n]), -np.inf, values[n] / thr[n]) if thr[n] > 0
                        else np.where(values[n] > 0, np.inf, 0.0) for n in names])
    worst = np.nan_to_num(rel.max(axis=0), nan=-np.inf)
    order = np.argsort(-worst, kind="stable")[:k]
    labels = [c for c in _RUN_LABELS if c in sub.coords or c in sub]
    if "seed" in labels and not (np.asarray(sub["seed"].values) >= 0).any():
        labels.remove("seed")  # runs recorded without a seed (-1)
    covs = [c for c in (entry.certificate or {}).get("covariates") or [] if isinstance(c, str) and c in sub]
    covs += [c for c in ("K",) if c in sub and c not in covs]
    errs = [c for c in ("max_abs", "max_ulp") if c in sub]
    head = ["rank", *labels, *covs, *errs, *[f"{n}" for n in names], "of threshold"]
    rows = []
    for r, i in enumerate(order, 1):
        row = [str(r)]
        row += [_e(np.asarray(sub[c].values)[i]) for c in labels]
        row += [_g(np.asarray(sub[c].values)[i]) for c in covs + errs]
        row += [_g(values[n][i]) for n in names]
        w = float(worst[i])
        row.append("-" if not math.isfinite(w) and w < 0 else ("inf" if math.isinf(w) else f"{100 * w:.1f}%"))
        rows.append(row)
    return head, rows


def _recall_html(power: Any, key: tuple[str, str, str]) -> str:
    """The power report's rows of one group (every rule): caught share per wrong output and
    the smallest caught scale error and offset."""
    from tolstat.assess.power import WRONG_OUTPUTS

    if power is None:
        return ('<p class="note">No recall table: pass references (<code>--corpus</code> or '
                '<code>--references REFS.npz</code>) to see what this decision catches.</p>')
    if key not in power.groups:
        return '<p class="note">No references of this group in the recall table.</p>'
    i = power.groups.index(key)
    d = power.data
    size = d.attrs["size"]
    lo, hi = d.attrs["bounds"]
    wrong = [f"{w} {size:g}" if w in ("scale", "offset") else w for w in WRONG_OUTPUTS]
    head = ["rule", *wrong, "smallest scale error", "smallest offset (x rms)", "passes zeros/constant"]
    rows = []
    for j, rule in enumerate(power.rules):
        caught = ["-" if math.isnan(float(c)) else f"{100 * float(c):.0f}%" for c in d["caught"].values[i, j]]

        def sz(v: float) -> str:
            v = float(v)
            return "-" if math.isnan(v) else (f"&gt; {hi:g}" if math.isinf(v) else
                                               (f"&lt;= {lo:g}" if v <= lo else f"{v:.2g}"))
        rows.append([_e(rule), *caught, sz(d["min_scale"].values[i, j]), sz(d["min_offset"].values[i, j]),
                     "YES" if bool(d["trivial_pass"].values[i, j]) else "no"])
    n_refs = int(d["n_references"].values[i])
    return (f'<p class="note">Share of {n_refs} references on which each standard wrong output fails '
            f'(smallest errors: caught on at least {100 * d.attrs["coverage"]:g}% of them).</p>'
            + _table(head, rows, "recall", text_cols=(0,)))


def table_report_html(table: ToleranceTable, errors: Any, *, power: Any = None, nearest: int = 5,
                      bins: int = 30, title: str | None = None) -> str:
    """The HTML page of ``table`` on the runs of ``errors`` (module docstring).

    Parameters
    ----------
    table : ToleranceTable
    errors : xarray.Dataset
        Error dataset (usually the one the table was calibrated on); its runs are matched
        to the table's groups by their ``op``, ``dtype`` and ``hardware`` labels, exactly.
    power : PowerReport, optional
        :func:`tolstat.assess.power.power_report` of the table, for the recall tables.
    nearest : int, default 5
        Runs listed per group, nearest the threshold first.
    bins : int, default 30
        Histogram bins.
    title : str, optional
        The page's title (default ``"tolstat table report"``).

    Returns
    -------
    str
        A complete HTML document.

    Raises
    ------
    TypeError
        ``table`` is not a :class:`ToleranceTable`.
    ValueError
        ``nearest`` or ``bins`` is not a positive integer, or ``errors`` is not an error dataset.
    """
    from tolstat.dataset.schema import validate

    if not isinstance(table, ToleranceTable):
        raise TypeError(f"table must be a ToleranceTable, got {type(table).__name__}")
    for name, v in (("nearest", nearest), ("bins", bins)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    ds = validate(errors)
    keys = [np.asarray(ds[k].values).astype(str) for k in ("op", "dtype", "hardware")]
    grouped = group_rows(keys)
    runs = {tuple(map(str, k)): idx for k, idx in zip(grouped.keys(), grouped.rows())}
    m = table.meta
    ttl = title or "tolstat table report"
    body = [f"<h1>{_e(ttl)}</h1>",
            f'<p>{len(table)} group{"s" * (len(table) != 1)}; false-positive budget {table.fp_budget:g} per check at confidence '
            f'{table.confidence:g}; form {_e(m.get("form"))}; budget split {_e(m.get("budget_split") or "-")}; '
            f'{ds.sizes["run"]} runs in the error dataset.</p>',
            '<p class="note">Decision value: the number a check compares with the threshold '
            '(<code>tolstat.check</code> fails when it is over it). Histograms: the decision values of the '
            "group's runs in the error dataset, log scale; the dashed line is the threshold.</p>"]
    unmatched = sorted(set(runs) - set(table.groups))
    if unmatched:
        body.append('<p class="note">Runs of groups the table does not have (not shown): '
                    + _e(", ".join(f"{o}/{d}/{h} ({runs[(o, d, h)].size})" for o, d, h in unmatched)) + "</p>")
    toc = []
    for gi, key in enumerate(table.groups):
        op, dt, hw = key
        anchor = f"group-{gi}"
        toc.append(f'<li><a href="#{anchor}">{_e(op)} / {_e(dt)} / {_e(hw)}</a></li>')
        sec = [f'<section class="group" id="{anchor}"><h2>{_e(op)} / {_e(dt)} / {_e(hw)}</h2>']
        try:
            entry = table.entry(op, dt, hw)
        except KeyError as exc:  # a group refused at calibration (select(..., on_error="skip"))
            msg = exc.args[0] if exc.args else exc
            sec.append(f'<p class="refused">Refused at calibration: a check of this group raises.</p>'
                       f'<p class="note">{_e(msg)}</p></section>')
            body.append("".join(sec))
            continue
        cert = entry.certificate or {}
        sec.append(f'<p>{entry.n} calibration runs; form {_e(cert.get("form", m.get("form")))}; '
                   f'budget {entry.fp_budget:g} at confidence {entry.confidence:g}.</p>')
        sec.append(_table(["statistic", "threshold", "method", "budget", "units", "reason"], _entry_rows(entry),
                          "entry", text_cols=(0, -1)))
        if cert.get("guarantee"):
            sec.append(f'<p class="note"><b>Guarantee.</b> {_e(cert["guarantee"])}</p>')
        idx = runs.get(key)
        if idx is None:
            sec.append('<p class="note">No runs of this group in the error dataset.</p>')
        else:
            sub = ds.isel(run=idx) if idx.size != ds.sizes["run"] else ds
            try:
                values = entry_run_values(sub, entry)
            except (KeyError, ValueError) as exc:
                sec.append(f'<p class="refused">The error dataset lacks what this decision needs: {_e(exc)}</p>')
                values = None
            if values is not None:
                for name, vals in values.items():
                    thr = float(entry.statistics[name].threshold)
                    sec.append(f"<h3>{_e(name)}: decision values of {vals.size} runs</h3>")
                    sec.append(histogram_svg(vals, thr, bins=bins, title=f"{op} {dt} {hw} {name}"))
                head, rows = _nearest_rows(sub, values, entry, nearest)
                sec.append(f"<h3>The {len(rows)} runs nearest the threshold</h3>")
                sec.append(_table(head, rows, "nearest", text_cols=range(1, 1 + sum(c in head for c in _RUN_LABELS))))
        sec.append("<h3>Recall</h3>" + _recall_html(power, key))
        sec.append("</section>")
        body.append("".join(sec))
    body.insert(3, "<nav><ul>" + "".join(toc) + "</ul></nav>")
    meta = json.dumps({"groups": len(table), "runs": int(ds.sizes["run"])})
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(ttl)}</title><meta name=\"tolstat-report\" content=\"{_e(meta)}\">"
            f"<style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")


def write_table_report(path: str | os.PathLike[str], table: ToleranceTable, errors: Any, **kwargs: Any) -> Path:
    """Write :func:`table_report_html` to ``path`` (atomically; ``.html``).

    Raises
    ------
    ValueError
        ``path`` does not end in ``.html``; and as :func:`table_report_html`.
    """
    if not os.fspath(path).lower().endswith((".html", ".htm")):
        raise ValueError(f"path must end in .html, got {os.fspath(path)!r}")
    return atomic_write_text(path, table_report_html(table, errors, **kwargs))
