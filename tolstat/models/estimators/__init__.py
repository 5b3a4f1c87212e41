"""Estimators: turn per-group error samples into tolerances.

One module per family, each a set of numba kernels on plain numpy arrays
(groups x obs, NaN padded):

* :mod:`.quantiles` — exact quantiles / top-k by selection (numpy parity);
* :mod:`.orderstat` — distribution-free order-statistic and split-conformal bounds;
* :mod:`.evt` — peaks over threshold (GPD) and block maxima (GEV);
* :mod:`.bootstrap` — percentile / BCa upper bounds of a quantile or return level;
* :mod:`.tail` — exact, mergeable group top-k of large (dask-backed) error tables;

and :func:`fit`, which applies them per (op, dtype, hardware) group of an error dataset.
Each name is listed once, in its module's ``__all__``; the package resolves it on first use.
"""


from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("_apply", "quantiles", "orderstat", "evt", "bootstrap", "tail"))
