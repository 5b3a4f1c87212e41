"""Evaluate tolerance methods on the embedded kernel corpus: recall and false positives.

The last step of the data flow: it uses every other step (corpus kernels -> metrics ->
error dataset -> selection -> checks) and compares tolstat's budgeted thresholds with the
static tolerances used in practice, side by side.

Protocol
--------
1. **Calibration.** For each (op, dtype), ``n_cal`` cases (seed ``seed``) are run through
   every correct variant of the op; the errors form an error dataset (``from_pairs``).
2. **Test.** ``n_test`` fresh cases (seed ``seed + 1``) are run through every correct
   variant (*controls*) and every bug of the op (*buggy*), paired on the same inputs.
3. **Methods.** Each method calibrates on the calibration dataset only, then flags each
   test check. Static methods ignore the calibration data.
4. **Report.** Recall over all buggy checks and over *detectable* ones (the buggy output
   differs from its paired correct output by more than one ULP somewhere), realised
   false-positive rate on the held-out controls (with a one-sided 95% Clopper-Pearson
   upper bound), the promised budget, and tightness: the median, over controls, of the
   check statistic as a fraction of its threshold (1 = the tolerance is fully used).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import xarray as xr
from scipy import stats
from tqdm.auto import tqdm

from ._eval_tolstat import tolstat_methods
from ._method import Method
from ._util import atomic_write, atomic_write_text
from ._version import __version__
from .bounds import NotEnoughData
from .collect import from_pairs
from .dataset import concat
from .metrics import error_metrics, ulp_distance

__all__ = [
    "Method",
    "AllClose",
    "StudyRule",
    "EvalConfig",
    "EvalResult",
    "evaluate",
    "default_methods",
    "TORCH_DEFAULTS",
]

#: torch.testing.assert_close defaults (rtol, atol) per dtype
TORCH_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
}


# --------------------------------------------------------------------------- methods
class AllClose(Method):
    """Static ``|d| <= atol + rtol*|ref|`` with one (atol, rtol) per dtype."""

    def __init__(self, name: str, tolerances: Mapping[str, tuple[float, float]]):
        self.name = name
        self.family = "static"
        self.tolerances = dict(tolerances)  # dtype -> (rtol, atol)

    def score(self, m, *, op, dtype, actual, expected, covariates):  # noqa: D102
        rtol, atol = self.tolerances[dtype]
        with np.errstate(invalid="ignore", divide="ignore"):
            return float(np.max(m.abs / (atol + rtol * m.ref_abs)))

    def describe(self) -> str:  # noqa: D102
        return "; ".join(f"{d}: rtol={r:g} atol={a:g}" for d, (r, a) in self.tolerances.items())


class StudyRule(Method):
    """The 2026 study's rule: ``atol = 1.5 * p95(max_abs)`` of calibration runs per (op, dtype)."""

    def __init__(self, factor: float = 1.5, percentile: float = 95.0):
        self.name = "study p95x1.5"
        self.family = "study"
        self.factor, self.percentile = factor, percentile
        self.atol: dict[tuple[str, str], float] = {}

    def calibrate(self, cal):  # noqa: D102
        for (op, dt), g in cal.groupby(["op", "dtype"]):
            self.atol[(op, dt)] = self.factor * float(np.percentile(g.max_abs.values, self.percentile))

    def score(self, m, *, op, dtype, actual, expected, covariates):  # noqa: D102
        atol = self.atol[(op, dtype)]
        mx = float(m.abs.max())
        if atol == 0.0:
            return 0.0 if mx == 0.0 else math.inf
        return mx / atol

    def threshold_for(self, op: str, dtype: str) -> float | None:
        """The calibrated atol of a group (for plots)."""
        return self.atol.get((op, dtype))

    def describe(self) -> str:  # noqa: D102
        return f"atol = {self.factor:g} x p{self.percentile:g}(run max_abs) per (op, dtype)"


