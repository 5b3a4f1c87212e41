"""Reviewable tolerance tables: stable JSON layout, ``tolstat show`` and ``tolstat diff``.

A table is code a reviewer approves in a pull request, so its JSON file
(:meth:`tolstat.ToleranceTable.to_json`) is laid out for line diffs:

* keys in a fixed order: table settings, stable provenance, the groups (sorted by op,
  dtype, hardware), and last a ``"volatile"`` block with what changes on every run
  (``created``, ``host``, ``pid``, wherever they occur in the provenance, keyed by
  their dotted path);
* each group starts with ``"user_units"``: the max-error threshold as
  ``atol``/``rtol`` (``|actual - expected| <= atol + rtol*|expected|``) at the scale
  model's reference sizes (the reference value of each power covariate, 1 for each
  linear covariate; listed under ``"at"``), or a note when the statistic has no such
  form;
* a list of numbers (``top_scores``) and a small flat dict (``tail``) take one line each.

Tables written before this layout load unchanged (:func:`tolstat.load_table` reads
both; ``user_units`` and ``volatile`` are derived or informational).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["table_json", "user_units", "show_table", "diff_tables", "VOLATILE_KEYS"]

#: provenance keys that change on every run; written to the ``"volatile"`` block
VOLATILE_KEYS = ("created", "host", "pid")
_TOP_ORDER = ("tolstat_table", "tolstat_version", "fp_budget", "confidence", "form", "statistics",
              "budget_split", "checksum", "provenance", "groups")
_GROUP_ORDER = ("op", "dtype", "hardware", "n", "n_inexact", "user_units", "scale", "statistics", "certificate",
                "checksum")
_STAT_ORDER = ("threshold", "method", "budget", "confidence", "estimate", "reason", "tail", "top_scores")


#: ``json.dumps(v, allow_nan=False)`` with one encoder (dumps builds one per call for non-default options)
_STRICT = json.JSONEncoder(allow_nan=False)


def _f(v: Any) -> Any:
    v = float(v)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _split_volatile(obj: Any, path: str, out: dict[str, Any]) -> Any:
    if isinstance(obj, Mapping):
        keep = {}
        for k, v in obj.items():
            p = f"{path}.{k}" if path else str(k)
            if k in VOLATILE_KEYS and not isinstance(v, (Mapping, list)):
                out[p] = v
            elif k == "volatile" and isinstance(v, Mapping) and not path.count("."):
                out.update({str(a): b for a, b in v.items()})  # a block read back from a file
            else:
                keep[k] = _split_volatile(v, p, out)
        return keep
    if isinstance(obj, list):
        return [_split_volatile(v, f"{path}[{i}]", out) for i, v in enumerate(obj)]
    return obj


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _dump(obj: Any, indent: int, order: Sequence[str] = ()) -> str:
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, Mapping):
        if not obj:
            return "{}"
        if len(obj) <= 6 and all(_scalar(v) for v in obj.values()):
            return "{" + ", ".join(f"{json.dumps(str(k))}: {_STRICT.encode(v)}"
                                   for k, v in sorted(obj.items())) + "}"
        keys = [k for k in order if k in obj] + sorted(k for k in obj if k not in order)
        sub = {"groups": _GROUP_ORDER, "statistics": ()}
        parts = []
        for k in keys:
            child_order: Sequence[str] = ()
            if order is _GROUP_ORDER and k == "statistics":
                parts.append(f'{inner}{json.dumps(str(k))}: ' + _dump_stats(obj[k], indent + 1))
                continue
            if k in sub:
                child_order = sub[k]
            parts.append(f"{inner}{json.dumps(str(k))}: {_dump(obj[k], indent + 1, child_order)}")
        return "{\n" + ",\n".join(parts) + "\n" + pad + "}"
    if isinstance(obj, list):
        if all(_scalar(v) for v in obj):
            return "[" + ", ".join(_STRICT.encode(v) for v in obj) + "]"
        return "[\n" + ",\n".join(inner + _dump(v, indent + 1, order) for v in obj) + "\n" + pad + "]"
    return _STRICT.encode(obj)


def _dump_stats(stats: Mapping[str, Any], indent: int) -> str:
    pad, inner = " " * indent, " " * (indent + 1)
    parts = [f"{inner}{json.dumps(str(k))}: {_dump(stats[k], indent + 1, _STAT_ORDER)}" for k in stats]
    return "{\n" + ",\n".join(parts) + "\n" + pad + "}"


def user_units(table: Any, index: int) -> dict[str, Any]:
    """The max-error threshold of group ``index`` in user units (see the module docstring).

    Returns
    -------
    dict
        ``{"statistic", "atol", "rtol", "at"}``, or ``{"statistic", "note"}`` when the
        statistic has no allclose form (``max_ulp``, a baseline-relative scale) or the
        group has no threshold.
    """
    c = table._cols()
    op, dt, hw = c.groups[index]
    name = c.statistics[0]
    if name == "op_score":
        return _operator_units(table, index)
    sj = c.text("scale_json", index)
    at: dict[str, float] = {}
    if sj:
        sc = json.loads(sj)
        at.update({k: 1.0 for k in sc.get("linear", {})})
        at.update({k: float(v[1]) for k, v in sc.get("power", {}).items()})
    try:
        ent = table.entry(op, dt, hw)
        atol, rtol = ent.allclose(at)
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        return {"statistic": name, "note": str(msg)}
    return {"statistic": name, "atol": _f(atol), "rtol": _f(rtol), "at": {k: _f(v) for k, v in at.items()}}


def _operator_units(table: Any, index: int) -> dict[str, Any]:
    """User units of an operator-form threshold: what it allows per element and per statistic."""
    c = table._cols()
    thr = float(c.arrays["threshold"][index, 0])
    cj = c.text("certificate_json", index)
    cert = json.loads(cj) if cj else {}
    q = cert.get("normalisers", {})
    if not math.isfinite(thr) or not q:
        return {"statistic": "op_score", "note": "no threshold (refused)" if not math.isfinite(thr) else "no normalisers"}
    limits = {k: _f(thr * float(v)) for k, v in q.items()}
    note = (f"combined score S = max_j T_j / q_j <= {thr:.4g}; each operator statistic T_j (in units of the "
            "operator noise scale s_i, docs/noise.md) may reach its limit")
    if "op_max" in q:
        note += f"; per element |actual - expected| <= {thr * float(q['op_max']):.4g} * s_i"
    return {"statistic": "op_score", "note": note, "limits": limits}


def table_json(table: Any) -> str:
    """The reviewable JSON text of a :class:`~tolstat.ToleranceTable` (module docstring)."""
    doc = table.to_dict()
    volatile: dict[str, Any] = {}
    doc["provenance"] = _split_volatile(doc.get("provenance", {}), "provenance", volatile)
    groups = doc.pop("groups")
    sums = table.checksums()
    doc["checksum"] = sums["table"]
    for i, g in enumerate(groups):
        g["user_units"] = user_units(table, i)
        g["checksum"] = sums["groups"][i]
    order = sorted(range(len(groups)), key=lambda i: (groups[i]["op"], groups[i]["dtype"], groups[i]["hardware"]))
    doc["groups"] = [groups[i] for i in order]
    body = _dump(doc, 0, _TOP_ORDER)
    vol = _dump({k: volatile[k] for k in sorted(volatile)}, 1)
    return body[:-2] + ',\n "volatile": ' + vol + "\n}\n"


# --------------------------------------------------------------------------- show / diff
def _g(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def _rows(table: Any) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    c = table._cols()
    a = c.arrays
    out = {}
    for i, (op, dt, hw) in enumerate(c.groups):
        uu = user_units(table, i)
        sj, cj = c.text("scale_json", i), c.text("certificate_json", i)
        for j, s in enumerate(c.statistics):
            out[(op, dt, hw, s)] = {
                "threshold": float(a["threshold"][i, j]),
                "method": str(a["method"][i, j]),
                "budget": float(a["budget"][i, j]),
                "confidence": float(a["stat_confidence"][i, j]),
                "n": int(a["n"][i]),
                "atol": float(uu["atol"]) if j == 0 and "atol" in uu else math.nan,
                "rtol": float(uu["rtol"]) if j == 0 and "rtol" in uu else math.nan,
                # the group's decision fields besides the thresholds, on its first statistic's row
                "group": {"scale": json.loads(sj) if sj else None,
                          "certificate": json.loads(cj) if cj else None} if j == 0 else None,
            }
    return out


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w[j]) for j, c in enumerate(r)).rstrip() for r in rows]


def show_table(table: Any, *, name: str = "") -> str:
    """A readable per-group listing of a table (``tolstat show``).

    One line per (group, statistic): op, dtype, hardware, statistic, threshold, the
    max-error threshold in user units (``atol``/``rtol`` at reference sizes), method and
    calibration runs.
    """
    m = table.meta
    head = (f"tolstat table{' ' + name if name else ''}: {len(table)} groups, fp_budget={table.fp_budget:g} "
            f"per check at confidence {table.confidence:g}, form={m['form']}, "
            f"budget split {m['budget_split'] or '-'}")
    rows = [("op", "dtype", "hardware", "statistic", "threshold", "atol", "rtol", "method", "n")]
    for (op, dt, hw, s), r in sorted(_rows(table).items()):
        rows.append((op, dt, hw, s, _g(r["threshold"]), _g(r["atol"]), _g(r["rtol"]), r["method"], str(r["n"])))
    hws = sorted({h for _, _, h in table.groups})
    return "\n".join([head, f"hardware: {', '.join(hws)}"] + _columns(rows) + _certificate_lines(table))


def _certificate_lines(table: Any) -> list[str]:
    """Per group of a certified table (forms auto/operator): the form chosen, why, and the limits."""
    if "certificate_json" not in table.data:
        return []
    out = []
    cols = table._cols()
    for i, (op, dt, hw) in enumerate(cols.groups):
        cj = cols.text("certificate_json", i)
        if not cj:
            continue
        c = json.loads(cj)
        if not c.get("guarantee"):
            continue  # the tolstat.calibration.bounds path (bias, conformal, evt): its lines say it all
        pv = c.get("pool")
        n_pool = pv.get("size", 0) if isinstance(pv, dict) else len(pv or [])
        pool = f", pooled with {n_pool} groups" if n_pool else ""
        flags = f", flags {', '.join(c['flags'])}" if c.get("flags") else ""
        out.append(f"({op}, {dt}, {hw}): form {c['form']} ({c.get('form_reason', '')}); {c.get('method')}{pool}{flags}")
        uu = user_units(table, i)
        if "note" in uu:
            out.append(f"    {uu['note']}")
    return ["", "per group:"] + out if out else []


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b):
        return "-"
    if a == b:
        return "x1"
    return f"x{b / a:.4g}" if a > 0 else "new>0"


#: certificate fields that change a decision (tolstat.calibration.decision, tolstat.checks,
#: re-budgeting); the others (reason, guarantee, flags, counts of the fit) are prose or record
CERTIFICATE_DECISION_FIELDS = ("form", "method", "normalisers", "rowwise", "needs_magnitude", "magnitude",
                               "covariates", "n_scores")
#: scale-model fields that change a decision (tolstat.models.scale.ScaleModel.scale)
SCALE_DECISION_FIELDS = ("form", "atol", "rtol", "unit", "linear", "power", "baseline", "floor")


def _num(a: Any, b: Any) -> tuple[str, str]:
    """``old``, ``new`` as text: 4 significant digits, all digits where those would look equal."""
    def fmt(v: Any, full: bool) -> str:
        if isinstance(v, bool) or not isinstance(v, float):
            return str(v)
        return repr(v) if full else f"{v:.4g}"

    sa, sb = fmt(a, False), fmt(b, False)
    return (fmt(a, True), fmt(b, True)) if sa == sb else (sa, sb)


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _field_changes(prefix: str, fields: Sequence[str], a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``prefix field old -> new`` per changed field; mappings (normalisers, linear, power) key by key."""
    out = []
    for k in fields:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, Mapping) or isinstance(vb, Mapping):
            ma = va if isinstance(va, Mapping) else {}
            mb = vb if isinstance(vb, Mapping) else {}
            for key in list(ma) + [x for x in mb if x not in ma]:
                if key not in mb:
                    out.append(f"{prefix} {k}[{key!r}] removed ({ma[key]})")
                elif key not in ma:
                    out.append(f"{prefix} {k}[{key!r}] added ({mb[key]})")
                elif not _same(ma[key], mb[key]):
                    x, y = _num(ma[key], mb[key])
                    out.append(f"{prefix} {k}[{key!r}] {x} -> {y}")
        elif not _same(va, vb):
            x, y = _num(va, vb)
            out.append(f"{prefix} {k} {x} -> {y}")
    return out


