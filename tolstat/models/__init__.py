"""Fitted models: the check statistics, the noise-scale forms and the estimators.

:mod:`~tolstat.models.statistics` defines every statistic a check can compare (one
registry), :mod:`~tolstat.models.scale` the noise-scale models of the named forms, and
:mod:`~tolstat.models.estimators` the numba quantile, order-statistic, tail and bootstrap
estimators applied over error datasets.
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("statistics", "scale", "estimators"))
