"""Noise-scale models: what size of error a *correct* kernel makes at a given element.

Step between the error dataset and the tolerance table (errors -> **scale** -> select ->
check). A scale model ``s(x)`` predicts the spread of the element error ``|d_i|`` from the
element's reference magnitude ``|ref_i|`` and the run's covariates (reduction length
``K``, ``ref_rms``, ...). A check then looks at the *normalised* run statistic::

    score = max_i |d_i| / s(|ref_i|, run covariates)

and :func:`tolstat.select` calibrates a threshold ``c`` of the score to the
false-positive budget. Because every model here is non-decreasing in ``|ref|``, the score
increases with ``|d|`` and does not increase with ``|ref|``; its run maximum is therefore
attained on the run's (largest ``|d|``, smallest ``|ref|``) Pareto front, which the error
dataset keeps in its element sample (``dataset.pareto_frontier``). Within a run every
model here is affine in ``|ref|`` (``A + B*|ref|``, ``A, B >= 0``), so the maximum is even
attained on the front's upper convex hull (``dataset.upper_hull``), which the sample keeps
when the front itself is too long. Run scores computed from the stored sample are thus
*exact*, not estimates.

The model form (one class, :class:`ScaleModel`)::

    s(x) = unit * (atol + rtol*|ref| + sum_j w_j * L_j) * prod_k (P_k / P_k0) ** beta_k

with ``L_j`` *linear* run covariates (e.g. ``ref_rms``) and ``P_k`` *power* run covariates
(e.g. ``K``) with reference values ``P_k0`` (the geometric mean of the calibration data,
for conditioning). Forms:

* ``allclose``: ``atol + rtol*|ref|`` (``unit = 1``; the shape of ``torch.allclose``);
* ``size_aware``: ``eps_dtype * (a + b*|ref| + c*ref_rms) * (K/K0)**beta``, beta fitted on run-level
  data by a median log-linear quantile regression of ``log max_abs`` on ``log ref_rms``
  and ``log K``;
* ``normalised``: any linear and power run covariates;
* ``baseline``: ``max(baseline_error, floor)`` for a same-precision baseline's error
  stored as a run covariate (the FlashAttention rule, calibrated instead of a fixed 2x).

Coefficients are fitted by linear quantile regression (statsmodels ``QuantReg``; an exact
linear-programming solver :func:`quantreg_lp` is provided and checked against it).
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from tolstat._base.dtypes import target_dtype
from tolstat.dataset.schema import fit_counts
from tolstat._base.validate import unit_interval
from tolstat.models.statistics import (MAX_STATISTICS, RUN_BLOCK, SCALE_FLOOR, RunScores, sample_blocks,
                                       run_blocks, sample_mask)
from tolstat.models.statistics import get as get_statistic

__all__ = [
    "FORMS",
    "ScaleModel",
    "ScaleOptions",
    "quantreg",
    "quantreg_lp",
    "fit_allclose",
    "fit_scale",
    "run_scores",
    "RUN_BLOCK",
]

#: Supported noise-scale forms (``None`` = plain statistic, no scale model).
FORMS = ("allclose", "size_aware", "normalised", "baseline")

_TINY = SCALE_FLOOR


# --------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ScaleModel:
    """A fitted noise-scale model ``s(|ref|, covariates)`` (see module docstring).

    Attributes
    ----------
    form : str
        One of :data:`FORMS`.
    atol, rtol : float
        Constant and ``|ref|`` coefficients (in units of ``unit``).
    unit : float
        Overall unit (1 for ``allclose``; the dtype's epsilon for ``size_aware``).
    linear : dict
        ``{covariate: weight}`` of additive run covariates.
    power : dict
        ``{covariate: (exponent, reference value)}`` of multiplicative run covariates.
    baseline : str
        For ``form="baseline"``: the covariate holding the baseline's max error.
    floor : float
        For ``form="baseline"``: the floor of the baseline error, relative to ``ref_rms``
        times the dtype epsilon.
    quantile : float
        Element-error quantile the coefficients were fitted at.
    notes : str
        How the fit went (clipped coefficients, dropped covariates, ...).
    """

    form: str
    atol: float = 0.0
    rtol: float = 0.0
    unit: float = 1.0
    linear: dict[str, float] = field(default_factory=dict)
    power: dict[str, tuple[float, float]] = field(default_factory=dict)
    baseline: str = ""
    floor: float = 1.0
    quantile: float = float("nan")
    notes: str = ""

    @property
    def covariates(self) -> list[str]:
        """Run covariates the model needs (besides ``|ref|``)."""
        out = list(self.linear) + list(self.power)
        if self.form == "baseline":
            out += [self.baseline, "ref_rms"]
        return out

    def run_factor(self, cov: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Per-run ``(additive term, multiplicative factor)`` of the scale.

        ``cov`` maps covariate names to scalars or arrays over runs.
        """
        add = 0.0
        for name, w in self.linear.items():
            add = add + w * np.asarray(_need(cov, name), dtype=np.float64)
        mult = 1.0
        for name, (beta, ref) in self.power.items():
            v = np.asarray(_need(cov, name), dtype=np.float64)
            if np.any(~(v > 0)):
                raise ValueError(f"power covariate {name!r} must be > 0, got {v!r}")
            mult = mult * (v / ref) ** beta
        return np.asarray(add, dtype=np.float64), np.asarray(mult, dtype=np.float64)

    def affine(self, cov: Mapping[str, Any]) -> tuple[float, float, float, np.ndarray, np.ndarray] | None:
        """``(unit, atol, rtol, add, mult)`` with ``s = unit * (atol + rtol*|ref| + add) * mult``
        (``add``, ``mult`` per run, from ``cov``), as :meth:`scale` computes it; None for
        ``form="baseline"``, whose scale is not affine in ``|ref|``."""
        if self.form == "baseline":
            return None
        add, mult = self.run_factor(cov)
        return float(self.unit), float(self.atol), float(self.rtol), add, mult

    def scale(self, ref_abs: Any, cov: Mapping[str, Any] | None = None, dtype: Any = None) -> np.ndarray:
        """Noise scale ``s`` of elements with reference magnitudes ``ref_abs``.

        Parameters
        ----------
        ref_abs : array_like
            ``|expected|``; for dataset arrays shape ``(run, sample)``.
        cov : mapping, optional
            Run covariates (scalars, or arrays over runs broadcasting against
            ``ref_abs[:, None]``).
        dtype : str, optional
            Target dtype (needed by ``form="baseline"`` for its floor).
        """
        cov = {} if cov is None else cov
        r = np.asarray(ref_abs, dtype=np.float64)
        if self.form == "baseline":
            eps = target_dtype(dtype).eps if dtype is not None else 1.0
            b = np.asarray(_need(cov, self.baseline), dtype=np.float64)
            rms = np.asarray(_need(cov, "ref_rms"), dtype=np.float64)
            s = np.maximum(b, self.floor * eps * rms)
            s = np.maximum(s, _TINY)
            if r.ndim == 2 and s.ndim == 1:
                s = s[:, None]
            return np.broadcast_to(s, r.shape) if r.ndim else s
        add, mult = self.run_factor(cov)
        if r.ndim == 2:
            add = add[:, None] if add.ndim == 1 else add
            mult = mult[:, None] if mult.ndim == 1 else mult
        s = self.unit * (self.atol + self.rtol * r + add) * mult
        return np.maximum(s, _TINY)

    def allclose_pair(self, cov: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """``(atol, rtol)`` with ``s = atol + rtol*|ref|`` for one run's covariates.

        Raises
        ------
        ValueError
            For ``form="baseline"`` (not an allclose pair), or missing covariates.
        """
        if self.form == "baseline":
            raise ValueError("a baseline-relative scale has no (atol, rtol) form")
        add, mult = self.run_factor({} if cov is None else cov)
        return (float(self.unit * (self.atol + add) * mult), float(self.unit * self.rtol * mult))

    @classmethod
    def fit_free(cls, dtype: Any) -> "ScaleModel":
        """The scale that needs no calibration run: ``eps * (|ref| + ref_rms)``.

        The rounding noise of one output element in units of the format's epsilon: a
        relative part at the element's own magnitude and an absolute part at the run's
        RMS magnitude (cancellation). No parameter is fitted, so every calibration run
        certifies the threshold (used by :func:`tolstat.select` when fitting a scale
        would leave too few runs for the order statistic).
        """
        return cls(form="normalised", atol=0.0, rtol=1.0, unit=float(target_dtype(dtype).eps),
                   linear={"ref_rms": 1.0}, notes="fit-free: eps * (|ref| + ref_rms), no parameter fitted")

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-able, floats kept as Python floats)."""
        return {
            "form": self.form,
            "atol": float(self.atol),
            "rtol": float(self.rtol),
            "unit": float(self.unit),
            "linear": {k: float(v) for k, v in self.linear.items()},
            "power": {k: [float(b), float(r)] for k, (b, r) in self.power.items()},
            "baseline": self.baseline,
            "floor": float(self.floor),
            "quantile": float(self.quantile),
            "notes": self.notes,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ScaleModel":
        """Inverse of :meth:`to_dict`."""
        return cls(
            form=str(d["form"]),
            atol=float(d.get("atol", 0.0)),
            rtol=float(d.get("rtol", 0.0)),
            unit=float(d.get("unit", 1.0)),
            linear={k: float(v) for k, v in dict(d.get("linear", {})).items()},
            power={k: (float(v[0]), float(v[1])) for k, v in dict(d.get("power", {})).items()},
            baseline=str(d.get("baseline", "")),
            floor=float(d.get("floor", 1.0)),
            quantile=float(d.get("quantile", float("nan"))),
            notes=str(d.get("notes", "")),
        )


def _need(cov: Mapping[str, Any], name: str) -> Any:
    if name not in cov:
        raise ValueError(
            f"the scale model needs the run covariate {name!r}; pass covariates={{{name!r}: ...}} "
            f"(have: {sorted(cov)})"
        )
    return cov[name]


@dataclass(frozen=True)
class ScaleOptions:
    """Settings of the noise-scale fit used by :func:`tolstat.select` with a ``form``.

    Attributes
    ----------
    quantile : float, default 0.99
        Element-error quantile the scale model is fitted at (only its shape matters).
    size_covariate : str, optional
        ``size_aware``: the size covariate (default ``"K"``, else ``"n_elements"``).
    linear, power : tuple of str
        ``normalised``: additive (default ``("ref_rms",)``) and power-law run covariates.
    baseline : str, default "baseline_max_abs"
        ``baseline``: covariate holding the same-precision baseline's max error.
    floor : float, default 1.0
        ``baseline``: floor ``floor * eps * ref_rms`` used when the baseline error is 0.
    solver : {"statsmodels", "lp"}
        Quantile regression solver.
    max_points : int, default 20000
        Element samples used by the quantile regression.
    """

    quantile: float = 0.99
    size_covariate: str | None = None
    linear: tuple[str, ...] = ("ref_rms",)
    power: tuple[str, ...] = ()
    baseline: str = "baseline_max_abs"
    floor: float = 1.0
    solver: str = "statsmodels"
    max_points: int = 20000

    def __post_init__(self) -> None:
        object.__setattr__(self, "linear", tuple(self.linear))
        object.__setattr__(self, "power", tuple(self.power))
        unit_interval("ScaleOptions.quantile", self.quantile)
        if self.solver not in ("statsmodels", "lp"):
            raise ValueError(f"ScaleOptions.solver must be 'statsmodels' or 'lp', got {self.solver!r}")
        if isinstance(self.max_points, bool) or not isinstance(self.max_points, (int, np.integer)) \
                or self.max_points < 10:
            raise ValueError(f"ScaleOptions.max_points must be an integer >= 10, got {self.max_points!r}")
        if not (isinstance(self.floor, (int, float, np.floating)) and math.isfinite(self.floor) and self.floor >= 0):
            raise ValueError(f"ScaleOptions.floor must be finite and >= 0, got {self.floor!r}")

    def fit(self, ds: Any, form: str, *, seed: int = 0) -> "ScaleModel":
        """:func:`fit_scale` of one group with these settings."""
        return fit_scale(ds, form, self, seed=seed)

    def to_dict(self) -> dict[str, Any]:
        """Provenance form: the field names and values (``ScaleOptions(**d)`` rebuilds it)."""
        d = dataclasses.asdict(self)
        d["linear"], d["power"] = list(self.linear), list(self.power)
        return d


# --------------------------------------------------------------------------- quantile regression
def quantreg(y: Any, X: Any, q: float, *, max_iter: int = 2000) -> np.ndarray:
    """Linear quantile regression coefficients: statsmodels ``QuantReg``'s IRLS.

    Columns of ``X`` are rescaled to unit max before the fit (IRLS conditioning) and the
    coefficients scaled back, so results equal ``QuantReg(y, X).fit(q=q).params`` up to
    the solver's tolerance. The iterations are :func:`_quantreg_irls`: statsmodels'
    own, bit for bit, without what its ``fit`` computes besides the coefficients.
    """
    y = np.asarray(y, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    cs = np.max(np.abs(X), axis=0)
    cs[cs == 0] = 1.0
    ys = float(np.max(np.abs(y))) or 1.0
    return _quantreg_irls(y / ys, X / cs, q, max_iter=max_iter) * ys / cs


def _quantreg_irls(endog: np.ndarray, exog: np.ndarray, q: float, *, max_iter: int,
                   p_tol: float = 1e-6) -> np.ndarray:
    """The coefficients of ``statsmodels.regression.quantile_regression.QuantReg(endog,
    exog).fit(q=q, max_iter=max_iter, p_tol=p_tol).params``, bit for bit (tested).

    The same iteration: weighted least squares by numpy's BLAS products and ``pinv`` (the
    same calls, so the same sums), the residuals reweighted element by element in
    statsmodels' order (:func:`tolstat.models.qr_kernels.residual_weights`, one numba pass
    where statsmodels makes seven numpy passes; then one flat division, as exact as
    statsmodels' broadcast one and about 4x faster), the same stopping rule (largest coefficient
    change at most ``p_tol``, ``max_iter``, a cycle). statsmodels' ``fit`` also computes
    the matrix rank, a bandwidth, a sparsity estimate, a covariance matrix and a history
    of mean squared residuals, which the scale fits do not read: about half the time.
    """
    from tolstat.models.qr_kernels import residual_weights

    if not 0 < q < 1:
        raise ValueError(f"q must be strictly between 0 and 1, got {q!r}")
    endog = np.ascontiguousarray(endog, dtype=np.float64)
    exog = np.ascontiguousarray(exog, dtype=np.float64)
    xstar = exog  # the weighted design: exog at first, then the buffer reweight fills
    buf, w = np.empty_like(exog), np.empty(exog.size)
    flat_exog, flat_buf = exog.reshape(-1), buf.reshape(-1)
    beta = np.ones(exog.shape[1])
    history: list[np.ndarray] = []
    diff, n_iter, cycle = 10.0, 0, False
    while n_iter < max_iter and diff > p_tol and not cycle:
        n_iter += 1
        beta0 = beta
        xtx = np.dot(xstar.T, exog)
        xty = np.dot(xstar.T, endog)
        beta = np.dot(np.linalg.pinv(xtx), xty)
        residual_weights(endog, np.dot(exog, beta), float(q), 1 - q, w)
        np.divide(flat_exog, w, out=flat_buf)  # xstar = exog / w[:, None]; xstar was read: overwrite
        xstar = buf
        diff = np.max(np.abs(beta - beta0))
        history.append(beta)
        if n_iter >= 300 and n_iter % 100 == 0:  # statsmodels' check for a convergence cycle
            cycle = any(np.all(beta == history[-ii]) for ii in range(2, 10))
    return beta


def quantreg_lp(y: Any, X: Any, q: float) -> np.ndarray:
    """Exact linear quantile regression as a linear program (scipy HiGHS).

    Minimises ``sum_i rho_q(y_i - X_i b)`` exactly:
    ``min q*1'u + (1-q)*1'v  s.t.  X b + u - v = y, u, v >= 0``.
    """
    from scipy import optimize, sparse

    y = np.asarray(y, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    n, p = X.shape
    cs = np.max(np.abs(X), axis=0)
    cs[cs == 0] = 1.0
    ys = float(np.max(np.abs(y))) or 1.0
    Xs = X / cs
    c = np.concatenate([np.zeros(p), np.full(n, q), np.full(n, 1.0 - q)])
    eye = sparse.identity(n, format="csr")
    A = sparse.hstack([sparse.csr_matrix(Xs), eye, -eye], format="csr")
    bounds = [(None, None)] * p + [(0, None)] * (2 * n)
    res = optimize.linprog(c, A_eq=A, b_eq=y / ys, bounds=bounds, method="highs")
    if not res.success:  # pragma: no cover - HiGHS fails only on broken input
        raise RuntimeError(f"quantile regression LP failed: {res.message}")
    return res.x[:p] * ys / cs


def _qr(y: np.ndarray, X: np.ndarray, q: float, solver: str) -> np.ndarray:
    if solver == "statsmodels":
        return quantreg(y, X, q)
    if solver == "lp":
        return quantreg_lp(y, X, q)
    raise ValueError(f"solver must be 'statsmodels' or 'lp', got {solver!r}")


def fit_allclose(
    abs_err: Any,
    ref_abs: Any,
    q: float = 0.99,
    *,
    extra: Mapping[str, Any] | None = None,
    solver: str = "statsmodels",
) -> tuple[np.ndarray, list[str], str]:
    """Fit ``|d| ~ atol + rtol*|ref| (+ sum_j w_j * extra_j)`` at quantile ``q``.

    Nonnegative coefficients are enforced by dropping a column whose coefficient comes
    out negative and refitting; a nonpositive ``atol`` is replaced by a small positive
    floor (so that ``s > 0``).

    Returns
    -------
    coef : ndarray
        ``[atol, rtol, w_1, ...]`` (dropped columns are 0).
    names : list of str
        ``["atol", "rtol", *extra]``.
    notes : str
        What was dropped or floored.
    """
    y = np.asarray(abs_err, dtype=np.float64).ravel()
    r = np.asarray(ref_abs, dtype=np.float64).ravel()
    names = ["atol", "rtol"] + list(extra or {})
    cols = [np.ones_like(r), r] + [np.asarray(v, dtype=np.float64).ravel() for v in (extra or {}).values()]
    ok = np.isfinite(y) & np.isfinite(r)
    for c in cols:
        ok &= np.isfinite(c)
    if ok.sum() < 2:
        raise ValueError("too few finite element errors to fit a scale model")
    y = y[ok]
    cols = [c[ok] for c in cols]
    notes = []
    active = list(range(len(cols)))
    coef = np.zeros(len(cols))
    for _ in range(len(cols)):
        # a constant column alone when all others dropped
        X = np.column_stack([cols[j] for j in active])
        # drop columns with no variation (other than the intercept)
        b = _qr(y, X, q, solver) if X.shape[1] > 1 else np.array([float(np.quantile(y, q))])
        neg = [active[i] for i, v in enumerate(b) if v < 0 and active[i] != 0]
        if not neg:
            coef[:] = 0.0
            coef[active] = b
            break
        worst = neg[int(np.argmin([b[active.index(j)] for j in neg]))]
        notes.append(f"{names[worst]} came out negative and was dropped")
        active.remove(worst)
    if coef[0] <= 0:
        pos = y[y > 0]
        floor = float(np.quantile(pos, 0.01)) * 1e-3 if pos.size else _TINY
        rest = coef[1] * float(np.median(r)) if coef[1] > 0 else 0.0
        floor = max(floor, 1e-3 * rest, _TINY)
        notes.append(f"atol came out {coef[0]:.3g} <= 0; floored at {floor:.3g}")
        coef[0] = floor
    return coef, names, "; ".join(notes)


def _element_subsample(ds: Any, max_points: int, rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat (abs, ref, run index) of about ``max_points`` elements of the runs' fit samples.

    The fit sample of a run is the first ``n_fit`` slots of its element sample
    (:data:`tolstat.dataset.schema.FIT_SAMPLE_SIZE`: a uniform draw of its elements, the same
    whatever the dataset's ``sample_size``; the whole sample of a file written before it).
    Reads the element samples ``RUN_BLOCK`` runs at a time (memory stays bounded for
    dask-backed data); each block contributes in proportion to its fit elements, and
    within a block the elements are a uniform draw without replacement. Non-finite
    errors are left out.
    """
    ns = fit_counts(ds)  # the fit sample: the first n_fit slots of each run (all of an older file's)
    total = int(ns.sum())
    take_all = total <= max_points
    out_a, out_r, out_rows = [], [], []
    read_abs, read_ref = sample_blocks(ds, "sample_abs", None), sample_blocks(ds, "sample_ref", None)
    for sl in run_blocks(ns.size):
        nb = ns[sl]
        valid_b = int(nb.sum())
        if valid_b == 0:
            continue
        want = valid_b if take_all else int(round(max_points * valid_b / total))
        if want == 0:
            continue
        abs_s, ref_s = read_abs(sl), read_ref(sl)
        rows, cols = np.nonzero(sample_mask(abs_s, nb))
        if rows.size > want:
            pick = np.sort(rng.choice(rows.size, size=want, replace=False))
            rows, cols = rows[pick], cols[pick]
        a = abs_s[rows, cols]
        fin = np.isfinite(a)
        out_a.append(a[fin])
        out_r.append(ref_s[rows, cols][fin])
        out_rows.append(rows[fin] + sl.start)
    if not out_a:
        return np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
    return np.concatenate(out_a), np.concatenate(out_r), np.concatenate(out_rows)


