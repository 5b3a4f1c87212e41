"""Markdown report of an evaluation (``tolstat report``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tolstat._base.util import atomic_write_text
from tolstat._base.util import percent as _pct

__all__ = ["write_report", "markdown_report"]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def markdown_report(doc: dict[str, Any], plots: list[str]) -> str:
    """Render the JSON written by ``tolstat evaluate`` as Markdown."""
    cfg = doc["config"]
    lines = [
        "# tolstat evaluation",
        "",
        f"tolstat {doc['tolstat_version']}; {doc['counts']['controls']} control checks, "
        f"{doc['counts']['buggy']} buggy checks; fp_budget={cfg['fp_budget']:g}, "
        f"confidence={cfg['confidence']:g}, n_cal={cfg['n_cal']}, n_test={cfg['n_test']}, "
        f"dtypes={', '.join(cfg['dtypes'])}; {doc['seconds']:.0f} s.",
        "",
        "## Methods",
        "",
        _md_table(["method", "family", "budget", "rule"],
                  [[m["name"], m["family"], "-" if m["budget"] is None else f"{m['budget']:g}", m["rule"]]
                   for m in doc["methods"]]),
        "",
        "## Recall and false positives",
        "",
        _md_table(
            ["method", "recall (all)", "recall (detectable)", "false positives", "FP rate (upper bound)", "tightness"],
            [[r["method"], f"{r['caught']}/{r['n_bug']} ({100 * r['recall']:.1f}%)",
              f"{r['caught_detectable']}/{r['n_detectable']} ({100 * r['recall_detectable']:.1f}%)",
              f"{r['fp']}/{r['n_control']}", f"{100 * r['fp_rate']:.2f}% ({100 * r['fp_rate_ub']:.2f}%)",
              f"{r['tightness']:.3f}"] for r in doc["summary"]],
        ),
        "",
        "Tightness: median over correct controls of (check statistic / threshold); 1 means a "
        "correct run uses its whole tolerance, small values mean a loose tolerance.",
        "",
    ]
    names = [m["name"] for m in doc["methods"]]
    lines += ["## Recall per bug kind", "",
              _md_table(["bug", "op", "category", "n", "detectable", *names],
                        [[b["bug"], b["op"], b["category"], str(b["n"]), str(b["n_detectable"]),
                          *(f"{100 * b[n]:.0f}%" for n in names)] for b in doc["per_bug"]]),
              "", "## Per op (recall / false positives)", "",
              _md_table(["op", *names],
                        [[o["op"], *(f"{100 * o[n + ' recall']:.0f}% / {o[n + ' fp']}" for n in names)]
                         for o in doc["per_op"]]),
              ""]
    if doc.get("skipped_methods"):
        lines += ["## Not compared", "",
                  _md_table(["method", "why"], [[k, v] for k, v in doc["skipped_methods"].items()]), ""]
    if doc.get("partial"):
        lines += ["Partly calibrated: measured only on the checks of the groups that got a threshold "
                  "(not comparable with the tables above).", "",
                  _md_table(["method", "groups refused", "recall (detectable, covered)", "FP (covered, upper bound)",
                             "checks without threshold"],
                            [[r["method"], f"{r['groups_refused']}/{r['groups']}",
                              f"{r['caught_detectable']}/{r['n_detectable']} ({_pct(r['recall_detectable'], 1)})",
                              f"{r['fp']}/{r['n_control']} ({_pct(r['fp_rate_ub'], 2)})",
                              f"{r['uncovered_controls']} controls, {r['uncovered_detectable']} detectable"]
                             for r in doc["partial"]]), ""]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    return "\n".join(lines)


def write_report(results_dir: str | os.PathLike[str]) -> Path:
    """Write ``report.md`` next to ``results.json`` in an evaluation folder.

    Raises
    ------
    FileNotFoundError
        If the folder has no ``results.json``.
    ValueError
        If ``results.json`` is not an evaluation result.
    """
    d = Path(results_dir)
    if d.is_file():  # the results.json itself
        d = d.parent
    src = d / "results.json"
    if not src.exists():
        raise FileNotFoundError(f"no results.json in {os.fspath(d)!r}: run 'tolstat evaluate' first")
    plots = sorted(p.name for p in d.glob("*.png"))
    try:
        doc = json.loads(src.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise TypeError(f"top level is a {type(doc).__name__}, not an object")
        text = markdown_report(doc, plots)
    except RecursionError:
        raise ValueError(f"{os.fspath(src)!r} is not a tolstat evaluation result: nested too deeply") from None
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{os.fspath(src)!r} is not a tolstat evaluation result ({what})") from exc
    return atomic_write_text(d / "report.md", text)
