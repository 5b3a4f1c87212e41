"""Evaluate tolerance methods on the embedded kernel corpus: recall and false positives.

The last step of the data flow: it uses every other step (corpus kernels -> metrics ->
error dataset -> selection -> checks) and compares tolstat's budgeted thresholds with the
static tolerances used in practice, side by side.

Protocol
--------
1. **Calibration.** For each (op, dtype), ``n_cal`` cases (seed ``seed``) are run through
   every correct variant of the op; the errors form an error dataset (``from_pairs``).
2. **Test.** ``n_test`` fresh cases (seed ``seed + 1``) are run through every correct
   variant (*controls*) and every bug of the op (*buggy*), paired on the same inputs;
   both form error datasets too (:func:`tolstat.assess.corpus_runs.heldout_datasets`).
3. **Methods.** The rules of :mod:`tolstat.assess.rules` (static baselines, the peers'
   rules, the study's rule, ``tolstat.select``), through the steps of the per-fold core of ``tolstat compare``
   (:func:`tolstat.assess.rules.calibrate_and_score`) with one fold, the test checks
   scored one (op, dtype) at a time as they are made: each calibrates on
   the calibration dataset only, per (op, dtype), and scores every test check from its
   error dataset (check statistic / threshold; flagged when > 1). Static rules ignore
   the calibration data.
4. **Report.** Recall over all buggy checks and over *detectable* ones (the buggy output
   differs from its paired correct output by more than one ULP somewhere), realised
   false-positive rate on the held-out controls (with a one-sided Clopper-Pearson
   upper bound), the promised budget, and tightness: the median, over controls, of the
   check statistic as a fraction of its threshold (1 = the tolerance is fully used).

This module holds :func:`evaluate` with its settings (:class:`EvalConfig`) and result
(:class:`EvalResult`), the methods compared by default (:func:`default_methods`) and the
text tables of a result; the corpus runs of steps 1 and 2 are
:mod:`tolstat.assess.corpus_runs`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr

from tolstat.assess.corpus_runs import _heldout_parts, _ops, calibration_dataset
from tolstat.assess.methods import tolstat_methods
from tolstat._base import validate as _validate
from tolstat._base.inference import clopper_pearson_upper
from tolstat._base.util import atomic_write, atomic_write_text
from tolstat._base.util import percent as _pct
from tolstat._version import __version__
from tolstat.assess.rules import (TORCH_DEFAULTS, DynamoSameRule, FlashAttentionRule, FoldOutcome, GpucheckRule, Rule,
                                  StaticRule, StudyRule, make_rule)

__all__ = [
    "EvalConfig",
    "EvalResult",
    "evaluate",
    "default_methods",
]

#: thresholds are per (op, dtype), pooled over the one corpus hardware label
BY = ("op", "dtype")
#: evaluation protocols: ``"op"`` calibrates every method per (op, dtype) over all correct
#: variants; ``"kernel"`` per (op, dtype, variant), a buggy kernel checked against the
#: thresholds of the correct kernel it modifies
PROTOCOLS = ("op", "kernel")


# --------------------------------------------------------------------------- methods
def default_methods() -> list[Rule]:
    """Static baselines, the peers' rules (torch dynamo's ``same``, FlashAttention's test
    rule and gpucheck's defaults; the eager kernel of the first two is the op's plain
    variant, :func:`tolstat.assess.corpus_runs.eager_variant`), the study's rule and the
    tolstat methods (:func:`tolstat_methods`)."""
    return [
        StaticRule("torch defaults", TORCH_DEFAULTS),
        StaticRule("atol=rtol=1e-2", {d: (1e-2, 1e-2) for d in TORCH_DEFAULTS}),
        DynamoSameRule("dynamo same"),
        FlashAttentionRule("flash-attn 2x eager"),
        GpucheckRule("gpucheck"),
        StudyRule("study p95x1.5"),
        *tolstat_methods(),
    ]


# --------------------------------------------------------------------------- config
@dataclass
class EvalConfig:
    """Settings of an evaluation run.

    Attributes
    ----------
    ops : list of str, optional
        Operators (default: all of the corpus).
    dtypes : tuple of str
        Storage dtypes.
    n_cal : int
        Calibration cases per (op, dtype); each runs through every correct variant.
    n_test : int
        Test cases per (op, dtype); each runs through every variant and every bug.
    fp_budget : float
        False-positive budget per check for the tolstat methods.
    confidence : float
        Confidence of the tolstat thresholds.
    seed : int
        Calibration seed; the test cases use ``seed + 1``.
    quick : bool
        Small shapes only.
    protocol : {"op", "kernel"}
        ``"op"`` (default): every calibrated method (the study's rule and tolstat's) gets
        one threshold per (op, dtype), calibrated on the runs of all the op's correct
        variants: the setting of a new kernel (e.g. one written by a model) tested against
        an operator's known implementations. ``"kernel"``: one per (op, dtype, variant),
        calibrated on that variant's own correct runs, and a buggy kernel is checked
        against the thresholds of the correct variant it modifies: the setting of a
        kernel author who changes a known-good kernel (regression testing).
    """

    ops: list[str] | None = None
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    n_cal: int = 400
    n_test: int = 50
    fp_budget: float = 1e-2
    confidence: float = 0.95
    seed: int = 0
    quick: bool = False
    protocol: str = "op"

    def __post_init__(self) -> None:
        from tolstat import corpus

        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")

        _validate.count("n_cal", self.n_cal)
        _validate.count("n_test", self.n_test)
        _validate.budget("fp_budget", self.fp_budget)
        _validate.unit_interval("confidence", self.confidence)
        if self.ops is not None:
            unknown = sorted(set(self.ops) - set(corpus.OPS))
            if unknown or not self.ops:
                raise ValueError(f"unknown op(s) {unknown or self.ops}; known: {sorted(corpus.OPS)}")
        from tolstat._base.dtypes import canonical_dtype

        self.dtypes = tuple(canonical_dtype(d) for d in self.dtypes)
        if not self.dtypes:
            raise ValueError("dtypes must name at least one dtype")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "EvalConfig":
        """``"default"`` (the main job), ``"quick"`` (about a minute), ``"tiny"`` (tests)."""
        presets = {
            "default": {},
            "quick": {"n_cal": 400, "n_test": 12, "quick": True},
            "tiny": {"n_cal": 40, "n_test": 3, "quick": True, "fp_budget": 0.1},
        }
        if name not in presets:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(presets)}")
        kw = dict(presets[name])
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)


# --------------------------------------------------------------------------- scoring
def _fit_and_score(rules: Sequence[Rule], cal: xr.Dataset, cfg: EvalConfig, progress: bool | None
                   ) -> tuple[list[FoldOutcome], xr.Dataset, xr.Dataset | None]:
    """:func:`tolstat.assess.rules.calibrate_and_score` of every rule on ``cal`` and the
    held-out checks, which are made and scored one (op, dtype) at a time (their element
    samples are never all in memory; a run's score depends on that run alone).

    Returns the outcomes and the labels (:data:`_CHECK_LABELS`) of the controls and of
    the bugs (None without bugs), in the order of :func:`tolstat.assess.corpus_runs.heldout_datasets`.
    """
    kernel = cfg.protocol == "kernel"
    by = BY + ("hardware",) if kernel else BY
    if kernel:
        cal = _kernel_groups(cal)
    fits: list[tuple[Any, str]] = []
    for rule in rules:
        try:
            fits.append((rule.fit(cal, budget=cfg.fp_budget, confidence=cfg.confidence, by=by), ""))
        except ValueError as exc:
            fits.append((None, str(exc) or "refused"))
    ratios: list[list[np.ndarray]] = [[] for _ in rules]
    buggy_ratios: list[list[np.ndarray]] = [[] for _ in rules]
    ctrl_labels: list[xr.Dataset] = []
    bug_labels: list[xr.Dataset] = []
    for controls, buggy in _heldout_parts(cfg, progress):
        if kernel:
            controls = _kernel_groups(controls)
            buggy = None if buggy is None else _kernel_groups(buggy)
        for j, (fitted, _) in enumerate(fits):
            if fitted is not None:
                ratios[j].append(fitted.score(controls))
                if buggy is not None:
                    buggy_ratios[j].append(fitted.score(buggy))
        ctrl_labels.append(_labels_only(controls))
        if buggy is not None:
            bug_labels.append(_labels_only(buggy))
        del controls, buggy
    nc = sum(d.sizes["run"] for d in ctrl_labels)
    nb = sum(d.sizes["run"] for d in bug_labels)
    outcomes = []
    for j, (fitted, err) in enumerate(fits):
        if fitted is None:
            outcomes.append(FoldOutcome({}, {}, np.full(nc, np.nan), np.full(nb, np.nan), err))
            continue
        r = np.concatenate(ratios[j]) if nc else np.empty(0)
        b = np.concatenate(buggy_ratios[j]) if nb else np.empty(0)
        outcomes.append(FoldOutcome(fitted.thresholds, fitted.reasons, r, b))
    bugs = xr.concat(bug_labels, dim="run") if bug_labels else None
    return outcomes, xr.concat(ctrl_labels, dim="run"), bugs


def _labels_only(ds: xr.Dataset) -> xr.Dataset:
    """The label variables of a check dataset that :func:`_checks_dataset` reads."""
    names = sorted(set(_CHECK_LABELS.values()))
    return xr.Dataset({n: ("run", np.asarray(ds[n].values)) for n in names})


@dataclass
class EvalResult:
    """Outcome of :func:`evaluate`.

    Attributes
    ----------
    config : EvalConfig
    checks : xarray.Dataset
        One entry per test check (dim ``check``): op, dtype, kind (``control``/``bug``),
        bug, category, variant, detectable, and ``score`` (check, method): the check
        statistic as a fraction of each method's threshold (flagged when > 1).
    summary : list of dict
        One row per method: recall (all, detectable), false positives, budget, tightness.
    calibration : xarray.Dataset
        The calibration error dataset.
    methods : list of Rule
        The compared rules (:mod:`tolstat.assess.rules`), calibrated per (op, dtype).
    seconds : float
        Wall time.
    per_bug, per_op : list of dict
        Recall per bug kind and per op, false positives per op.
    skipped : dict
        Methods that could not be calibrated (too few runs for the budget) and why;
        they are left out of the comparison.
    partial : list of dict
        The skipped methods that got thresholds for some groups, measured on the checks
        of those groups only (:func:`partial_table`): refused and covered groups, false
        positives, detectable recall (all and per category) on the covered checks, and
        the checks left without a threshold. Not comparable with ``summary``, whose
        methods are measured on every check.
    thresholds : dict
        ``{method: {(op, dtype): threshold}}`` of the methods whose thresholds are of
        the run's max absolute error (``Rule.unit == "max_abs"``; for plots).
    """

    config: EvalConfig
    checks: xr.Dataset
    summary: list[dict[str, Any]]
    calibration: xr.Dataset
    methods: list[Rule]
    seconds: float
    per_bug: list[dict[str, Any]] = field(default_factory=list)
    per_op: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    thresholds: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    partial: list[dict[str, Any]] = field(default_factory=list)

    def budget_of(self, method: Rule) -> float | None:
        """The false-positive budget ``method`` promises (None for rules that promise none)."""
        return self.config.fp_budget if method.budgeted else None

    def threshold_for(self, method: str, op: str, dtype: str) -> float | None:
        """The max_abs threshold of ``method`` for (op, dtype), or None."""
        return self.thresholds.get(method, {}).get((op, dtype))

    def table(self) -> str:
        """The side-by-side table, as printed by ``tolstat evaluate``."""
        head = ("method", "budget", "recall", "recall(detectable)", "FP", "FP rate", "FP UB",
                "tightness")
        rows = [head]
        for r in self.summary:
            rows.append((
                r["method"],
                "-" if r["budget"] is None else f"{r['budget']:g}",
                f"{r['caught']}/{r['n_bug']} ({100 * r['recall']:.1f}%)",
                f"{r['caught_detectable']}/{r['n_detectable']} ({100 * r['recall_detectable']:.1f}%)",
                f"{r['fp']}/{r['n_control']}",
                f"{100 * r['fp_rate']:.2f}%",
                f"{100 * r['fp_rate_ub']:.2f}%",
                f"{r['tightness']:.3f}",
            ))
        return _fmt_rows(rows)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write config, summary, per-bug and per-op tables as JSON (atomically)."""
        doc = {
            "tolstat_version": __version__,
            "config": self.config.__dict__,
            "seconds": self.seconds,
            "methods": [{"name": m.name, "family": m.family, "budget": self.budget_of(m),
                         "rule": m.describe_at(self.config.fp_budget, self.config.confidence)}
                        for m in self.methods],
            "summary": self.summary,
            "per_bug": self.per_bug,
            "per_op": self.per_op,
            "skipped_methods": self.skipped,
            "partial": self.partial,
            "counts": {"controls": int((self.checks.kind == "control").sum()),
                       "buggy": int((self.checks.kind == "bug").sum())},
        }
        return atomic_write_text(path, json.dumps(doc, indent=2, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(type(o).__name__)


def _fmt_rows(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def evaluate(
    config: EvalConfig | None = None,
    *,
    methods: Sequence[Rule | str | Mapping[str, Any]] | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Run the evaluation protocol (module docstring) and return the result.

    Parameters
    ----------
    config : EvalConfig, optional
        Defaults to ``EvalConfig()`` (the main job).
    methods : list, optional
        Rules, or names / dicts for :func:`tolstat.assess.rules.make_rule`, with distinct
        names. Defaults to :func:`default_methods`.
    progress : bool, optional
        Progress bars; default only on a terminal.

    Returns
    -------
    EvalResult
    """
    from threadpoolctl import threadpool_limits

    # the corpus's arrays are small: multi-threaded BLAS only adds contention
    with threadpool_limits(limits=1, user_api="blas"):
        return _evaluate(config or EvalConfig(), methods, progress)


def _evaluate(cfg: EvalConfig, methods: Sequence[Any] | None, progress: bool | None) -> EvalResult:
    t0 = time.perf_counter()
    _ops(cfg)
    rules = [make_rule(m) for m in methods] if methods is not None else default_methods()
    names = [r.name for r in rules]
    if not rules or len(set(names)) != len(names):
        raise ValueError(f"methods must be a non-empty list with distinct names, got {names}")
    cal = calibration_dataset(cfg, progress=progress)
    # each held-out (op, dtype) is scored as it is made: its samples are then dropped
    outcomes, controls, bugs = _fit_and_score(rules, cal, cfg, progress)
    rules, scores, thresholds, skipped, part = _score_methods(rules, outcomes, cfg)
    checks = _checks_dataset(controls, bugs, scores, rules)
    summary, per_bug, per_op = _summaries(checks, rules, cfg.fp_budget, cfg.confidence)
    partial = [_partial_summary(checks, name, col, refused, groups, cfg.confidence)
               for name, (col, refused, groups) in part.items()]
    return EvalResult(cfg, checks, summary, cal, rules, time.perf_counter() - t0, per_bug, per_op, skipped,
                      thresholds, partial)


def _kernel_groups(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with each run's variant joined to its hardware label, so that every rule's
    grouping by (op, dtype, hardware) is one group per kernel (protocol ``"kernel"``; a
    buggy run carries the variant it modifies)."""
    hw = np.asarray(ds["hardware"].values).astype(str)
    var = np.asarray(ds["variant"].values).astype(str)
    return ds.assign_coords(hardware=("run", np.char.add(np.char.add(hw, "|"), var)))


def _score_methods(rules: Sequence[Rule], outcomes: Sequence[FoldOutcome], cfg: EvalConfig
                   ) -> tuple[list[Rule], np.ndarray, dict[str, dict[tuple[str, str], float]], dict[str, str],
                              dict[str, tuple[np.ndarray, int, int]]]:
    """The scores of the held-out checks (controls, then bugs) of each rule calibrated on
    the calibration dataset (``outcomes``, from :func:`_fit_and_score`).

    A rule that cannot be calibrated for every (op, dtype) is skipped (loudly, with the
    reason), as it cannot be compared on every check. A skipped rule that refused only
    some groups is returned in the last item, ``{name: (scores, refused, groups)}``
    (NaN scores where its group has no threshold), to be measured on the checks it covers.
    """
    kept: list[Rule] = []
    cols: list[np.ndarray] = []
    thresholds: dict[str, dict[tuple[str, str], float]] = {}
    skipped: dict[str, str] = {}
    partial: dict[str, tuple[np.ndarray, int, int]] = {}
    for rule, out in zip(rules, outcomes):
        col = np.concatenate([out.ratios, out.buggy_ratios])
        why = out.error or next(iter(out.reasons.values()), "")
        if out.reasons and not out.error:
            why = f"{len(out.reasons)} of {len(out.thresholds)} groups refused, e.g. {why}"
            if len(out.reasons) < len(out.thresholds) and not np.isnan(col).all():
                partial[rule.name] = (col, len(out.reasons), len(out.thresholds))
        if not why and np.isnan(col).any():
            why = f"no threshold for {int(np.isnan(col).sum())} of {col.size} test checks"
        if why:
            skipped[rule.name] = why
            print(f"tolstat evaluate: skipping {rule.name!r}: {why}", file=sys.stderr, flush=True)
            continue
        kept.append(rule)
        cols.append(col)
        if rule.unit == "max_abs" and cfg.protocol == "op":  # per-kernel thresholds are not plotted
            thresholds[rule.name] = {(op, dt): t for (op, dt, _), t in out.thresholds.items()}
    if not kept:
        raise ValueError("no method could be calibrated: " + "; ".join(skipped.values()))
    return kept, np.column_stack(cols), thresholds, skipped, partial


def _partial_summary(checks: xr.Dataset, name: str, col: np.ndarray, refused: int, groups: int,
                     confidence: float) -> dict[str, Any]:
    """One row of :attr:`EvalResult.partial`: ``name`` measured on the checks its thresholds cover."""
    covered = ~np.isnan(col)
    flagged = col > 1.0  # NaN compares False
    ctrl = (checks.kind == "control").values
    det = (checks.kind == "bug").values & np.asarray(checks.detectable.values, dtype=bool)
    cat = np.asarray(checks.category.values).astype(str)
    nc, nd = int((ctrl & covered).sum()), int((det & covered).sum())
    fp, caught = int((flagged & ctrl).sum()), int((flagged & det).sum())
    per_cat = {}
    for c in sorted(set(cat[det].tolist())):
        sel = det & covered & (cat == c)
        per_cat[c] = float(flagged[sel].mean()) if sel.any() else float("nan")
    return {
        "method": name, "groups": groups, "groups_refused": refused,
        "n_control": nc, "fp": fp, "fp_rate": fp / nc if nc else float("nan"),
        "fp_rate_ub": clopper_pearson_upper(fp, nc, confidence), "fp_rate_ub_level": confidence,
        "n_detectable": nd, "caught_detectable": caught,
        "recall_detectable": caught / nd if nd else float("nan"),
        "recall_detectable_per_category": per_cat,
        "uncovered_controls": int((ctrl & ~covered).sum()), "uncovered_detectable": int((det & ~covered).sum()),
    }


def partial_table(result: EvalResult) -> str:
    """The partly calibrated methods (:attr:`EvalResult.partial`) as text: each measured on
    the checks of the groups it has thresholds for, so not comparable with :meth:`EvalResult.table`."""
    cats = sorted({c for r in result.partial for c in r["recall_detectable_per_category"]})
    rows = [("method", "groups refused", "recall(detectable, covered)", *cats, "FP (covered)", "FP rate",
             "FP UB", "checks without threshold")]
    for r in result.partial:
        pc = r["recall_detectable_per_category"]
        rows.append((
            r["method"], f"{r['groups_refused']}/{r['groups']}",
            f"{r['caught_detectable']}/{r['n_detectable']} ({_pct(r['recall_detectable'], 1)})",
            *(_pct(pc.get(c, math.nan), 1) for c in cats),
            f"{r['fp']}/{r['n_control']}", _pct(r["fp_rate"], 2), _pct(r["fp_rate_ub"], 2),
            f"{r['uncovered_controls']} controls, {r['uncovered_detectable']} detectable",
        ))
    return _fmt_rows(rows)


#: labels of a test check, in the order of the checks dataset: {check label: dataset label}
_CHECK_LABELS = {k: k for k in ("op", "dtype", "kind", "variant", "bug", "category", "detectable", "shape", "dist")}
_CHECK_LABELS["scale"] = "input_scale"


def _checks_dataset(controls: xr.Dataset, bugs: xr.Dataset | None, scores: np.ndarray,
                    methods: Sequence[Rule]) -> xr.Dataset:
    """One entry per test check (controls, then bugs): labels and ``score`` (check, method)."""
    parts = [controls] if bugs is None else [controls, bugs]
    coords: dict[str, Any] = {"method": [m.name for m in methods]}
    for key, label in _CHECK_LABELS.items():
        vals = np.concatenate([np.asarray(d[label].values).astype(str) for d in parts])
        coords[key] = ("check", vals == "True" if key == "detectable" else vals)
    return xr.Dataset({"score": (("check", "method"), scores)}, coords=coords,
                      attrs={"meaning": "check statistic / threshold; flagged when > 1"})


def _summaries(checks: xr.Dataset, methods: Sequence[Rule], fp_budget: float, confidence: float):
    flagged = checks.score > 1.0
    ctrl = (checks.kind == "control").values
    bug = (checks.kind == "bug").values
    det = bug & checks.detectable.values
    summary = []
    for j, m in enumerate(methods):
        f = flagged.values[:, j]
        fp, nc = int(f[ctrl].sum()), int(ctrl.sum())
        s = checks.score.values[ctrl, j]
        summary.append({
            "method": m.name, "family": m.family, "budget": fp_budget if m.budgeted else None,
            "n_bug": int(bug.sum()), "caught": int(f[bug].sum()),
            "recall": float(f[bug].mean()) if bug.any() else float("nan"),
            "n_detectable": int(det.sum()), "caught_detectable": int(f[det].sum()),
            "recall_detectable": float(f[det].mean()) if det.any() else float("nan"),
            "n_control": nc, "fp": fp, "fp_rate": fp / nc if nc else float("nan"),
            "fp_rate_ub": clopper_pearson_upper(fp, nc, confidence), "fp_rate_ub_level": confidence,
            "tightness": float(np.median(s[np.isfinite(s)])) if np.isfinite(s).any() else float("nan"),
        })
    per_bug = []
    for name in sorted(set(checks.bug.values[bug].tolist())):
        sel = bug & (checks.bug.values == name)
        row = {"bug": name, "op": str(checks.op.values[sel][0]),
               "category": str(checks.category.values[sel][0]), "n": int(sel.sum()),
               "n_detectable": int((sel & det).sum())}
        for j, m in enumerate(methods):
            row[m.name] = float(flagged.values[sel, j].mean())
        per_bug.append(row)
    per_op = []
    for op in sorted(set(checks.op.values.tolist())):
        row = {"op": op}
        so = checks.op.values == op
        for j, m in enumerate(methods):
            row[f"{m.name} recall"] = float(flagged.values[so & bug, j].mean()) if (so & bug).any() else float("nan")
            row[f"{m.name} fp"] = int(flagged.values[so & ctrl, j].sum())
        per_op.append(row)
    return summary, per_bug, per_op


def per_category_table(result: EvalResult) -> str:
    """Detectable-bug recall per bug category (subtle / shape / gross ...) and method, as text."""
    checks = result.checks
    names = [str(m) for m in checks["method"].values]
    det = (checks.kind == "bug").values & np.asarray(checks.detectable.values, dtype=bool)
    flagged = checks.score.values > 1.0
    rows = [("category", "detectable", *names)]
    cats = sorted(set(checks.category.values[det].tolist()))
    for cat in cats + ["all"]:
        sel = det & ((checks.category.values == cat) if cat != "all" else True)
        rows.append((cat, str(int(sel.sum())),
                     *(f"{100 * flagged[sel, j].mean():.1f}%" if sel.any() else "-" for j in range(len(names)))))
    return _fmt_rows(rows)


def per_bug_table(result: EvalResult) -> str:
    """Recall per bug kind and method, as text."""
    names = [m.name for m in result.methods]
    rows = [("bug", "category", "n", "detect.", *names)]
    for r in result.per_bug:
        rows.append((r["bug"], r["category"], str(r["n"]), str(r["n_detectable"]),
                     *(f"{100 * r[n]:.0f}%" for n in names)))
    return _fmt_rows(rows)


def write_outputs(result: EvalResult, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``results.json``, ``checks.nc`` and ``calibration.nc`` (each atomically); the
    plots are :func:`tolstat.cli.plots.plot_evaluation`'s."""
    from tolstat.dataset.io import save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [result.to_json(out / "results.json")]
    written.append(atomic_write(out / "checks.nc", lambda tmp: result.checks.to_netcdf(tmp, engine="h5netcdf")))
    # an artifact of every run (29,600 runs, samples of 512): written uncompressed, 1.4 s
    # against 3.2 s compressed (451 MB against 130 MB; measured on the corpus, 2 cores)
    written.append(save(result.calibration, out / "calibration.nc", compress=False))
    return written