def fit_scale(ds: Any, form: str, options: "ScaleOptions | None" = None, *, seed: int = 0) -> ScaleModel:
    """Fit a noise-scale model to the runs of one group of an error dataset.

    Parameters
    ----------
    ds : xarray.Dataset
        An error dataset holding the runs of one (op, dtype, hardware) group.
    form : {"allclose", "size_aware", "normalised", "baseline"}
        Model form (module docstring).
    options : ScaleOptions, optional
        The fit's settings (:class:`ScaleOptions`): the element-error quantile the
        coefficients are fitted at (only the *shape* of ``s`` depends on it: the
        threshold is calibrated on the run score afterwards), the size covariate of
        ``size_aware``, the run covariates of ``normalised`` (``linear``/``power``, used by
        that form only), the covariate and floor of ``baseline``, the element samples of
        the quantile regression and its solver. Default ``ScaleOptions()``.
    seed : int
        Seed of the element subsample (spread over runs).

    Returns
    -------
    ScaleModel
    """
    opts = ScaleOptions() if options is None else options
    if not isinstance(opts, ScaleOptions):
        raise TypeError(f"options must be a ScaleOptions, got {type(opts).__name__}")
    quantile, size_covariate, baseline, floor = opts.quantile, opts.size_covariate, opts.baseline, opts.floor
    max_points, solver = opts.max_points, opts.solver
    linear, power = (opts.linear, opts.power) if form == "normalised" else ((), ())
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    dtype = str(ds["dtype"].values[0])
    eps = target_dtype(dtype).eps
    if form == "baseline":
        if baseline not in ds:
            raise ValueError(f"form='baseline' needs the run covariate {baseline!r} in the dataset")
        return ScaleModel("baseline", baseline=baseline, floor=float(floor), quantile=quantile,
                          notes=f"s = max({baseline}, {floor:g}*eps*ref_rms)")
    rng = np.random.default_rng(seed)
    a, r, rows = _element_subsample(ds, max_points, rng)
    if form == "allclose":
        coef, _, notes = fit_allclose(a, r, quantile, solver=solver)
        return ScaleModel("allclose", atol=float(coef[0]), rtol=float(coef[1]), quantile=quantile, notes=notes)
    if form == "size_aware":
        size = size_covariate if size_covariate is not None else ("K" if "K" in ds else "n_elements")
        # the run's magnitude: reductions err with the operands, not the output
        power_names, linear_names, unit = (size,), ("ref_rms",), eps
    else:
        power_names, linear_names, unit = tuple(power), tuple(linear), 1.0
    for name in power_names + linear_names:
        if name not in ds:
            raise ValueError(f"covariate {name!r} is not in the dataset (have {_covs(ds)})")
    pw, notes = _fit_power(ds, power_names, solver)
    extra = {k: np.asarray(ds[k].values, dtype=np.float64)[rows] for k in linear_names}
    mult = np.ones(a.size)
    for k, (beta, ref) in pw.items():
        mult = mult * (np.asarray(ds[k].values, dtype=np.float64)[rows] / ref) ** beta
    coef, names, n2 = fit_allclose(a / (unit * mult), r, quantile, extra=extra, solver=solver)
    if n2:
        notes.append(n2)
    lin = {k: float(coef[2 + j]) for j, k in enumerate(linear_names)}
    return ScaleModel(form, atol=float(coef[0]), rtol=float(coef[1]), unit=unit, linear=lin, power=pw,
                      quantile=quantile, notes="; ".join(notes))