def default_methods(fp_budget: float, confidence: float) -> list[Method]:
    """Static baselines, the study's rule and the tolstat methods available."""
    methods: list[Method] = [
        AllClose("torch defaults", TORCH_DEFAULTS),
        AllClose("atol=rtol=1e-2", {d: (1e-2, 1e-2) for d in TORCH_DEFAULTS}),
        StudyRule(),
    ]
    return methods + tolstat_methods(fp_budget, confidence)


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
    """

    ops: list[str] | None = None
    dtypes: tuple[str, ...] = ("float16", "bfloat16")
    n_cal: int = 400
    n_test: int = 50
    fp_budget: float = 1e-2
    confidence: float = 0.95
    seed: int = 0
    quick: bool = False

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


# --------------------------------------------------------------------------- running
def _pairs_for(op: str, dtype: str, n: int, seed: int, quick: bool) -> Iterable[tuple]:
    from . import corpus

    spec = corpus.OPS[op]
    for ci, case in enumerate(corpus.cases(op, dtype, n=n, seed=seed, quick=quick)):
        ref = corpus.run_reference(case, dtype)
        mag = corpus.run_magnitude(case, dtype)  # operator-noise statistics (tolstat.noise)
        for vname, kern in spec.variants.items():
            out = corpus.run_kernel(kern, case, dtype)
            # "case": the same inputs through every correct variant, one cluster (select(cluster="case"))
            labels = {"variant": vname, "dist": case.labels.get("dist", ""),
                      "dims": case.labels.get("dims", ""), "case": str(ci)}
            yield out, ref, mag, labels, dict(case.covariates)


def calibration_dataset(cfg: EvalConfig, *, progress: bool | None = None) -> xr.Dataset:
    """Collect the calibration error dataset of the correct corpus kernels."""
    from . import corpus

    ops = cfg.ops or sorted(corpus.OPS)
    parts = []
    bar = tqdm(total=len(ops) * len(cfg.dtypes), desc="collect", disable=None if progress is None else not progress)
    for op in ops:
        for dt in cfg.dtypes:
            pairs = list(_pairs_for(op, dt, cfg.n_cal, cfg.seed, cfg.quick))
            cov_keys = set.intersection(*(set(p[4]) for p in pairs))
            pairs = [(a, e, m, lab, {k: c[k] for k in cov_keys}) for a, e, m, lab, c in pairs]
            parts.append(from_pairs(pairs, op=op, dtype=dt, hardware="cpu:tolstat-corpus",
                                    seed=cfg.seed, sample_size=512, progress=False,
                                    rowwise=op in corpus.ROWWISE))
            bar.update(1)
    bar.close()
    # ops have different covariates (D for attention, N for norms): keep the union,
    # NaN where an op does not define one
    names: list[str] = []
    for p in parts:
        names += [c for c in p.attrs["covariates"].split(",") if c not in names]
    trimmed = []
    for p in parts:
        have = p.attrs["covariates"].split(",")
        q = p.assign({c: ("run", np.full(p.sizes["run"], np.nan)) for c in names if c not in have})
        q.attrs["covariates"] = ",".join(names)
        trimmed.append(q)
    return concat(trimmed)


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
    methods : list of Method
    seconds : float
        Wall time.
    per_bug, per_op : list of dict
        Recall per bug kind and per op, false positives per op.
    skipped : dict
        tolstat methods that could not be calibrated (too few runs for the budget) and
        why; they are left out of the comparison.
    """

    config: EvalConfig
    checks: xr.Dataset
    summary: list[dict[str, Any]]
    calibration: xr.Dataset
    methods: list[Method]
    seconds: float
    per_bug: list[dict[str, Any]] = field(default_factory=list)
    per_op: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def table(self) -> str:
        """The side-by-side table, as printed by ``tolstat evaluate``."""
        head = ("method", "budget", "recall", "recall(detectable)", "FP", "FP rate", "FP 95% UB",
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
                f"{100 * r['fp_rate_ub95']:.2f}%",
                f"{r['tightness']:.3f}",
            ))
        return _fmt_rows(rows)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write config, summary, per-bug and per-op tables as JSON (atomically)."""
        doc = {
            "tolstat_version": __version__,
            "config": self.config.__dict__,
            "seconds": self.seconds,
            "methods": [{"name": m.name, "family": m.family, "budget": m.budget,
                         "rule": m.describe()} for m in self.methods],
            "summary": self.summary,
            "per_bug": self.per_bug,
            "per_op": self.per_op,
            "skipped_methods": self.skipped,
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


def _cp_upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound of a binomial proportion."""
    if n == 0:
        return float("nan")
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(level, k + 1, n - k))


