"""Check kernel outputs against a tolerance table: :func:`check` and :func:`assert_close`.

Last step of the data flow (errors -> select -> **check**). A check computes the same
statistics the table was calibrated on (the max-error statistic, normalised by the
table's scale model if it has one, and the bias statistic if calibrated), compares each
with its threshold, and says how unlikely the observed error is for a correct kernel.
"""

from __future__ import annotations

import inspect

import math
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from tolstat._base import validate as _validate
from tolstat._base.threads import settle, submit_side
from tolstat.dataset.runs import validate_op_args
from tolstat._base.util import group_rows
from tolstat._base.dtypes import canonical_dtype, target_dtype
from tolstat.dataset.schema import BUILTIN_COVARIATES
from tolstat.measure.metrics import ErrorMetrics, as_array, error_metrics, ulp_distance
from tolstat.models.statistics import get as get_statistic
from tolstat.measure.metrics import metric_covariates
from tolstat.models.statistics import pair_op_statistics, rounded_statistics
from tolstat.measure.invariants import invariants
from tolstat.measure.noise import (PLAIN_SHAPE, beyond_calibration, combined_score, noise_scale, score_of_pair,
                                   op_pass_coefficients, output_rows, pass_invariants, PassWithInvariants, size_limits,
                                   statistics_of_pass)
from tolstat.calibration.certificate import score_member
from tolstat.calibration.table import MissingGroup, ToleranceEntry, ToleranceTable
from tolstat.calibration.decision import (SQRT_N_STATISTICS, carried_values, entry_failed_runs,
                                         is_max_statistic, pair_is_correctly_rounded, pair_value, ratio_value,
                                         size_factors)
from tolstat.checks.fast import by_identity, cached_entry, cached_plan, fast_check, unravel
from tolstat.measure.fused import op_check_statistics, op_statistics
from tolstat.checks.options import CheckOptions, check_options
from tolstat.checks.result import CheckResult

__all__ = ["CalibrationRangeWarning", "check", "check_runs", "check_metrics", "assert_close"]


def check(
    actual: Any,
    expected: Any,
    *,
    op: str,
    dtype: Any,
    table: ToleranceTable,
    inputs: Sequence[Any] | None = None,
    params: Mapping[str, Any] | None = None,
    hardware: str | None = None,
    covariates: Mapping[str, Any] | None = None,
    options: CheckOptions | None = None,
) -> CheckResult:
    """Check one kernel output against its float64 reference with a calibrated table.

    Parameters
    ----------
    actual : array_like
        Kernel output (numpy array, torch tensor, anything :func:`tolstat.measure.metrics.as_array`
        takes).
    expected : array_like
        Reference, same shape (float64 preferred).
    op, dtype : str
        The table group; ``dtype`` is the target dtype (any spelling).
    table : ToleranceTable or None
        From :func:`tolstat.select` or :func:`tolstat.load_table`. ``None`` only with
        ``options=CheckOptions(uncalibrated="model")`` (a model-based check from zero runs).
    inputs : sequence, optional
        The positional arguments of the torch function named by ``op``, exactly as the
        kernel took them (e.g. ``(x, (n,), w, b)`` for ``layer_norm``). With them the
        operator statistics come from :func:`tolstat.ops.op_statistics`: the magnitude
        and the reduction length ``K`` of an operator-form group, and ``K`` of a scale
        form that uses it. An op :mod:`tolstat.ops` does not know raises its error
        (naming :func:`tolstat.ops.register`).
    params : mapping, optional
        The keyword arguments of that function (e.g. ``{"eps": 1e-5}``); only with ``inputs``.
    hardware : str, optional
        Hardware label; falls back as :meth:`ToleranceTable.entry` documents.
    covariates : mapping, optional
        Run covariates the table's scale model needs (e.g. ``{"K": 512}``): finite
        real numbers. ``ref_rms``, ``ref_max_abs`` and ``n_elements`` are computed from
        ``expected`` and may not be given (``ValueError`` naming the key): a user value
        could switch the check off. With ``inputs``, ``K`` is derived and need not be given.
    options : CheckOptions, optional
        The expert override of the operator magnitude, ``allow_nan``,
        ``hardware_policy`` and ``uncalibrated`` (:class:`~tolstat.checks.options.CheckOptions`);
        default ``CheckOptions()``. With ``uncalibrated="model"`` a group the table does
        not have is decided by the zero-run model threshold (``inputs=`` needed; the
        result's ``methods`` is ``{"zero_run": "model_zero_run"}`` and its message says
        it is model-based).

    Returns
    -------
    CheckResult

    Raises
    ------
    KeyError
        No table group for (op, dtype, hardware); with ``inputs``, an op
        :mod:`tolstat.ops` does not know.
    ValueError
        Shape mismatch, NaN reference, a covariate the scale model needs is missing,
        a covariate that is NaN/inf or computed; an operator-form group without
        ``inputs`` or a magnitude; ``inputs`` together with ``options.magnitude``;
        a covariate ``K`` that differs from the one ``inputs`` give; ``params``
        without ``inputs``.
    TypeError
        Non-float arrays (integer, complex, string, structured), a covariate that is
        not a real number (a list, a string), ``options`` not a
        :class:`~tolstat.checks.options.CheckOptions`, ``inputs`` not a sequence or
        ``params`` not a mapping.

    Examples
    --------
    ``check(out, ref, op="layer_norm", dtype="float16", inputs=(x, (n,), w, b),
    params={"eps": 1e-5}, table=t)``.
    """
    opts = check_options(options)
    if table is None and opts.uncalibrated == "model":
        return _zero_run_result(actual, expected, op, canonical_dtype(dtype), inputs, params, hardware, 0.01)
    if not isinstance(table, ToleranceTable):
        raise TypeError(f"table must be a ToleranceTable, got {type(table).__name__}"
                        + (" (a check without a table needs options=CheckOptions(uncalibrated='model'): a "
                           "model-based threshold from zero runs)" if table is None else ""))
    dt = canonical_dtype(dtype)
    try:
        plan = cached_plan(table, op, dt, hardware, hardware_policy=opts.hardware_policy)
    except MissingGroup:
        if opts.uncalibrated != "model":
            raise
        return _zero_run_result(actual, expected, op, dt, inputs, params, hardware, table.fp_budget)
    ent = plan.entry
    a = as_array(actual, name="actual")
    e = as_array(expected, name="expected")
    _warn_beyond_calibration(ent, e.shape)
    covariates = _validate.covariates(covariates, computed=BUILTIN_COVARIATES)
    magnitude, covariates = resolve_op_inputs(ent, op, dt, inputs, params, covariates, opts.magnitude,
                                              reference=e)
    source = "ops" if inputs is not None else "ref" if isinstance(magnitude, str) else "given"
    if ent.operator:
        check_magnitude(ent, op, e, magnitude, source, arrays=False)
    if inputs is not None and magnitude is not None and np.shape(magnitude) != e.shape:
        raise ValueError(f"the inputs of {op!r} give an output of shape {np.shape(magnitude)} but expected has "
                         f"shape {e.shape}: pass the op's own arguments as inputs=")
    # one fused pass where the entry and the pair allow it; its result, passed or failed, is
    # the general path's (check_metrics, the definition) bit for bit (tests/test_fastcheck.py)
    if ent.operator:
        fast = _fast_operator(a, e, ent, covariates, magnitude, op=op, given=source == "given")
        if fast is None:
            check_magnitude(ent, op, e, magnitude, source)
    else:
        fast = fast_check(a, e, plan, covariates)
    if fast is not None:
        return fast
    m = error_metrics(a, e, dtype=dt, allow_nan=opts.allow_nan)
    return check_metrics(m, a, e, ent, covariates, magnitude=magnitude)