def _group_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Changes of a group's scale model and certificate that alter a decision."""
    out = []
    sa, sb = a.get("scale"), b.get("scale")
    if (sa is None) != (sb is None):
        out.append(f"scale {sa['form'] if sa else 'none'} -> {sb['form'] if sb else 'none'}")
    elif sa is not None:
        out += _field_changes("scale", SCALE_DECISION_FIELDS, sa, sb)
    ca, cb = a.get("certificate") or {}, b.get("certificate") or {}
    out += _field_changes("certificate", CERTIFICATE_DECISION_FIELDS, ca, cb)
    return out


def decision_changes(old: Any, new: Any, errors: Any) -> list[dict[str, Any]]:
    """Per group of ``errors``, how the decisions of its runs differ between two tables.

    Each run is decided by each table exactly as :func:`tolstat.check_runs` decides it
    (:func:`tolstat.calibration.decision.entry_failed_runs` of the group's entry, looked up
    from the run's ``op``, ``dtype`` and ``hardware`` labels with the tables' fallbacks).

    Returns
    -------
    list of dict
        One per group of runs: ``op``, ``dtype``, ``hardware``, ``runs``, ``fail_old``,
        ``fail_new`` (counts, ``None`` where that table cannot decide the group),
        ``now_fail`` and ``now_pass`` (runs whose decision flips), and ``why_old`` /
        ``why_new`` (why a table cannot decide: no group, refused, a statistic missing).
    """
    from tolstat._base.util import group_rows
    from tolstat.calibration.decision import entry_failed_runs
    from tolstat.dataset.schema import validate

    ds = validate(errors)
    g = group_rows([np.asarray(ds[k].values).astype(str) for k in ("op", "dtype", "hardware")])
    out = []
    for (op, dt, hw), idx in zip(g.keys(), g.rows()):
        sub = ds.isel(run=idx) if idx.size != ds.sizes["run"] else ds
        rec: dict[str, Any] = {"op": str(op), "dtype": str(dt), "hardware": str(hw), "runs": int(idx.size)}
        fails = []
        for side, table in (("old", old), ("new", new)):
            try:
                f = entry_failed_runs(sub, table.entry(str(op), str(dt), str(hw)))
            except (KeyError, ValueError) as exc:
                f = None
                rec[f"why_{side}"] = str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
            rec[f"fail_{side}"] = None if f is None else int(f.sum())
            fails.append(f)
        fo, fn = fails
        both = fo is not None and fn is not None
        rec["now_fail"] = int((~fo & fn).sum()) if both else None
        rec["now_pass"] = int((fo & ~fn).sum()) if both else None
        out.append(rec)
    return out