def evaluate(
    config: EvalConfig | None = None,
    *,
    methods: Sequence[Method] | None = None,
    progress: bool | None = None,
) -> EvalResult:
    """Run the evaluation protocol (module docstring) and return the result.

    Parameters
    ----------
    config : EvalConfig, optional
        Defaults to ``EvalConfig()`` (the main job).
    methods : list of Method, optional
        Defaults to :func:`default_methods`.
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


def _evaluate(cfg: EvalConfig, methods: Sequence[Method] | None, progress: bool | None) -> EvalResult:
    from . import corpus

    t0 = time.perf_counter()
    ops = cfg.ops or sorted(corpus.OPS)
    unknown = sorted(set(ops) - set(corpus.OPS))
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; known: {sorted(corpus.OPS)}")
    methods = list(methods) if methods is not None else default_methods(cfg.fp_budget, cfg.confidence)
    cal = calibration_dataset(cfg, progress=progress)
    skipped: dict[str, str] = {}
    for m in list(methods):
        try:
            m.calibrate(cal)
        except NotEnoughData as exc:  # too few calibration runs for the budget
            skipped[m.name] = str(exc)
            methods.remove(m)
            print(f"tolstat evaluate: skipping {m.name!r}: {exc}", file=sys.stderr, flush=True)
    if not methods:
        raise ValueError("no method could be calibrated: " + "; ".join(skipped.values()))

    records: list[dict[str, Any]] = []
    scores: list[list[float]] = []
    disable = None if progress is None else not progress
    bugs_by_op: dict[str, list] = {}
    for b in corpus.BUGS.values():
        bugs_by_op.setdefault(b.op, []).append(b)
    total = sum(cfg.n_test for _ in ops) * len(cfg.dtypes)
    bar = tqdm(total=total, desc="test checks", disable=disable)
    for op in ops:
        spec = corpus.OPS[op]
        for dt in cfg.dtypes:
            for case in corpus.cases(op, dt, n=cfg.n_test, seed=cfg.seed + 1, quick=cfg.quick):
                ref = corpus.run_reference(case, dt)
                mag = corpus.run_magnitude(case, dt)
                outs = {v: corpus.run_kernel(k, case, dt) for v, k in spec.variants.items()}
                entries = [("control", v, "", "", out, True) for v, out in outs.items()]
                for b in bugs_by_op.get(op, []):
                    out = corpus.run_kernel(b.kernel, case, dt)
                    with np.errstate(all="ignore"):
                        det = bool(np.any(ulp_distance(out, outs[b.base], dt) > 1.0))
                    entries.append(("bug", b.base, b.name, b.category, out, det))
                for kind, variant, bug, cat, out, det in entries:
                    m = error_metrics(out, ref, dtype=dt)
                    row = [mt.score(m, op=op, dtype=dt, actual=out, expected=ref, covariates=case.covariates,
                                    **({"magnitude": mag, "variant": variant} if mt.wants_magnitude else {}))
                           for mt in methods]
                    scores.append(row)
                    records.append({"op": op, "dtype": dt, "kind": kind, "variant": variant,
                                    "bug": bug, "category": cat, "detectable": det,
                                    "shape": case.labels.get("shape", ""),
                                    "dist": case.labels.get("dist", ""),
                                    "scale": case.labels.get("scale", "")})
                bar.update(1)
    bar.close()
    checks = _checks_dataset(records, np.array(scores, dtype=np.float64), methods)
    summary, per_bug, per_op = _summaries(checks, methods)
    return EvalResult(cfg, checks, summary, cal, methods, time.perf_counter() - t0, per_bug, per_op,
                      skipped)


def _checks_dataset(records: list[dict[str, Any]], scores: np.ndarray, methods: Sequence[Method]) -> xr.Dataset:
    coords: dict[str, Any] = {"method": [m.name for m in methods]}
    for key in records[0]:
        vals = [r[key] for r in records]
        coords[key] = ("check", np.array(vals, dtype=bool if key == "detectable" else str))
    return xr.Dataset({"score": (("check", "method"), scores)}, coords=coords,
                      attrs={"meaning": "check statistic / threshold; flagged when > 1"})


def _summaries(checks: xr.Dataset, methods: Sequence[Method]):
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
            "method": m.name, "family": m.family, "budget": m.budget,
            "n_bug": int(bug.sum()), "caught": int(f[bug].sum()),
            "recall": float(f[bug].mean()) if bug.any() else float("nan"),
            "n_detectable": int(det.sum()), "caught_detectable": int(f[det].sum()),
            "recall_detectable": float(f[det].mean()) if det.any() else float("nan"),
            "n_control": nc, "fp": fp, "fp_rate": fp / nc if nc else float("nan"),
            "fp_rate_ub95": _cp_upper(fp, nc),
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
    names = [m.name for m in result.methods]
    det = ((checks.kind == "bug").values & checks.detectable.values)
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


def write_outputs(result: EvalResult, out_dir: str | os.PathLike[str], *, plots: bool = True) -> list[Path]:
    """Write ``results.json``, ``checks.nc``, ``calibration.nc`` and the plots."""
    from .io import save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [result.to_json(out / "results.json")]
    written.append(atomic_write(out / "checks.nc", lambda tmp: result.checks.to_netcdf(tmp, engine="h5netcdf")))
    written.append(save(result.calibration, out / "calibration.nc"))
    if plots:
        from .plots import plot_evaluation

        written.extend(plot_evaluation(result, out))
    return written
