"""Option object of :func:`tolstat.check` and :func:`tolstat.assert_close`.

:class:`CheckOptions` holds the settings of a check beyond the pair, the table group and
the op's own arguments (``inputs=``/``params=``): the expert override of the operator
magnitude, the NaN rule, the hardware policy and what an uncalibrated group does. It validates them once, when it is made.
Checks layer: imports only the base and :mod:`tolstat.calibration.hwpolicy`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tolstat.calibration.hwpolicy import HARDWARE_POLICIES
from tolstat._base.validate import option_object, short_repr as _short

__all__ = ["CheckOptions", "UNCALIBRATED"]

#: what a check of a group the table does not have does (:attr:`CheckOptions.uncalibrated`)
UNCALIBRATED = ("raise", "model")


@dataclass(frozen=True, eq=False)
class CheckOptions:
    """Settings of a check beyond the pair, the table group and the op's arguments.

    Passed as ``options=`` to :func:`tolstat.check` and :func:`tolstat.assert_close`; the
    default (``None``) is ``CheckOptions()``. Compared by identity (a magnitude array has
    no single truth value).

    Attributes
    ----------
    magnitude : array_like or "ref", optional
        Expert override of the operator magnitude: the op applied to the absolute inputs
        (``|A| @ |B|`` for a matrix product; ``docs/noise.md``), same shape as
        ``expected``, for a group calibrated with the operator form (``op_score``);
        ``"ref"`` when the table was calibrated with ``CollectOptions(magnitude="ref")``.
        Prefer ``check(..., inputs=..., params=...)``, which derives it (and ``K``) from
        :mod:`tolstat.ops`, or register your op there (:func:`tolstat.ops.register`).
        Giving both ``magnitude`` and ``inputs=`` is an error.
    allow_nan : bool, default False
        Accept NaN in the reference (see :func:`tolstat.error_metrics`).
    hardware_policy : {None, "exact", "pooled", "nearest", "error"}
        What a check on hardware the table was not calibrated on does
        (:meth:`tolstat.ToleranceTable.entry`, :mod:`tolstat.calibration.hwpolicy`).
    uncalibrated : {"raise", "model"}, default "raise"
        What a check of a group the table does not have does (no group matches, even
        with the fallbacks; or ``table=None``). ``"raise"``: ``KeyError``. ``"model"``:
        the output is decided by the **zero-run threshold** of :func:`tolstat.ops.tolerance`
        at the table's ``fp_budget`` (0.01 without a table) with ``stores=1``, from the
        op's ``inputs=`` (an op :mod:`tolstat.ops` knows); the result is labelled
        model-based (:data:`tolstat.ops.MODEL_LABEL`), never certified, and calibrating
        the group replaces it. A group the table has but refused still raises.

    Raises
    ------
    TypeError, ValueError
        A field of the wrong type or value (the message names the field and the value).
    """

    magnitude: Any = None
    allow_nan: bool = False
    hardware_policy: str | None = None
    uncalibrated: str = "raise"

    def __post_init__(self) -> None:
        mag = self.magnitude
        if isinstance(mag, str):
            if mag != "ref":
                raise ValueError(f"CheckOptions.magnitude must be an array or 'ref', got {_short(mag)}")
        elif mag is not None and (isinstance(mag, (bool, np.bool_, Mapping, bytes)) or callable(mag)):
            raise TypeError(f"CheckOptions.magnitude must be an array (the op on the absolute inputs), 'ref' or "
                            f"None, got {_short(mag)} ({type(mag).__name__})")
        if not isinstance(self.allow_nan, (bool, np.bool_)):
            raise TypeError(f"CheckOptions.allow_nan must be True or False, got {_short(self.allow_nan)} "
                            f"({type(self.allow_nan).__name__})")
        pol = self.hardware_policy
        if pol is not None and pol not in HARDWARE_POLICIES:
            raise ValueError(f"CheckOptions.hardware_policy must be None or one of {HARDWARE_POLICIES}, got "
                             f"{_short(pol)}")
        if not (isinstance(self.uncalibrated, str) and self.uncalibrated in UNCALIBRATED):
            raise ValueError(f"CheckOptions.uncalibrated must be one of {UNCALIBRATED}, got {_short(self.uncalibrated)}")


def check_options(options: Any) -> CheckOptions:
    """``options`` checked to be a :class:`CheckOptions` (``None``: the defaults)."""
    return option_object(options, CheckOptions)
