"""Plots of an evaluation (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tolstat._base.util import atomic_write

# ``result`` arguments are :class:`tolstat.assess.evaluation.EvalResult` objects; they are typed
# ``Any`` because evaluate imports this module (one-way flow).
EvalResult = Any

__all__ = ["plot_evaluation", "plot_recall_fp", "plot_error_histograms"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("plots need matplotlib: pip install 'tolstat[plot]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, tight: bool = True) -> Path:
    """Write ``fig`` as a PNG atomically; ``tight`` crops it to what is drawn (a second
    layout pass: figures with a fixed layout leave it out)."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight" if tight else None))


def plot_recall_fp(result: "EvalResult", path: str | os.PathLike[str]) -> Path:
    """Recall (all and detectable buggy checks) against realised false-positive rate."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    markers = {"static": "s", "study": "^", "tolstat": "o"}
    for r in result.summary:
        x = 100 * r["fp_rate"]
        ax.errorbar([x], [100 * r["recall_detectable"]],
                    xerr=[[0], [max(0.0, 100 * r["fp_rate_ub"] - x)]],
                    marker=markers.get(r["family"], "o"), ms=8, capsize=3, label=r["method"])
        ax.scatter([x], [100 * r["recall"]], marker=markers.get(r["family"], "o"),
                   facecolors="none", edgecolors="grey", s=50)
        if r["budget"] is not None:
            ax.axvline(100 * r["budget"], color="grey", ls=":", lw=1)
    ax.set_xlabel("false positives on held-out correct controls (%)  [bar: upper confidence bound]")
    ax.set_ylabel("recall on detectable buggy checks (%)  [hollow: all buggy]")
    ax.set_title("Recall vs false-positive rate (dotted: tolstat budgets)")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlim(left=0.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    out = _save(fig, Path(path))
    plt.close(fig)
    return out


def plot_error_histograms(result: "EvalResult", path: str | os.PathLike[str], dtype: str = "float16") -> Path:
    """Per op: histogram of calibration run max_abs, the fitted tail, and thresholds."""
    plt = _pyplot()
    cal = result.calibration
    ops = sorted(set(cal.op.values.tolist()))
    ncol = 4
    nrow = -(-len(ops) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 2.8 * nrow), squeeze=False)
    for ax, op in zip(axes.ravel(), ops):
        sel = (cal.op.values == op) & (cal.dtype.values == dtype)
        v = cal.max_abs.values[sel]
        v = v[np.isfinite(v) & (v > 0)]
        if v.size == 0:
            ax.set_title(f"{op} ({dtype}): no data")
            continue
        lo = max(v.min(), v.max() * 1e-9)  # a few underflowed runs would squash the rest
        v = np.maximum(v, lo)
        bins = np.logspace(np.log10(lo) - 0.1, np.log10(v.max()) + 0.6, 40)
        # one filled outline per panel, not a patch per bin; no minor ticks on the log axis:
        # drawing 40 bars and a log axis's minor ticks in each of 26 panels was most of
        # the plots' time (3.7-4.0 s CPU against 2.1-2.4 s, the same picture but the ticks)
        ax.hist(v, bins=bins, density=False, alpha=0.6, color="C0", label="calibration runs",
                histtype="stepfilled")
        for m in result.methods:
            t = result.threshold_for(m.name, op, dtype)
            if t is not None and np.isfinite(t) and t > 0:
                ax.axvline(t, ls="--", lw=1.2, label=f"{m.name}", color=_colour(m.name))
        tail = _gpd_tail_counts(v, bins)
        if tail is not None:
            ax.stairs(tail[1], tail[0], color="k", lw=1.2, label="GPD tail fit (top 20%)")
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_title(f"{op} ({dtype})", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(ops):]:
        ax.axis("off")
    handles, labels = axes.ravel()[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower right", fontsize=8)
    fig.suptitle(f"Run max |error| of correct kernels ({dtype}) with thresholds", fontsize=11)
    # a fixed layout in inches (the panels' titles and tick labels have fixed font sizes):
    # matplotlib's tight layout measured every tick label of every panel, a third of the
    # plots' time
    height = 2.8 * nrow
    fig.subplots_adjust(left=0.035, right=0.99, bottom=0.3 / height, top=1 - 0.75 / height,
                        wspace=0.15, hspace=0.32)
    out = _save(fig, Path(path), tight=False)
    plt.close(fig)
    return out


def _colour(name: str) -> str:
    fixed = {"study p95x1.5": "C3", "tolstat max_abs": "C2"}
    return fixed.get(name, f"C{4 + (sum(map(ord, name)) % 5)}")


def _gpd_tail_counts(v: np.ndarray, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Expected counts per histogram bin of a GPD fitted to the top 20% of ``v``."""
    if v.size < 40:
        return None
    from scipy import stats

    from tolstat.models.estimators import evt

    u = float(np.quantile(v, 0.8))
    exc = v[v > u] - u
    if exc.size < 10 or np.ptp(exc) == 0:
        return None
    try:
        xi, sigma = _fit_gpd(evt, exc)
    except Exception:  # fall back to scipy's generic fit
        xi, _, sigma = stats.genpareto.fit(exc, floc=0)
    edges = bins[bins >= u]
    if edges.size < 2:
        return None
    edges = np.concatenate([[u], edges]) if edges[0] > u else edges
    sf = stats.genpareto.sf(edges - u, xi, scale=sigma)
    return edges, exc.size * (sf[:-1] - sf[1:])


