"""tolstat's own methods for :mod:`tolstat.evaluate`: select on calibration data, then check."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import xarray as xr

from ._method import Method
from .checks import check_metrics
from .metrics import ErrorMetrics
from .selection import select
from .table import ToleranceTable

__all__ = ["TolstatMethod", "tolstat_methods"]


class TolstatMethod(Method):
    """``tolstat.select`` on the calibration runs, one group per (op, dtype).

    Parameters
    ----------
    name : str
        Label in the report.
    fp_budget, confidence : float
        The promise: a correct run fails a check with probability <= ``fp_budget``,
        with ``confidence``.
    per_kernel : bool, default False
        One group per (op, dtype, correct variant): the threshold of the kernel under
        test (its own correct runs), checked against the variant the test pairs it
        with (a bug's base variant). Default: one group per (op, dtype) shared by every
        correct implementation.
    options
        Passed to :func:`tolstat.select` (``form=``, ``statistic=``...).
    """

    family = "tolstat"
    wants_magnitude = True

    def __init__(self, name: str, fp_budget: float, confidence: float, *, per_kernel: bool = False,
                 **options: Any):
        self.name = name
        self.per_kernel = per_kernel
        self.budget = fp_budget
        self.confidence = confidence
        self.options = options
        self.table: ToleranceTable | None = None

    def calibrate(self, cal: xr.Dataset) -> None:  # noqa: D102
        opts = dict(self.options)
        if opts.get("form", "auto") in ("auto", "operator") and "case" in cal:
            opts.setdefault("cluster", "case")  # the same inputs through several variants: one unit
        if self.per_kernel:
            cal = cal.assign(op=("run", np.char.add(np.char.add(cal["op"].values.astype(str), ":"),
                                                    cal["variant"].values.astype(str))))
        self.table = select(cal, fp_budget=self.budget, confidence=self.confidence, by=("op", "dtype"), **opts)

    def score(self, m: ErrorMetrics, *, op: str, dtype: str, actual: np.ndarray,
              expected: np.ndarray, covariates: Mapping[str, float], magnitude: Any = None,
              variant: str = "") -> float:  # noqa: D102
        assert self.table is not None, "calibrate first"
        ent = self.table.entry(f"{op}:{variant}" if self.per_kernel else op, dtype, None)
        res = check_metrics(m, actual, expected, ent, covariates, magnitude=magnitude)
        return max(res.ratios.values()) if res.ratios else 0.0

    def threshold_for(self, op: str, dtype: str) -> float | None:
        """The max_abs threshold of a group (None for normalised forms)."""
        if self.table is None or self.options.get("form", "auto") is not None:
            return None
        ent = self.table.entry(op, dtype, None)
        st = ent.statistics.get("max_abs")
        return None if st is None else float(st.threshold)

    def describe(self) -> str:  # noqa: D102
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return (f"tolstat.select(fp_budget={self.budget:g}, confidence={self.confidence:g}"
                f"{', ' + opts if opts else ''}) per (op, dtype)")


def tolstat_methods(fp_budget: float, confidence: float) -> list[Method]:
    """The tolstat methods compared in ``tolstat evaluate``."""
    return [
        TolstatMethod("tolstat default", fp_budget, confidence),
        TolstatMethod("tolstat default per-kernel", fp_budget, confidence, per_kernel=True),
        TolstatMethod("tolstat max_abs", fp_budget, confidence, form=None),
        TolstatMethod("tolstat allclose", fp_budget, confidence, form="allclose"),
        TolstatMethod("tolstat size-aware", fp_budget, confidence, form="size_aware"),
        TolstatMethod("tolstat size-aware+bias", fp_budget, confidence, form="size_aware",
                      statistic=("max_abs", "bias")),
    ]


