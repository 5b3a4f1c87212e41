"""Backward-compatible alias of :mod:`tolstat.estimators.tail` (group top-k)."""

from .estimators.tail import (  # noqa: F401
    group_topk,
    topk_order_statistic_bound,
    topk_order_statistic_rank,
    upper_quantile,
)

__all__ = ["group_topk", "upper_quantile", "topk_order_statistic_rank", "topk_order_statistic_bound"]