def _decision_lines(changes: list[dict[str, Any]]) -> list[str]:
    lines = ["  decisions on the runs of the error dataset (as tolstat.check_runs decides them):"]
    for c in changes:
        head = f"    {c['op']}/{c['dtype']}/{c['hardware']}: {c['runs']} runs; "
        if c["fail_old"] is None or c["fail_new"] is None:
            side = "old" if c["fail_old"] is None else "new"
            lines.append(head + f"the {side} table cannot decide them ({c['why_' + side]})")
            continue
        flips = c["now_fail"] + c["now_pass"]
        lines.append(head + f"fail {c['fail_old']} -> {c['fail_new']}; "
                     + (f"{flips} decisions change ({c['now_fail']} now fail, {c['now_pass']} now pass)" if flips
                        else "no decision changes"))
    return lines


def diff_tables(old: Any, new: Any, *, names: tuple[str, str] = ("OLD", "NEW"), changed_only: bool = False,
                errors: Any = None) -> str:
    """What changed between two tables, per group (``tolstat diff``), for a pull request.

    Table-level settings that differ, then one line per (group, statistic): the
    threshold ``old -> new`` with their ratio, the user-unit ``atol`` where it changed,
    method, budget and run-count changes, and on the group's first statistic every
    change of a field that alters a decision: the scale model
    (:data:`SCALE_DECISION_FIELDS`: form, coefficients, covariates) and the certificate
    (:data:`CERTIFICATE_DECISION_FIELDS`: normalisers key by key, method, form, ...), each
    as ``field old -> new``; ``+``/``-`` for added/removed groups, ``~`` for changed
    ones, ``=`` for unchanged ones (left out with ``changed_only``). With ``errors`` (an
    error dataset, e.g. the calibration runs), per group of its runs how many decisions
    the change flips (:func:`decision_changes`).
    """
    lines = [f"tolstat diff {names[0]} -> {names[1]}"]
    mo, mn = old.meta, new.meta
    for k in ("fp_budget", "confidence", "form", "statistics", "budget_split"):
        if mo.get(k) != mn.get(k):
            lines.append(f"  table {k}: {mo.get(k)!r} -> {mn.get(k)!r}")
    ro, rn = _rows(old), _rows(new)
    rows = []
    n_same = n_thr = 0
    for key in sorted(set(ro) | set(rn)):
        op, dt, hw, s = key
        where = (op, dt, hw, s)
        if key not in rn:
            r = ro[key]
            rows.append(("-", *where, _g(r["threshold"]), "", f"removed ({r['method']}, n={r['n']})"))
            continue
        if key not in ro:
            r = rn[key]
            rows.append(("+", *where, _g(r["threshold"]), "", f"added ({r['method']}, n={r['n']})"))
            continue
        a, b = ro[key], rn[key]
        notes = []
        if a["method"] != b["method"]:
            notes.append(f"method {a['method']} -> {b['method']}")
        if a["budget"] != b["budget"] or a["confidence"] != b["confidence"]:
            notes.append(f"budget {a['budget']:.4g} -> {b['budget']:.4g} at {a['confidence']:.4g} -> "
                         f"{b['confidence']:.4g}")
        if a["n"] != b["n"]:
            notes.append(f"n {a['n']} -> {b['n']}")
        if a["atol"] != b["atol"] and not (math.isnan(a["atol"]) and math.isnan(b["atol"])):
            notes.append(f"atol {_g(a['atol'])} -> {_g(b['atol'])}")
        if a["group"] is not None and b["group"] is not None:
            notes += _group_changes(a["group"], b["group"])
        same_thr = a["threshold"] == b["threshold"] or (math.isnan(a["threshold"]) and math.isnan(b["threshold"]))
        if same_thr and not notes:
            n_same += 1
            if changed_only:
                continue
        n_thr += not same_thr
        rows.append(("=" if same_thr and not notes else "~", *where, f"{_g(a['threshold'])} -> {_g(b['threshold'])}",
                     _ratio(a["threshold"], b["threshold"]), "; ".join(notes)))
    if rows:
        lines += ["  " + r for r in _columns([("", "op", "dtype", "hardware", "statistic", "threshold", "ratio",
                                                "changes")] + rows)]
    lines.append(f"{sum(r[0] != '=' for r in rows)} changed ({n_thr} thresholds), {n_same} unchanged "
                 "(group, statistic) entries")
    if errors is not None:
        lines += _decision_lines(decision_changes(old, new, errors))
    return "\n".join(lines)