def _user_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn` (called by the caller of this function)
    that names the first frame outside the tolstat package: the user's ``check``,
    ``assert_close`` or plugin call, whichever tolstat functions lie between."""
    import sys

    frame, level = sys._getframe(2), 2  # the function that warns is level 1
    while frame is not None and _in_package(frame.f_code):
        frame, level = frame.f_back, level + 1
    return level


#: code object -> whether its file lies in the tolstat package (a check that warns walks
#: the same few frames every time)
_IN_PACKAGE: dict[Any, bool] = {}


def _in_package(code: Any) -> bool:
    got = _IN_PACKAGE.get(code)
    if got is None:
        import os

        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if len(_IN_PACKAGE) > 4096:
            _IN_PACKAGE.clear()
        got = _IN_PACKAGE[code] = os.path.abspath(code.co_filename).startswith(root + os.sep)
    return got


class CalibrationRangeWarning(UserWarning):
    """A check of an output larger than every calibration run of its table group.

    The promise covers runs like the calibration runs. A statistic that takes a maximum
    over elements or rows (the largest error, the largest row statistic, an invariant's
    worst row) grows with the output's size, so a correct output much larger than those
    calibrated can fail more often than the budget says. Calibrate on outputs of the size
    you check."""


def _warn_beyond_calibration(ent: ToleranceEntry, shape: tuple[int, ...]) -> None:
    """A :class:`CalibrationRangeWarning` when an output of ``shape`` has more elements than
    the largest calibration run of ``ent``'s group (tables that do not record it: nothing);
    it says what of the decision is carried beyond the calibrated size
    (:func:`tolstat.measure.noise.beyond_calibration`,
    :func:`tolstat.calibration.decision.beyond_calibrated_size`)."""
    top = (ent.certificate or {}).get("n_elements_max")
    if top is None or math.prod(shape) <= top:
        return
    texts = by_identity(_RANGE_TEXTS, ent, lambda _: {})  # the text per shape, made once
    text = texts.get(shape)
    if text is None:
        if len(texts) > 64:
            texts.clear()
        text = texts[shape] = _range_text(ent, shape, top)
    warnings.warn(CalibrationRangeWarning(text), stacklevel=_user_stacklevel())


#: per table entry (by identity), the warning text of each shape checked beyond its calibrated size
_RANGE_TEXTS: dict[int, tuple[ToleranceEntry, dict[tuple[int, ...], str]]] = {}


def _range_text(ent: ToleranceEntry, shape: tuple[int, ...], top: int) -> str:
    """The :class:`CalibrationRangeWarning` text of an output of ``shape`` (more elements than ``top``)."""
    cert = ent.certificate or {}
    n = math.prod(shape)
    rows = output_rows(shape)
    rows_max, n_max = size_limits(cert) if ent.operator else (None, None)
    carried = ""
    if rows_max is not None and rows > rows_max:
        carried = (f"; its row invariants and row bias are carried from the {rows_max:,} rows calibrated to its "
                   f"{rows:,} (model-based: independent, normal row sums)")
    if n_max is not None:
        carried += f"; its whole-output bias is read at the calibrated size ({n_max:,} elements)"
    if not ent.operator:
        stats = list(ent.statistics)
        if any(is_max_statistic(k) for k in stats):
            carried += (f"; its largest error is carried from the {top:,} elements calibrated to its {n:,} "
                        "(model-based: independent, normal element errors)")
        if any(k in SQRT_N_STATISTICS for k in stats):
            carried += f"; its bias is read at the calibrated size ({top:,} elements)"
    return (f"table group ({ent.op}, {ent.dtype}, {ent.hardware}): this output has {n:,} elements, "
            f"{n / max(top, 1):.3g}x the largest calibration run ({top:,}){carried}; the false-positive promise "
            "covers runs like the calibration runs, and maxima over more elements or rows are larger: calibrate on "
            "outputs of this size")


#: intermediate roundings to the output format the zero-run fallback of a check allows
#: (``tolstat.ops.tolerance(stores=1)``: 0.03 % false positives on the corpus's correct runs
#: at a 1 % budget where ``stores=0`` had 15.5 %, docs/ops.md)
ZERO_RUN_STORES = 1


def _zero_run_result(actual: Any, expected: Any, op: str, dtype: str, inputs: Sequence[Any] | None,
                     params: Mapping[str, Any] | None, hardware: str | None, fp_budget: float) -> CheckResult:
    """The check of a group without calibration runs (``CheckOptions(uncalibrated="model")``):
    the zero-run threshold of :func:`tolstat.ops.tolerance` decides, labelled model-based."""
    from tolstat.ops.zero_run import MODEL_LABEL, tolerance

    if inputs is None:
        raise ValueError(f"no table group for op={op!r}, dtype={dtype!r}: the model-based check from zero runs "
                         "(CheckOptions(uncalibrated='model')) needs inputs= (the op's arguments)")
    validate_op_args(inputs, params)
    a = as_array(actual, name="actual")
    e = as_array(expected, name="expected")
    if a.shape != e.shape:
        raise ValueError(f"actual has shape {a.shape} but expected has shape {e.shape}")
    tol = tolerance(op, dtype, tuple(inputs), params, fp_budget=fp_budget, stores=ZERO_RUN_STORES)
    r = tol.ratio(a, e)
    e64 = np.asarray(e, dtype=np.float64)
    a64 = np.asarray(a, dtype=np.float64)
    if r.size:
        i = int(np.argmax(r))
        worst = float(r.flat[i])
        idx = tuple(int(j) for j in np.unravel_index(i, r.shape)) if r.ndim else ()
        wa, we = float(a64.flat[i]), float(e64.flat[i])
        allowed = float(tol.threshold(e64).flat[i])
    else:
        worst, idx, wa, we, allowed = 0.0, (), math.nan, math.nan, math.nan
    failed = ("zero_run",) if worst > 1.0 else ()
    return CheckResult(
        passed=not failed, op=op, dtype=dtype, hardware="*" if hardware is None else str(hardware),
        fallback="no table group: zero-run model", statistics={"zero_run": worst},
        thresholds={"zero_run": 1.0}, ratios={"zero_run": ratio_value(worst, 1.0)},
        probabilities={"zero_run": math.nan}, notes={"zero_run": MODEL_LABEL}, failed=failed,
        worst_index=idx, worst_actual=wa, worst_expected=we, worst_error=abs(wa - we) if r.size else math.nan,
        worst_allowed=allowed, n_elements=int(r.size), n_exceeding=int((r > 1.0).sum()),
        n_nonfinite=int((~np.isfinite(a64)).sum()), atol=math.nan, rtol=math.nan, fp_budget=float(fp_budget),
        confidence=math.nan, methods={"zero_run": "model_zero_run"}, n_calibration=0,
        guarantee=(f"{MODEL_LABEL}; K={tol.K:g}, {tol.n} elements, tail factor {tol.tail:.3g} at "
                   f"{fp_budget:g} / {tol.n} per element, {tol.stores} intermediate store(s) allowed"))


def resolve_op_inputs(entry: ToleranceEntry, op: str, dtype: str, inputs: Sequence[Any] | None,
                      params: Mapping[str, Any] | None, covariates: Mapping[str, float],
                      magnitude: Any, *, reference: Any = None) -> tuple[Any, dict[str, float]]:
    """The magnitude and covariates a check of ``entry`` uses, with the op's ``inputs``.

    Without ``inputs`` they are ``magnitude`` and ``covariates`` as given. With them,
    where the entry uses operator statistics (the operator form) or ``K`` (a scale form
    with the covariate ``K``, or ``K`` given anyway), :func:`tolstat.ops.op_statistics`
    gives the magnitude (operator form; from ``reference``, the check's expected output,
    where the op has an identity for it, as at calibration) and ``K``; otherwise the op is
    only looked up, so an unknown op raises whatever the entry's form.

    Raises
    ------
    ValueError
        ``params`` without ``inputs``, ``inputs`` with ``magnitude``, or a given ``K``
        that differs from the op's.
    KeyError
        An op :mod:`tolstat.ops` does not know (its message names how to register it).
    """
    if inputs is None:
        if params is not None:
            raise ValueError(f"params={_validate.short_repr(params)} needs inputs= (the op's positional arguments)")
        return magnitude, dict(covariates)
    validate_op_args(inputs, params)
    if magnitude is not None:
        raise ValueError("pass either inputs= (the operator statistics are derived from them) or "
                         "CheckOptions(magnitude=...), not both")
    from tolstat import ops

    scale_k = entry.scale is not None and "K" in entry.scale.covariates
    if not (entry.operator or scale_k or "K" in covariates):
        ops.get(op)  # an unknown op raises here too, whatever the entry's form
        return None, dict(covariates)
    st = ops.op_statistics(op, tuple(inputs), params, dtype=dtype, reference=reference if entry.operator else None)
    cov = dict(covariates)
    k = float(st.K)
    if "K" in cov and cov["K"] != k:
        raise ValueError(f"covariates K={cov['K']:g} but the inputs of {op!r} give K={k:g}: leave K out "
                         "of covariates (it is derived from inputs=) or fix it")
    cov["K"] = k
    return (st.magnitude if entry.operator else None), cov


#: canonical ops of :mod:`tolstat.ops` whose magnitude is at least ``|ref|`` (the op on
#: absolute inputs bounds the op's own output); cumsum's is scaled by ``sqrt((j+1)/N)``
_MAGNITUDE_BOUNDS_REF_EXCEPT = frozenset({"cumsum"})


def check_magnitude(entry: ToleranceEntry, op: str, expected: np.ndarray, magnitude: Any, source: str, *,
                    arrays: bool = True) -> None:
    """Refuse a magnitude that contradicts the table or cannot be the op on absolute inputs.

    ``source`` says how the check got it: ``"ops"`` (derived from ``inputs=``), ``"given"``
    (``CheckOptions(magnitude=array)``) or ``"ref"``. The table's certificate records how
    its calibration runs' magnitudes were obtained (``magnitude``:
    :func:`tolstat.dataset.records.magnitude_convention`); ``|expected|`` (``"ref"``) is
    another scale than the op on absolute inputs (``"ops"``, ``"given"``), so mixing them
    is refused (tables that do not record it are not checked). A given magnitude must be
    finite and ``>= 0`` where ``expected`` is finite, and for an op of :mod:`tolstat.ops`
    (cumsum excepted) at least ``|expected|`` up to float64 rounding: a signed ``A @ B``
    or zeros give a scale too small. ``arrays=False``: only the table's convention (the
    operator check's fused pass tests the arrays, :func:`magnitude_error`).
    """
    cert = entry.certificate or {}
    table = set(str(cert.get("magnitude", "unknown")).split("+"))
    where = f"table group ({entry.op}, {entry.dtype}, {entry.hardware})"
    if "unknown" not in table:
        if source == "ref" and "ref" not in table:
            raise ValueError(f"{where} was calibrated with magnitudes of the op on absolute inputs ({'+'.join(sorted(table))}); "
                             "CheckOptions(magnitude='ref') (|expected|) is another scale: pass inputs= (and params=)")
        if source != "ref" and table == {"ref"}:
            raise ValueError(f"{where} was calibrated with magnitude='ref' (m = |expected|): check with "
                             "options=CheckOptions(magnitude='ref'), not with inputs= or a magnitude array")
    if source != "given" or magnitude is None or not arrays:
        return
    m = as_array(magnitude, name="magnitude")
    if m.dtype.kind not in "fiu":
        raise TypeError(f"CheckOptions.magnitude must be a real array, got dtype {m.dtype}")
    try:
        m = np.broadcast_to(np.asarray(m, dtype=np.float64), np.shape(expected))
    except ValueError as exc:
        raise ValueError(f"CheckOptions.magnitude has shape {m.shape}, which does not broadcast to expected's "
                         f"{np.shape(expected)}") from exc
    e = np.asarray(expected, dtype=np.float64)
    live = np.isfinite(e)
    bad = np.flatnonzero(live & ~(np.isfinite(m) & (m >= 0)))
    low = np.flatnonzero(live & (m < np.abs(e) * (1.0 - 1e-6))) if magnitude_bound_applies(op) else []
    err = magnitude_error(op, e, m, int(bad[0]) if len(bad) else -1, int(low[0]) if len(low) else -1)
    if err is not None:
        raise err


def magnitude_bound_applies(op: str) -> bool:
    """Whether a given magnitude of ``op`` must be at least ``|expected|`` (ops of :mod:`tolstat.ops`, cumsum excepted)."""
    from tolstat import ops

    name = ops.canonical_name(op)
    return name is not None and name not in _MAGNITUDE_BOUNDS_REF_EXCEPT


def magnitude_error(op: str, e: np.ndarray, m: np.ndarray, bad: int, low: int) -> ValueError | None:
    """The error of a given magnitude ``m`` (broadcast to ``e``'s shape): ``bad``, the first
    flat index where ``e`` is finite and ``m`` not a finite value ``>= 0``, ``low``, the first
    where ``m`` is below ``|e|`` (-1: none; ``low`` only where :func:`magnitude_bound_applies`)."""
    if bad >= 0:
        i = tuple(int(x) for x in np.unravel_index(bad, e.shape))
        return ValueError(f"CheckOptions.magnitude must be finite and >= 0 where expected is finite, got {m[i]!r} at "
                          f"index {i}: that is the magnitude's fault, not the kernel's")
    if low >= 0:
        i = tuple(int(x) for x in np.unravel_index(low, e.shape))
        return ValueError(f"CheckOptions.magnitude {m[i]:.6g} is below |expected| = {abs(e[i]):.6g} at index {i}: the "
                          f"magnitude of {op!r} is the op applied to the absolute inputs (|A| @ |B|), never below "
                          "|expected|; a signed A @ B or zeros give a scale too small. Pass inputs= to derive it")
    return None


def check_metrics(m: ErrorMetrics, actual: Any, expected: Any, entry: ToleranceEntry,
                  covariates: Mapping[str, Any] | None = None, *, magnitude: Any = None) -> CheckResult:
    """Check already computed error metrics against one table entry.

    The step of :func:`check` after the table lookup and :func:`tolstat.error_metrics`
    (for callers that have both, e.g. :mod:`tolstat.assess.evaluation`). ``covariates`` are the
    user's run covariates; the built-in ones (``ref_rms``, ...) are added from ``m``.
    The values compared with the thresholds are the decision values of
    :mod:`tolstat.calibration.decision`, the numbers the calibration certified: the registry's
    statistics, and 0 for a correctly rounded output (every element the reference rounded
    to nearest in the output format), which therefore passes every threshold.
    """
    ent = entry
    if ent.operator:
        return _check_operator(m, actual, expected, ent, covariates, magnitude)
    cov = metric_covariates(m, _validate.covariates(covariates, computed=BUILTIN_COVARIATES))
    name = ent.max_statistic
    c = ent.statistics[name].threshold
    max_stat = get_statistic(name)
    elem = max_stat.elements(m, ent.scale, cov, ent.dtype)
    allowed = max_stat.allowed(m, c, ent.scale, cov, ent.dtype)
    worst = int(np.argmax(elem))
    # the decision values (tolstat.calibration.decision): the statistics, 0 for a correctly rounded output
    cr = pair_is_correctly_rounded(m)
    values = {name: 0.0 if cr else float(elem[worst])}
    for k in ent.statistics:
        if k != name:
            values[k] = pair_value(m, k, ent.scale, cov, ent.dtype)
    # an output larger than every calibration run: its maxima carried to its size, its bias
    # read at the calibrated size (decision.beyond_calibrated_size); the allowances with them
    factors = size_factors(ent, m.n_elements)
    values = carried_values(values, factors)
    f = 1.0 if factors is None else float(factors[0])
    thresholds = {k: ent.statistics[k].threshold for k in values}
    shape = m.shape
    idx = tuple(int(i) for i in np.unravel_index(worst, shape)) if shape else ()
    a64 = np.asarray(actual, dtype=np.float64).ravel()
    e64 = np.asarray(expected, dtype=np.float64).ravel()
    n_exc = 0 if cr else int(np.sum(elem > c * f))
    try:
        atol, rtol = ent.allclose(cov)
    except (ValueError, KeyError):
        atol, rtol = math.nan, math.nan
    return CheckResult.of_entry(
        ent, values, thresholds, atol=atol * f, rtol=rtol * f,
        worst_index=idx, worst_actual=float(a64[worst]), worst_expected=float(e64[worst]),
        worst_error=float(m.abs[worst]),
        worst_allowed=float(allowed[worst]) * f if allowed is not None else math.nan,
        n_elements=m.n_elements, n_exceeding=n_exc, n_nonfinite=m.n_nonfinite, correctly_rounded=cr,
    )


def _op_inputs(ent: ToleranceEntry, covariates: Mapping[str, Any] | None, magnitude: Any) -> tuple[Any, float]:
    """The magnitude and K an operator-form check needs, or a clear error."""
    cert = ent.certificate or {}
    where = f"table group ({ent.op}, {ent.dtype}, {ent.hardware})"
    if magnitude is None and cert.get("needs_magnitude", True):
        raise ValueError(f"{where} was calibrated with operator statistics (form 'operator'): pass inputs= "
                         "(and params=), the op's own arguments, so that tolstat.ops derives the magnitude and K "
                         "(register an op it does not know with tolstat.ops.register), or the expert override "
                         "options=CheckOptions(magnitude=...) (the op applied to the absolute inputs, e.g. "
                         "|A| @ |B|; 'ref' when the table was calibrated with magnitude='ref')")
    if isinstance(magnitude, str):
        if magnitude != "ref":
            raise ValueError(f"magnitude must be an array or 'ref', got {magnitude!r}")
        magnitude = None
    K = 1.0
    if "K" in cert.get("covariates", []):
        if not covariates or "K" not in covariates:
            raise ValueError(f"{where} needs the covariate K (the reduction length): pass inputs= (and params=) "
                             "to derive it, or covariates={'K': ...}")
        K = float(covariates["K"])
    return magnitude, K


def _check_operator(m: ErrorMetrics, actual: Any, expected: Any, ent: ToleranceEntry,
                    covariates: Mapping[str, Any] | None, magnitude: Any) -> CheckResult:
    """Check against an operator-form entry: the combined score and each statistic's share."""
    cert = ent.certificate or {}
    mag, K = _op_inputs(ent, covariates, magnitude)
    thr = ent.statistics["op_score"].threshold
    q = dict(cert["normalisers"])
    sc = noise_scale(np.asarray(expected, dtype=np.float64), dtype=ent.dtype, magnitude=mag, K=K)
    sc = sc.ravel()
    z = np.where(np.asarray(m.nonfinite).ravel(), np.inf, np.asarray(m.abs).ravel() / sc)
    z = np.where(np.isnan(z), 0.0, z)
    worst = int(np.argmax(z)) if z.size else 0
    allowed = thr * q.get("op_max", math.inf) * sc
    shape = m.shape
    where = dict(
        worst_index=tuple(int(i) for i in np.unravel_index(worst, shape)) if shape else (),
        worst_actual=float(np.asarray(actual, dtype=np.float64).ravel()[worst]) if z.size else math.nan,
        worst_expected=float(np.asarray(expected, dtype=np.float64).ravel()[worst]) if z.size else math.nan,
        worst_error=float(m.abs.ravel()[worst]) if z.size else 0.0,
        worst_allowed=float(allowed[worst]) if z.size else math.nan,
        n_elements=m.n_elements, n_exceeding=int(np.sum(m.abs.ravel() > allowed)), n_nonfinite=m.n_nonfinite,
        correctly_rounded=pair_is_correctly_rounded(m),
    )
    return _operator_result(m, actual, expected, ent, mag, K, where)


def _operator_result(m: Any, actual: Any, expected: Any, ent: ToleranceEntry, mag: Any, K: float,
                     where: dict[str, Any], stats: Mapping[str, float] | None = None) -> CheckResult:
    """The result of an operator-form check: the statistics of the pair (``m.ulp`` gives
    the correctly rounded rule of :func:`tolstat.models.statistics.pair_op_statistics`;
    ``stats``: those statistics, computed by the caller's pass), their combined score, and
    the worst element (``where``)."""
    c = _op_constants(ent)
    if stats is None:
        stats = pair_op_statistics(actual, expected, m, dtype=ent.dtype, magnitude=mag, K=K, rowwise=c.rowwise,
                                   op=ent.op)
    if c.beyond is not None:  # an output larger than every calibration run: its row maxima and bias carried
        shape = np.shape(actual)
        rows, n = output_rows(shape), math.prod(shape)
        if (c.beyond[0] is not None and rows > c.beyond[0]) or (c.beyond[1] is not None and n > c.beyond[1]):
            stats = beyond_calibration(stats, rows=rows, rows_max=c.beyond[0], n=n, n_max=c.beyond[1])
    try:  # combined_score's loop for one pair, with the entry's normalisers worked out once
        s, which = score_of_pair(stats, c.score_keys, c.score_qs)
        s = float(s)
    except (KeyError, TypeError, ValueError):  # a statistic missing, or normalisers it refuses: its error
        s, which = combined_score(stats, c.q, which=True)
        s, which = float(s), str(which.item() if isinstance(which, np.ndarray) else which)
    values = {"op_score": s, **{k: float(stats[k]) for k in c.q}}
    note = ("no probability quoted: the threshold is an order statistic of the combined score"
            + (f"; {which} trips first" if which else ""))
    return CheckResult.of_entry(
        ent, values, c.thresholds, probabilities=dict.fromkeys(values, math.nan), notes=dict.fromkeys(values, note),
        decisive="op_score", methods=dict(c.methods), atol=math.nan, rtol=math.nan, **where,
    )


class _OpConstants:
    """What every operator-form check of one table entry reads, worked out once (:func:`_op_constants`)."""

    __slots__ = ("td", "q", "threshold", "kq", "rowwise", "thresholds", "methods", "lean", "beyond", "score_keys",
                 "score_qs", "has_invariants")

    def __init__(self, ent: ToleranceEntry) -> None:
        cert = ent.certificate or {}
        self.td = target_dtype(ent.dtype)
        self.q = dict(cert["normalisers"])
        # the normalisers as combined_score reads them for one pair, where it accepts them (else
        # every check calls combined_score, which raises its error)
        keys, qs = tuple(self.q), tuple(float(v) for v in self.q.values())
        ok = bool(keys) and all(math.isfinite(v) and v > 0 for v in qs)
        self.score_keys, self.score_qs = (keys, qs) if ok else (None, None)
        # the check's pass computes the statistics of the combined score only
        # (:func:`tolstat.measure.fused.op_check_statistics`); a table naming another takes the full pass
        self.lean = all(score_member(k, ent.op) for k in self.q)
        self.threshold = thr = ent.statistics["op_score"].threshold
        self.kq = thr * self.q.get("op_max", math.inf)
        self.rowwise = bool(cert.get("rowwise", False))
        self.thresholds = {"op_score": thr, **{k: thr * v for k, v in self.q.items()}}
        self.methods = dict.fromkeys(self.thresholds, ent.statistics["op_score"].method)
        # the calibrated size the score reads beyond (tables that do not record it: nothing carried)
        limits = size_limits(cert)
        self.beyond = None if limits == (None, None) else limits
        self.has_invariants = bool(invariants(ent.op))


_OP_CONSTANTS: dict[int, tuple[ToleranceEntry, _OpConstants]] = {}


def _op_constants(ent: ToleranceEntry) -> _OpConstants:
    """The :class:`_OpConstants` of an entry (cached by identity, :func:`tolstat.checks.fast.by_identity`)."""
    return by_identity(_OP_CONSTANTS, ent, _OpConstants)


def _fast_operator(a: np.ndarray, e: np.ndarray, ent: ToleranceEntry, covariates: Mapping[str, Any] | None,
                   magnitude: Any, *, op: str, given: bool) -> CheckResult | None:
    """:func:`_check_operator` of a finite pair in one
    fused pass (:func:`tolstat.measure.fused.op_statistics`: the statistics the table was
    calibrated on, the worst element, the exceedance count, the correctly rounded flag and,
    for a ``given`` magnitude, its checks); None where the general path is needed (it
    raises the errors). The pass is :func:`tolstat.measure.fused.op_check_statistics`
    (the same numbers but those no combined score holds, vectorised) where it applies, a
    finite pair with a magnitude that passes its tests, and ``op_statistics`` otherwise."""
    _validate.float_array("actual", a)
    _validate.float_array("expected", e)
    if a.shape != e.shape or a.size == 0:
        return None
    c = _op_constants(ent)
    td = c.td
    try:
        mag, K = _op_inputs(ent, covariates, magnitude)
        K = float(K)
        if not (math.isfinite(K) and K >= 0):
            return None
        m = None
        if mag is not None:
            mg = as_array(mag, name="magnitude")
            if mg.dtype.kind not in "fiu":
                return None
            m = np.asarray(mg, dtype=np.float64)
            if m.shape != e.shape:
                m = np.broadcast_to(m, e.shape)
    except (ValueError, TypeError):
        return None
    ef = np.asarray(e, dtype=np.float64)
    A, B, C, D = op_pass_coefficients(td, K)
    kq = c.kq
    rows = c.rowwise and a.ndim > 0
    rowlen = a.shape[-1] if rows else None
    # a large output's invariants on a second core during the pass (the same values; read
    # where statistics_of_pass would compute them, settled on every way out)
    side = submit_side((pass_invariants, (a, ef, mag), dict(dtype=ent.dtype, K=K, acc_dtype="float32", row_axis=-1,
                                                             op=ent.op))
                       ) if ef.size >= INVARIANTS_SIDE_SIZE and c.has_invariants else None
    try:
        return _fast_operator_pass(a, e, ef, ent, c, mag, m, K, (A, B, C, D), rows, rowlen, given=given, op=op,
                                   invariants=None if side is None else side[0].result)
    finally:
        settle(side)


#: outputs from this many elements on have their operator invariants computed on a second
#: core during the check's pass (:func:`tolstat._base.threads.submit_side`); below, the
#: hand-over costs about what it saves
INVARIANTS_SIDE_SIZE = 1 << 16


def _fast_operator_pass(a: np.ndarray, e: np.ndarray, ef: np.ndarray, ent: ToleranceEntry, c: "_OpConstants",
                        mag: Any, m: Any, K: float, coef: tuple[float, float, float, float], rows: bool,
                        rowlen: int | None, *, given: bool, op: str, invariants: Any) -> CheckResult | None:
    """The pass of :func:`_fast_operator` and its result (``invariants``: see
    :func:`tolstat.measure.noise.statistics_of_pass`)."""
    A, B, C, D = coef
    kq = c.kq
    td = c.td
    res = None
    bound = given and m is not None and magnitude_bound_applies(op)
    if c.lean:  # the common case: a finite pair, a magnitude that passes its tests
        checks = (2 if bound else 1) if given and m is not None else 0
        res = op_check_statistics(a, ef, m, coef=(A, B, C, D), rowlen=rowlen, dtype=td.name, kq=kq,
                                  magnitude_checks=checks)
    if res is None:
        res = op_statistics(a, ef, m, coef=(A, B, C, D), frac_k=PLAIN_SHAPE.frac_k, rowlen=rowlen, dtype=td.name,
                            kq=kq)
    if res.nonfinite >= 0:
        return None
    if given and m is not None:
        err = magnitude_error(op, ef, m, res.bad_magnitude, res.low_magnitude if bound else -1)
        if err is not None:
            raise err
    # every element the correctly rounded reference: for an output stored in the format,
    # exactly the ULP distance's rule; for another (a float32 or float64 output) the rule itself
    cr = (res.n_rounding_off == 0 if a.dtype == td.np_dtype
          else bool(np.max(ulp_distance(a, ef, td.name)) == 0.0))
    sums = res if invariants is None else PassWithInvariants(res.stats, res.bad, invariants)
    stats = statistics_of_pass(sums, a, ef, mag, dtype=ent.dtype, K=K, acc_dtype="float32", row_axis=-1, rows=rows,
                               op=ent.op)
    if cr:
        stats = rounded_statistics(stats)
    w = res.worst
    av = float(np.asarray(a.reshape(-1)[w : w + 1], dtype=np.float64)[0])
    ev = float(ef.reshape(-1)[w])
    r = abs(ev)
    mw = r if m is None else abs(float(m.reshape(-1)[w]))
    s_w = ((A * r) + (B * mw)) + D
    where = dict(worst_index=unravel(w, a.shape), worst_actual=av, worst_expected=ev, worst_error=abs(av - ev),
                 worst_allowed=float(kq * s_w), n_elements=int(ef.size), n_exceeding=res.n_exceeding, n_nonfinite=0,
                 correctly_rounded=cr)
    return _operator_result(None, a, e, ent, mag, K, where, stats=stats)


def assert_close(actual: Any, expected: Any, *, msg: str | None = None, **kwargs: Any) -> CheckResult:
    """Like :func:`check`, but raise ``AssertionError`` with an explanation on failure.

    The message names the op, dtype, statistic, threshold, the worst element's index
    and its actual/expected values, and how unlikely that error is for a correct kernel.

    Parameters
    ----------
    actual, expected : array_like
        As in :func:`check`.
    msg : str, optional
        Text put before the explanation.
    **kwargs
        The keyword arguments of :func:`check` (``op``, ``dtype`` and ``table`` required;
        ``inputs``, ``params``, ``hardware``, ``covariates``, ``options``): one
        definition of what a check takes, so the two never differ.

    Returns
    -------
    CheckResult
        When the check passes.

    Raises
    ------
    AssertionError
        The check failed.
    TypeError
        A keyword :func:`check` does not take (named), or a required one missing.
    """
    __tracebackhide__ = True  # pytest: show the caller's line and the message, not this frame
    unknown = sorted(set(kwargs) - _CHECK_KEYWORDS)
    if unknown:
        raise TypeError(f"assert_close got unexpected keyword argument(s) {unknown}; it takes msg= and the "
                        f"keywords of check: {sorted(_CHECK_KEYWORDS)}")
    missing = sorted(k for k in ("op", "dtype", "table") if k not in kwargs)
    if missing:
        raise TypeError(f"assert_close needs the keyword argument(s) {missing} (as check does)")
    r = check(actual, expected, **kwargs)
    if not r.passed:
        text = r.message()
        raise AssertionError(f"{msg}\n{text}" if msg else text)
    return r


#: the keyword arguments of :func:`check`, which :func:`assert_close` forwards
_CHECK_KEYWORDS = frozenset(name for name, p in inspect.signature(check).parameters.items()
                            if p.kind is inspect.Parameter.KEYWORD_ONLY)


def check_runs(errors: Any, table: ToleranceTable, *, hardware_policy: str | None = None) -> np.ndarray:
    """Pass/fail of every run of an error dataset, as :func:`check` decides it.

    The vectorised form of :func:`check` for many recorded runs (held-out or CI records):
    run ``i`` passes exactly when ``check(actual_i, expected_i, ...)`` of the pair it was
    recorded from passes (the same decision values, :mod:`tolstat.calibration.decision`; tested run
    by run). Each run's table group is looked up from its ``op``, ``dtype`` and
    ``hardware`` labels as :meth:`ToleranceTable.entry` does.

    Parameters
    ----------
    errors : xarray.Dataset
        Error dataset (``tolstat.from_pairs``, ``tolstat.collect``, ``tolstat.open_errors``).
        Operator-form groups need its operator statistics (collected with ``inputs``, or
        with a magnitude).
    table : ToleranceTable
    hardware_policy : {None, "exact", "pooled", "nearest", "error"}
        As in :func:`check`.

    Returns
    -------
    numpy.ndarray of bool
        True where the run passes.

    Raises
    ------
    KeyError
        A run has no table group.
    ValueError
        A group was refused at calibration, or the dataset lacks what its decision needs.
    """
    from tolstat.dataset.schema import validate

    if not isinstance(table, ToleranceTable):
        raise TypeError(f"table must be a ToleranceTable, got {type(table).__name__}")
    ds = validate(errors)
    groups = group_rows([np.asarray(ds[k].values).astype(str) for k in ("op", "dtype", "hardware")])
    passed = np.ones(ds.sizes["run"], dtype=bool)
    for (op, dt, hw), idx in zip(groups.keys(), groups.rows()):
        ent = cached_entry(table, str(op), str(dt), str(hw), hardware_policy=hardware_policy)
        sub = ds.isel(run=idx) if idx.size != ds.sizes["run"] else ds
        passed[idx] = ~entry_failed_runs(sub, ent)
    return passed
