"""tolstat: turn measured numerical error into trustworthy test tolerances.

Data flow (one module per step, each importing only the steps before it)::

    kernel outputs -> metrics -> error dataset -> fitted models -> tolerance table -> checks
                     (metrics)   (errors, collect,    (estimators,  (selection)       (checks,
                                  io, stream, tail)    scale)                          pytest_plugin)
"""

from . import _numba_cache

_numba_cache.install()  # before any @njit(cache=True) kernel is defined: cache outside the package

from ._dtypes import SUPPORTED_DTYPES, canonical_dtype
from ._version import __version__
from .collect import Inputs, collect, from_pairs, hardware_fingerprint
from .errors import concat, indexed, validate
from .estimators import fit
from .io import open_errors, save
from .metrics import ErrorMetrics, error_metrics, ulp_distance
from .scale import ScaleModel
from .selection import ToleranceTable, calibrate, load_table, select, split_budget
from .checks import CheckResult, assert_close, check
from . import stream, tail
from .stream import collect_to_store, open_store
from .tail import group_topk

__all__ = [
    "__version__",
    "SUPPORTED_DTYPES",
    "canonical_dtype",
    "ErrorMetrics",
    "error_metrics",
    "ulp_distance",
    "Inputs",
    "collect",
    "from_pairs",
    "hardware_fingerprint",
    "validate",
    "concat",
    "indexed",
    "save",
    "open_errors",
    "stream",
    "tail",
    "collect_to_store",
    "open_store",
    "group_topk",
    "fit",
    "ScaleModel",
    "select",
    "calibrate",
    "split_budget",
    "ToleranceTable",
    "load_table",
    "check",
    "assert_close",
    "CheckResult",
]
