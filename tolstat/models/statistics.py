"""The check statistics, each defined once.

A *check statistic* reduces one kernel output and its reference to one number; a
tolerance table holds an upper bound of its ``1 - budget`` quantile over correct runs.
Calibration (:func:`tolstat.select`, from the error dataset) and checking
(:func:`tolstat.check`, from one output/reference pair) must compute *the same*
statistic, or the false-positive budget means nothing. Each statistic is therefore one
:class:`Statistic` entry of :data:`REGISTRY`, holding both computations, the run
variables it needs, its unit and its per-element allowance:

========== ================================================== ==========================
name       statistic                                          unit
========== ================================================== ==========================
max_abs    ``max_i |d_i|``                                    output units
max_rel    ``max_i |d_i| / max(|ref_i|, rel_floor)``          relative
max_ulp    ``max_i ulp(actual_i, ref_i)``                     ULP of the target dtype
max_score  ``max_i |d_i| / s(|ref_i|, covariates)``           multiples of the scale
bias       ``sqrt(N) * |mean(d)| / mean(|d|)``                dimensionless
op_score   ``max_j T_j / q_j`` over operator-noise statistics multiples of the normalisers
========== ================================================== ==========================

A new statistic is one more :class:`Statistic` (see :func:`register`).

Element statistics (``kind="max"``) are the maximum of an element score; a non-finite
output element scores ``inf`` and a matching NaN pair (``allow_nan``) scores 0. The
normalised score ``max_score`` needs a noise-scale model (:class:`tolstat.models.ScaleModel`,
passed in; this module does not import :mod:`tolstat.models.scale`).

Layer: after :mod:`tolstat.measure.metrics` and :mod:`tolstat.dataset.schema`, before the scale models,
the selection and the checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from tolstat._base.dtypes import target_dtype
from tolstat.measure.metrics import ErrorMetrics
from tolstat.measure.noise import (MID_SUFFIX, beyond_calibration, combined_score, output_rows, record_statistics,
                                   size_limits)

__all__ = [
    "Statistic",
    "RunScores",
    "REGISTRY",
    "STATISTICS",
    "MAX_STATISTICS",
    "get",
    "register",
    "bias_score",
    "RUN_BLOCK",
    "correctly_rounded",
    "dataset_op_statistics",
    "pair_op_statistics",
    "OP_UNIT_FLOOR",
]


class ScaleLike(Protocol):
    """What a statistic needs of a noise-scale model (:class:`tolstat.models.ScaleModel`)."""

    @property
    def covariates(self) -> list[str]: ...

    def scale(self, ref_abs: Any, cov: Mapping[str, Any] | None = None, dtype: Any = None) -> np.ndarray: ...

    def allclose_pair(self, cov: Mapping[str, Any] | None = None) -> tuple[float, float]: ...


#: runs read at a time from the element samples (bounded memory on dask-backed data)
RUN_BLOCK = 2048


def run_blocks(n: int, block: int | None = None) -> list[slice]:
    """Slices of ``block`` runs (default :data:`RUN_BLOCK`, read at call time)."""
    b = RUN_BLOCK if block is None else int(block)
    return [slice(i, min(i + b, n)) for i in range(0, n, b)]


def sample_mask(ds_sample: np.ndarray, n_sample: np.ndarray) -> np.ndarray:
    """Valid (non-padding) entries of a ``(run, sample)`` element-sample block."""
    return np.arange(ds_sample.shape[1])[None, :] < n_sample[:, None]


@dataclass(frozen=True)
class RunScores:
    """Per-run values of a check statistic over the runs of an error dataset.

    Attributes
    ----------
    scores : numpy.ndarray
        One per run (``inf`` for runs with non-finite output).
    n_inexact : int
        Runs whose score may be a lower bound (a truncated Pareto front whose sample
        could not hold the whole convex hull; none in datasets written by this version).
    """

    scores: np.ndarray
    n_inexact: int = 0


# --------------------------------------------------------------------------- definitions
def bias_score(mean_signed: Any, mean_abs: Any, n_elements: Any) -> np.ndarray:
    """Self-normalised bias statistic ``sqrt(N) * |mean(d)| / mean(|d|)``.

    For independent zero-mean element errors it is O(1) whatever the error magnitude;
    a systematic error (wrong epsilon, wrong scale, a missing rounding step) drives it
    towards ``sqrt(N)`` even when every element stays under the max-error threshold.
    0 when all errors are 0; ``inf`` for non-finite errors.
    """
    ms = np.abs(np.asarray(mean_signed, dtype=np.float64))
    ma = np.asarray(mean_abs, dtype=np.float64)
    n = np.asarray(n_elements, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(ma > 0, np.sqrt(n) * ms / np.where(ma > 0, ma, 1.0), 0.0)
    return np.where(np.isfinite(ma), out, np.inf)


def _need_model(name: str, model: Any) -> Any:
    if model is None:
        raise ValueError(f"statistic {name!r} needs a noise-scale model (select with form=...)")
    return model


def _plain_run(var: str) -> Callable[[Any, Any], RunScores]:
    def from_dataset(ds: Any, model: Any = None) -> RunScores:
        return RunScores(np.asarray(ds[var].values, dtype=np.float64), 0)

    return from_dataset


def _run_vector(ds: Any, name: str, rows: np.ndarray | None) -> np.ndarray:
    """A run variable of every run, or of the runs ``rows`` (positions along ``run``)."""
    x = np.asarray(ds[name].values)
    return x if rows is None else x[rows]


def sample_blocks(ds: Any, name: str, rows: np.ndarray | None) -> Callable[[Any], np.ndarray]:
    """Reader of an element-sample variable by blocks of runs (a slice, or positions in
    ``rows``) as float64: dask-backed data read block by block, in-memory data indexed."""
    v = ds[name].variable
    if rows is None or v.chunks is not None:
        return lambda sel: np.asarray(v.isel(run=sel).values, dtype=np.float64)
    x = v.values
    return lambda sel: np.asarray(x[sel], dtype=np.float64)


#: numpy's smallest normal float64: the floor of every noise scale (``ScaleModel.scale``'s
#: and the dataset scores' alike)
SCALE_FLOOR = float(np.finfo(np.float64).tiny)


def _affine_in_place(ds: Any, model: Any, cov: Mapping[str, np.ndarray], ns: np.ndarray,
                     rows: np.ndarray | None, out: np.ndarray) -> bool:
    """``max_score`` of the runs into ``out`` by one numba pass over the in-memory float64
    samples (:func:`tolstat.models.score_kernels.affine_max_scores`), when the model's scale
    is affine in ``|ref|`` (its ``affine`` terms); False (nothing written) otherwise: a
    baseline scale, dask-backed or non-float64 samples take the blockwise numpy path."""
    affine = getattr(model, "affine", None)
    terms = affine(cov) if callable(affine) else None
    if terms is None:
        return False
    arrays = []
    for name in ("sample_abs", "sample_ref"):
        v = ds[name].variable
        if v.chunks is not None or v.dtype != np.float64 or v.ndim != 2:
            return False
        arrays.append(np.ascontiguousarray(v.values))
    from tolstat.models.score_kernels import affine_max_scores

    unit, atol, rtol, add, mult = terms
    n = ns.size
    idx = np.arange(n, dtype=np.intp) if rows is None else np.asarray(rows, dtype=np.intp)
    per_run = [np.ascontiguousarray(np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))) for x in (add, mult)]
    affine_max_scores(arrays[0], arrays[1], np.asarray(ns, dtype=np.int64), idx,
                      np.array([unit, atol, rtol, SCALE_FLOOR]), per_run[0], per_run[1], out)
    return True


def _score_from_dataset(ds: Any, model: Any = None, rows: np.ndarray | None = None) -> RunScores:
    """Exact normalised run scores from the element samples (see :mod:`tolstat.models.scale`),
    of every run or of the runs at positions ``rows`` (read block by block, no copy of the rest)."""
    model = _need_model("max_score", model)
    ns = _run_vector(ds, "n_sample", rows)
    cov = {}
    for k in model.covariates:
        if k not in ds:
            have = [x for x in str(ds.attrs.get("covariates", "")).split(",") if x]
            raise ValueError(f"covariate {k!r} is not in the dataset (have {have})")
        cov[k] = np.asarray(_run_vector(ds, k, rows), dtype=np.float64)
    dtype = str(ds["dtype"].values[0 if rows is None or not rows.size else rows[0]])
    out = np.empty(ns.size, dtype=np.float64)
    if not _affine_in_place(ds, model, cov, ns, rows, out):
        read_abs, read_ref = sample_blocks(ds, "sample_abs", rows), sample_blocks(ds, "sample_ref", rows)
        for sl in run_blocks(ns.size):  # bounded memory on dask-backed data
            sel = sl if rows is None else rows[sl]
            abs_s, ref_s = read_abs(sel), read_ref(sel)
            mask = sample_mask(abs_s, ns[sl])
            s = model.scale(ref_s, {k: v[sl] for k, v in cov.items()}, dtype=dtype)
            with np.errstate(invalid="ignore", divide="ignore"):
                sc = np.where(mask, abs_s / s, -np.inf)
            out[sl] = np.max(sc, axis=1) if sc.shape[1] else -np.inf
    out = np.where(_run_vector(ds, "n_nonfinite", rows) > 0, np.inf, out)
    out = np.maximum(out, 0.0)
    nel = _run_vector(ds, "n_elements", rows)
    nf = _run_vector(ds, "n_frontier", rows)
    # a truncated front keeps its hull (at most the whole sample): exact unless the
    # sample is entirely front points, where the hull may not have fitted
    inexact = (nel > ns) & (nf > ns // 2) & (nf >= ns)
    return RunScores(out, int(inexact.sum()))


def _bias_from_dataset(ds: Any, model: Any = None) -> RunScores:
    return RunScores(bias_score(ds["mean_signed"].values, ds["mean_abs"].values, ds["n_elements"].values), 0)


def _bias_from_metrics(m: ErrorMetrics, model: Any = None, cov: Any = None, dtype: Any = None) -> float:
    fin = ~m.nonfinite & np.isfinite(m.signed)
    ms = float(m.signed[fin].mean()) if fin.any() else 0.0
    ma = float(m.abs.mean()) if not m.nonfinite.any() else math.inf
    return float(bias_score(ms, ma, m.n_elements))


def _score_elements(m: ErrorMetrics, model: Any, cov: Mapping[str, Any], dtype: str) -> np.ndarray:
    s = _need_model("max_score", model).scale(m.ref_abs, cov, dtype=dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(m.abs == 0, 0.0, m.abs / s)


def _no_allclose(name: str) -> Callable[..., tuple[float, float]]:
    def allclose(c: float, dtype: str, model: Any, cov: Mapping[str, Any] | None) -> tuple[float, float]:
        raise ValueError(f"a {name} threshold has no (atol, rtol) form; use tolstat.check")

    return allclose


def _score_allclose(c: float, dtype: str, model: Any, cov: Mapping[str, Any] | None) -> tuple[float, float]:
    at, rt = _need_model("max_score", model).allclose_pair(cov)
    return float(c * at), float(c * rt)


# --------------------------------------------------------------------------- operator score
#: operator statistics that are <= 1 for a correctly rounded output (the half-ULP property
#: of the noise scale, ``docs/noise.md``): their resolution floor is 1
OP_UNIT_FLOOR = tuple(b + s for b in ("op_max", "op_rms", "op_mean", "op_row_rms_max", "op_row_rms_mean")
                      for s in ("", MID_SUFFIX))


def correctly_rounded(max_ulp: Any) -> np.ndarray:
    """True where a run's output is the reference rounded to nearest in the output format.

    The one rule of the operator score: such a run has ``op_score = 0`` (every statistic
    is set to 0), in calibration and in a check alike, so a correctly rounded output
    passes every threshold. ``max_ulp`` is the run's largest ULP distance to the
    reference rounded once (the dataset variable ``max_ulp``; ``max(ErrorMetrics.ulp)``).
    """
    return np.asarray(max_ulp, dtype=np.float64) == 0.0


def dataset_op_statistics(ds: Any, names: Any) -> dict[str, np.ndarray]:
    """The operator statistics ``names`` of every run, correctly rounded runs set to 0."""
    missing = [k for k in names if k not in ds]
    if missing:
        raise ValueError(f"the error dataset lacks the operator statistics {missing} (collect with options=CollectOptions(magnitude=...))")
    cr = correctly_rounded(ds["max_ulp"].values)
    return {k: np.where(cr, 0.0, np.asarray(ds[k].values, dtype=np.float64)) for k in names}


def pair_op_statistics(actual: Any, expected: Any, m: ErrorMetrics, *, dtype: Any, magnitude: Any = None,
                       K: float = 1.0, rowwise: bool = False, op: str | None = None) -> dict[str, float]:
    """:func:`tolstat.measure.noise.record_statistics` of one pair, all 0 when correctly rounded."""
    st = record_statistics(actual, expected, dtype=dtype, magnitude=magnitude, K=K, rowwise=rowwise, op=op)
    if m.ulp.size and bool(correctly_rounded(np.max(m.ulp))):
        return rounded_statistics(st)
    return st


def rounded_statistics(stats: Mapping[str, float]) -> dict[str, float]:
    """The operator statistics of a correctly rounded output: 0, NaN where not applicable."""
    return {k: (0.0 if not math.isnan(v) else v) for k, v in stats.items()}


def dataset_rows(ds: Any) -> np.ndarray:
    """Per run, the rows of its output (:func:`tolstat.measure.noise.output_rows`), from its
    ``shape`` label (``"64x1024"``, ``"scalar"``)."""
    from tolstat._base.util import factorize

    names, inv = factorize(np.asarray(ds["shape"].values).astype(str))
    per = np.array([output_rows(() if s == "scalar" else tuple(int(d) for d in s.split("x"))) for s in names],
                   dtype=np.int64)
    return per[inv] if per.size else np.zeros(0, dtype=np.int64)


def _op_score_from_dataset(ds: Any, model: Any = None) -> RunScores:
    cert = _need_model("op_score", model)
    q = dict(cert["normalisers"])
    stats = dataset_op_statistics(ds, list(q))
    # runs larger than every calibration run: their row maxima and whole-output bias
    # carried as a check carries them (tolstat.measure.noise.beyond_calibration)
    rows_max, n_max = size_limits(cert)
    rows_max = rows_max if "shape" in ds else None
    n_max = n_max if "n_elements" in ds else None
    if ds.sizes["run"] and (rows_max is not None or n_max is not None):
        stats = beyond_calibration(stats, rows=dataset_rows(ds) if rows_max is not None else 1, rows_max=rows_max,
                                   n=np.asarray(ds["n_elements"].values) if n_max is not None else 1, n_max=n_max)
    return RunScores(np.asarray(combined_score(stats, q), dtype=np.float64), 0)


def _op_score_metrics(m: ErrorMetrics, model: Any, cov: Mapping[str, Any], dtype: str) -> float:
    raise ValueError("op_score is computed from the output, the reference and the magnitude: use tolstat.check")


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Statistic:
    """One check statistic: how it is computed on a pair and on a dataset, what it needs.

    Attributes
    ----------
    name : str
        Table name (``"max_abs"``, ...).
    kind : {"max", "run"}
        ``"max"``: the maximum of an element score (the table's *max-error statistic*;
        one per table); ``"run"``: a whole-output statistic checked alongside it.
    unit : str
        Unit of the value.
    description : str
        The formula, as shown in check messages.
    needs : tuple of str
        Run variables of the error dataset the calibration reads.
    scaled : bool
        Needs a noise-scale model (``max_score``).
    from_dataset : callable
        ``(ds, model) -> RunScores``: the statistic of every run of an error dataset.
    element_scores : callable, optional
        ``(metrics, model, covariates, dtype) -> ndarray``: the element score of a
        ``"max"`` statistic, before non-finite handling.
    from_metrics : callable, optional
        ``(metrics, model, covariates, dtype) -> float``: the value of a ``"run"``
        statistic.
    allowance : callable, optional
        ``(metrics, threshold, model, covariates, dtype) -> ndarray``: the largest
        ``|d_i|`` the threshold allows at each element (None: not an ``|d|`` bound).
    allclose : callable, optional
        ``(threshold, dtype, model, covariates) -> (atol, rtol)``; raises
        ``ValueError`` when there is no such form.
    reads_rows : bool, default False
        ``from_dataset`` also takes ``rows=`` (positions along ``run``) and scores only
        those runs, reading them from the dataset without cutting it out; otherwise
        :meth:`run_scores` with ``rows`` scores ``ds.isel(run=rows)``.
    """

    name: str
    kind: str
    unit: str
    description: str
    needs: tuple[str, ...]
    from_dataset: Callable[[Any, Any], RunScores]
    scaled: bool = False
    element_scores: Callable[[ErrorMetrics, Any, Mapping[str, Any], str], np.ndarray] | None = None
    from_metrics: Callable[[ErrorMetrics, Any, Mapping[str, Any], str], float] | None = None
    allowance: Callable[..., np.ndarray] | None = None
    allclose: Callable[..., tuple[float, float]] | None = None
    reads_rows: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("max", "run", "score"):
            raise ValueError(f"Statistic.kind must be 'max', 'run' or 'score', got {self.kind!r}")
        if self.kind == "max" and self.element_scores is None:
            raise ValueError(f"max statistic {self.name!r} needs element_scores")
        if self.kind in ("run", "score") and self.from_metrics is None:
            raise ValueError(f"run statistic {self.name!r} needs from_metrics")

    def elements(self, m: ErrorMetrics, model: ScaleLike | None = None, covariates: Mapping[str, Any] | None = None,
                 dtype: str | None = None) -> np.ndarray:
        """Element scores of one pair (``inf`` at non-finite outputs, 0 at matching NaNs)."""
        if self.element_scores is None:
            raise ValueError(f"{self.name!r} is a whole-output statistic with no element scores")
        elem = self.element_scores(m, model, covariates or {}, dtype or m.dtype)
        elem = np.where(m.nonfinite, np.inf, elem)
        return np.where(np.isnan(elem), 0.0, elem)

    def value(self, m: ErrorMetrics, model: ScaleLike | None = None, covariates: Mapping[str, Any] | None = None,
              dtype: str | None = None) -> float:
        """The statistic of one output/reference pair."""
        if self.kind in ("run", "score"):
            assert self.from_metrics is not None
            return float(self.from_metrics(m, model, covariates or {}, dtype or m.dtype))
        return float(np.max(self.elements(m, model, covariates, dtype)))

    def run_scores(self, ds: Any, model: ScaleLike | None = None, rows: np.ndarray | None = None) -> RunScores:
        """The statistic of every run of an error dataset, or of the runs at positions ``rows``."""
        missing = [v for v in self.needs if v not in ds]
        if missing:
            raise ValueError(f"statistic {self.name!r} needs the run variable(s) {missing} in the dataset")
        if rows is None:
            return self.from_dataset(ds, model)
        if self.reads_rows:
            return self.from_dataset(ds, model, rows=rows)  # type: ignore[call-arg]
        return self.from_dataset(ds.isel(run=rows), model)

    def allowed(self, m: ErrorMetrics, threshold: float, model: ScaleLike | None = None,
                covariates: Mapping[str, Any] | None = None, dtype: str | None = None) -> np.ndarray | None:
        """Largest ``|d_i|`` the threshold allows per element, or None."""
        if self.allowance is None:
            return None
        return self.allowance(m, threshold, model, covariates or {}, dtype or m.dtype)

    def allclose_pair(self, threshold: float, dtype: str, model: ScaleLike | None = None,
                      covariates: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """``(atol, rtol)`` equivalent of a threshold, or ``ValueError``."""
        if self.allclose is None:
            raise ValueError(f"a {self.name} threshold has no (atol, rtol) form; use tolstat.check")
        return self.allclose(threshold, dtype, model, covariates)


REGISTRY: dict[str, Statistic] = {}


def register(stat: Statistic) -> Statistic:
    """Add a statistic to :data:`REGISTRY` (its name must be new)."""
    if stat.name in REGISTRY:
        raise ValueError(f"statistic {stat.name!r} is already registered")
    REGISTRY[stat.name] = stat
    return stat


def get(name: str) -> Statistic:
    """The registered statistic ``name``.

    Raises
    ------
    ValueError
        Unknown name (the message lists the known ones).
    """
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown statistic {name!r}; known: {sorted(REGISTRY)}") from None


register(Statistic(
    name="max_abs", kind="max", unit="output units", description="max |actual - expected|",
    needs=("max_abs",), from_dataset=_plain_run("max_abs"),
    element_scores=lambda m, model, cov, dt: m.abs,
    allowance=lambda m, c, model, cov, dt: np.full(m.abs.shape, c),
    allclose=lambda c, dt, model, cov: (float(c), 0.0),
))
register(Statistic(
    name="max_ulp", kind="max", unit="ULP of the target dtype", description="max ULP distance",
    needs=("max_ulp",), from_dataset=_plain_run("max_ulp"),
    element_scores=lambda m, model, cov, dt: m.ulp,
    allclose=_no_allclose("max_ulp"),
))
register(Statistic(
    name="max_rel", kind="max", unit="relative",
    description="max |actual - expected| / max(|expected|, rel_floor)",
    needs=("max_rel",), from_dataset=_plain_run("max_rel"),
    element_scores=lambda m, model, cov, dt: m.rel,
    allowance=lambda m, c, model, cov, dt: c * np.maximum(m.ref_abs, m.rel_floor),
    allclose=lambda c, dt, model, cov: (float(c * target_dtype(dt).tiny), float(c)),
))
register(Statistic(
    name="max_score", kind="max", unit="multiples of the noise scale",
    description="max |actual - expected| / s(|expected|) (normalised error)",
    needs=("sample_abs", "sample_ref", "n_sample", "n_nonfinite", "n_elements", "n_frontier"),
    from_dataset=_score_from_dataset, scaled=True, reads_rows=True,
    element_scores=_score_elements,
    allowance=lambda m, c, model, cov, dt: c * _need_model("max_score", model).scale(m.ref_abs, cov, dtype=dt),
    allclose=_score_allclose,
))
register(Statistic(
    name="bias", kind="run", unit="dimensionless",
    description="sqrt(N)*|mean(actual - expected)| / mean|actual - expected| (bias)",
    needs=("mean_signed", "mean_abs", "n_elements"), from_dataset=_bias_from_dataset,
    from_metrics=_bias_from_metrics,
))

register(Statistic(
    name="op_score", kind="score", unit="multiples of the per-statistic normalisers",
    description="max_j T_j / q_j over operator-noise statistics (0 when correctly rounded)",
    needs=("max_ulp",), from_dataset=_op_score_from_dataset, scaled=True,
    from_metrics=_op_score_metrics,
))

#: names of the built-in statistics a table can hold
STATISTICS = tuple(REGISTRY)
#: the max-error statistics that need no scale model (``statistic=`` of :func:`tolstat.select`)
MAX_STATISTICS = tuple(n for n, s in REGISTRY.items() if s.kind == "max" and not s.scaled)