def _fit_gpd(evt: Any, exc: np.ndarray) -> tuple[float, float]:
    res = evt.gpd_fit_mle(exc)
    if isinstance(res, dict):
        return float(res["xi"]), float(res["sigma"])
    if hasattr(res, "xi"):
        return float(res.xi), float(res.sigma)
    return float(res[0]), float(res[1])


def plot_evaluation(result: "EvalResult", out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write ``recall_fp.png`` and ``errors_<dtype>.png`` for each dtype into ``out_dir``."""
    out = Path(out_dir)
    paths = [plot_recall_fp(result, out / "recall_fp.png")]
    for dt in result.config.dtypes:
        paths.append(plot_error_histograms(result, out / f"errors_{dt}.png", dtype=dt))
    return paths


def plot_compare(result: Any, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Recall vs FP, thresholds across folds, and realised FP against budget (PNG, atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    d = result.data
    paths = []
    budgets = [float(b) for b in d.budget.values]

    def save(fig: Any, name: str) -> None:
        paths.append(atomic_write(out / name, lambda tmp: fig.savefig(tmp, dpi=110, format="png")))
        plt.close(fig)

    # calibration curve: realised pooled FP against budget
    floor = min(budgets) / 20  # zero false positives are drawn here
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for r_name in d.method.values:
        rows = [r for r in result.rows if r["method"] == r_name]
        x = [r["budget"] for r in rows]
        y = [max(r["fp_rate"], floor) for r in rows]
        yerr = [[max(yy - max(r["fp_lo"], floor), 0) for yy, r in zip(y, rows)],
                [max(r["fp_hi"] - yy, 0) for yy, r in zip(y, rows)]]
        ax.errorbar(x, y, yerr=yerr, marker="o", capsize=3, label=str(r_name))
    lim = [min(budgets) / 3, max(budgets) * 3]
    ax.plot(lim, lim, "k--", lw=1, label="FP = budget")
    ax.set(xscale="log", yscale="log", xlabel="budget", ylabel=f"realised held-out FP rate (0 drawn at {floor:g})",
           title="calibration: realised FP against budget")
    ax.legend(fontsize=7)
    save(fig, "calibration.png")
    # recall vs FP
    if any(r["n_buggy"] for r in result.rows):
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        for r in result.rows:
            ax.scatter(max(r["fp_rate"], 1e-5), r["recall"], label=f"{r['method']} @ {r['budget']:g}")
        ax.set(xscale="log", xlabel="held-out FP rate", ylabel="recall on buggy runs", title="recall vs FP")
        ax.legend(fontsize=6)
        save(fig, "recall_fp.png")
    # thresholds across folds (max-error statistic; static rules have threshold 1)
    fig, ax = plt.subplots(figsize=(7, 5))
    labels, vals = [], []
    one_hw = len(set(d.hardware.values.tolist())) == 1
    for mi, m in enumerate(d.method.values):
        if d.family.values[mi] in ("static", "eager-relative"):  # ratio statistics: threshold 1
            continue
        for gj, gname in enumerate(d.group.values):
            t = d.threshold.values[mi, gj, 0, :]
            t = t[np.isfinite(t)]
            if t.size:
                labels.append(f"{m}\n{d.op.values[gj]}/{d.dtype.values[gj]}"
                              + ("" if one_hw else f"\n{d.hardware.values[gj]}"))
                vals.append(t / np.median(t) if np.median(t) > 0 else t)
    if vals:
        ax.boxplot(vals)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=90, fontsize=6)
    ax.set(ylabel="threshold / median over folds", title=f"thresholds across folds (budget {budgets[0]:g})")
    fig.tight_layout()
    save(fig, "thresholds.png")
    return paths
