"""Settings of :func:`tolstat.select` beyond the data, the budget, the form and the grouping.

:class:`SelectOptions` holds them (the threshold method, the budget split between
statistics, pooling, the noise-scale and tail-model settings, the seed) and validates them
once, when it is built; :func:`~tolstat.calibration.selection.select` takes one as
``options=``. The settings of the certified engine itself are
:class:`tolstat.calibration.engine.CertifyOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import numpy as np


from tolstat.calibration.bounds import TailOptions
from tolstat.models.scale import ScaleOptions

__all__ = ["SELECT_METHODS", "SelectOptions"]

#: threshold methods :func:`tolstat.select` and :func:`tolstat.calibration.selection.calibrate` accept
SELECT_METHODS = ("auto", "order_statistic", "conformal", "evt")


@dataclass(frozen=True)
class SelectOptions:
    """Settings of select beyond the data, the budget, the form and the grouping.

    Attributes
    ----------
    method : {"auto", "order_statistic", "conformal", "evt"}, default "auto"
        ``auto``/``order_statistic``: the certified engine (see ``form`` of
        :func:`~tolstat.calibration.selection.select`): the order statistic of the group's
        own units, else of an exchangeable pool, else :class:`~tolstat.NotEnoughData`
        (never a tail model). ``conformal`` and ``evt`` (a model-based tail, no
        finite-sample promise): per statistic, see
        :func:`~tolstat.calibration.selection.calibrate`.
    budget_split : {"bonferroni", "sidak"}, default "bonferroni"
        How the budget is split between statistics (``statistic`` with ``"bias"``;
        :func:`~tolstat._base.inference.split_budget`).
    pooling : bool, default True
        Let groups with too few units borrow the scores of groups whose scores are
        exchangeable with theirs (tested; ``docs/guarantees.md``).
    scale : ScaleOptions, default ScaleOptions()
        Settings of the noise-scale fit (quantile, covariates of the ``size_aware``,
        ``normalised`` and ``baseline`` forms, solver); only used with a scale ``form``.
    tail : TailOptions, default TailOptions()
        Settings of the tail model (:func:`~tolstat.calibration.selection.calibrate`).
    accept_outliers : bool, default False
        Accept calibration runs far beyond the rest as correct runs: no
        :class:`~tolstat.calibration.certificate.OutlierRunWarning` when one sets a
        group's threshold (``CertifyOptions.accept_outliers``).
    seed : int, default 0
        Seed of the scale fit's subsample, of the engine's fitting split and of the
        parametric bootstrap.

    Raises
    ------
    ValueError
        An unknown ``method``.
    TypeError
        ``scale`` is not a :class:`~tolstat.models.ScaleOptions` or ``tail`` not a
        :class:`~tolstat.calibration.TailOptions`.

    Examples
    --------
    >>> SelectOptions(method="evt", seed=3).method
    'evt'
    >>> SelectOptions(method="max")
    Traceback (most recent call last):
    ...
    ValueError: SelectOptions.method must be one of ('auto', 'order_statistic', 'conformal', 'evt'), got 'max'
    """

    method: str = "auto"
    budget_split: str = "bonferroni"
    pooling: bool = True
    scale: ScaleOptions = field(default_factory=ScaleOptions)
    tail: TailOptions = field(default_factory=TailOptions)
    seed: int = 0
    accept_outliers: bool = False

    def __post_init__(self) -> None:
        if self.method not in SELECT_METHODS:
            raise ValueError(f"SelectOptions.method must be one of {SELECT_METHODS}, got {self.method!r}")
        if self.budget_split not in ("bonferroni", "sidak"):
            raise ValueError(f"SelectOptions.budget_split must be 'bonferroni' or 'sidak', got {self.budget_split!r}")
        if not isinstance(self.accept_outliers, (bool, np.bool_)):
            raise TypeError(f"SelectOptions.accept_outliers must be True or False, got {self.accept_outliers!r}")
        if not isinstance(self.pooling, (bool, np.bool_)):
            raise TypeError(f"SelectOptions.pooling must be True or False, got {self.pooling!r}")
        if isinstance(self.seed, (bool, np.bool_)) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"SelectOptions.seed must be an integer >= 0, got {self.seed!r}")
        if not isinstance(self.scale, ScaleOptions):
            raise TypeError(f"SelectOptions.scale must be a ScaleOptions, got {type(self.scale).__name__}")
        if not isinstance(self.tail, TailOptions):
            raise TypeError(f"SelectOptions.tail must be a TailOptions, got {type(self.tail).__name__}")
