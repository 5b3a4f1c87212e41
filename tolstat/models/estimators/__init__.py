"""Estimators: turn per-group error samples into tolerances.

One module per family, each a set of numba kernels on plain numpy arrays
(groups x obs, NaN padded):

* :mod:`.quantile` — exact quantiles / top-k by selection (numpy parity);
* :mod:`.orderstat` — distribution-free order-statistic and split-conformal bounds;
* :mod:`.evt` — peaks over threshold (GPD) and block maxima (GEV);
* :mod:`.bootstrap` — percentile / BCa upper bounds of a quantile or return level;
* :mod:`.tail` — exact, mergeable group top-k of large (dask-backed) error tables;

and :func:`fit`, which applies them per (op, dtype, hardware) group of an error dataset.
"""

from tolstat.models.estimators._apply import FIT_STATISTICS, METHODS, fit, group_values
from tolstat.models.estimators.bootstrap import (
    BootstrapResult,
    bootstrap_quantile_bound,
    bootstrap_quantile_distribution,
    bootstrap_return_level_bound,
    jackknife_quantile,
)
from tolstat.models.estimators.evt import (
    GPDFit,
    gev_fit_groups,
    gev_fit_mle,
    gev_loglik,
    gev_return_level,
    gpd_fit_mle,
    gpd_fit_pwm,
    gpd_fit_zhang_stephens,
    gpd_loglik,
    gpd_return_level,
    pot_fit,
    pot_fit_groups,
)
from tolstat.models.estimators.orderstat import (
    conformal_bound,
    conformal_min_n,
    conformal_rank,
    order_statistic_bound,
    order_statistic_min_n,
    order_statistic_rank,
)
from tolstat.models.estimators.quantile import kth_smallest_groups, quantile, quantile_groups, topk, topk_groups
from tolstat.models.estimators.tail import group_topk, topk_order_statistic_bound, topk_order_statistic_rank, upper_quantile

__all__ = [
    "fit",
    "group_values",
    "METHODS",
    "FIT_STATISTICS",
    "quantile",
    "quantile_groups",
    "kth_smallest_groups",
    "topk",
    "topk_groups",
    "order_statistic_rank",
    "order_statistic_min_n",
    "order_statistic_bound",
    "conformal_rank",
    "conformal_min_n",
    "conformal_bound",
    "GPDFit",
    "gpd_loglik",
    "gpd_fit_mle",
    "gpd_fit_zhang_stephens",
    "gpd_fit_pwm",
    "gpd_return_level",
    "pot_fit",
    "pot_fit_groups",
    "gev_loglik",
    "gev_fit_mle",
    "gev_fit_groups",
    "gev_return_level",
    "BootstrapResult",
    "bootstrap_quantile_bound",
    "bootstrap_quantile_distribution",
    "bootstrap_return_level_bound",
    "jackknife_quantile",
    "group_topk",
    "upper_quantile",
    "topk_order_statistic_rank",
    "topk_order_statistic_bound",
]