def _fit_power(ds: Any, power: tuple[str, ...], solver: str) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Exponents and reference values of the power covariates, and notes.

    The exponents come from a median log-linear quantile regression of the run's
    ``log max_abs`` on ``log ref_rms`` and the log covariates.
    """
    pw: dict[str, tuple[float, float]] = {}
    notes: list[str] = []
    if power:
        P = {k: np.asarray(ds[k].values, dtype=np.float64) for k in power}
        for k, v in P.items():
            if np.any(~(v > 0)):
                raise ValueError(f"power covariate {k!r} must be > 0 in every run")
        mx = np.asarray(ds["max_abs"].values, dtype=np.float64)
        rms = np.asarray(ds["ref_rms"].values, dtype=np.float64)
        ok = (mx > 0) & np.isfinite(mx) & (rms > 0)
        refs = {k: float(np.exp(np.mean(np.log(v)))) for k, v in P.items()}
        betas = {k: 0.0 for k in power}
        varying = [k for k in power if np.ptp(np.log(P[k][ok])) > 0] if ok.any() else []
        if ok.sum() >= 3 and varying:
            cols = [np.ones(int(ok.sum()))]
            use_rms = np.ptp(np.log(rms[ok])) > 0
            if use_rms:
                cols.append(np.log(rms[ok]))
            cols += [np.log(P[k][ok] / refs[k]) for k in varying]
            b = _qr(np.log(mx[ok]), np.column_stack(cols), 0.5, solver)
            for j, k in enumerate(varying):
                betas[k] = float(b[len(cols) - len(varying) + j])
        else:
            notes.append("size covariates do not vary (or all errors are 0): exponents set to 0")
        pw = {k: (betas[k], refs[k]) for k in power}
    return pw, notes


def _covs(ds: Any) -> list[str]:
    return [x for x in str(ds.attrs.get("covariates", "")).split(",") if x]


def run_scores(ds: Any, model: ScaleModel | None, statistic: str = "max_abs") -> RunScores:
    """Per-run check statistic of the runs of a dataset (:mod:`tolstat.models.statistics`).

    With ``model=None`` the plain run statistic (``max_abs``, ``max_ulp`` or
    ``max_rel``) is returned. Otherwise the normalised score
    ``max_i |d_i| / s(|ref_i|, covariates)`` (``max_score``) is computed from the
    element sample; it is exact (equal to the maximum over the whole output): ``s`` is
    affine in ``|ref|`` within a run and the sample keeps the front or its upper convex
    hull (module docstring).

    Returns
    -------
    RunScores
        ``scores`` (one per run, ``inf`` for runs with non-finite output) and
        ``n_inexact`` (runs whose score may be a lower bound).
    """
    if model is None:
        if statistic not in MAX_STATISTICS:
            raise ValueError(f"unknown statistic {statistic!r}")
        return get_statistic(statistic).run_scores(ds)
    return get_statistic("max_score").run_scores(ds, model)
