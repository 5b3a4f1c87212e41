"""The interface of a tolerance method compared by :mod:`tolstat.evaluate`."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import xarray as xr

from .metrics import ErrorMetrics

__all__ = ["Method"]


class Method:
    """A tolerance method: calibrate on correct runs, then flag checks.

    Subclasses set ``name``, ``family`` (``"static"``, ``"study"``, ``"tolstat"``) and
    ``budget`` (the promised false-positive rate per check, or None) and implement
    :meth:`calibrate` and :meth:`score`.
    """

    name: str = "method"
    family: str = "static"
    budget: float | None = None
    #: the evaluation passes ``magnitude=`` (the op on absolute inputs) to :meth:`score`
    wants_magnitude: bool = False

    def calibrate(self, cal: xr.Dataset) -> None:
        """Fit to the calibration error dataset (static methods ignore it)."""

    def score(self, m: ErrorMetrics, *, op: str, dtype: str, actual: np.ndarray,
              expected: np.ndarray, covariates: Mapping[str, float]) -> float:
        """Check statistic as a fraction of the threshold: the check fails when > 1."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line: the rule."""
        return self.name
