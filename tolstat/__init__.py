"""tolstat: turn measured numerical error into trustworthy test tolerances.

Data flow (one layer per step, each module importing only modules of its own or
earlier layers; ``tests/test_architecture.py`` enforces it, ``docs/architecture.md``
describes it)::

    kernel outputs -> metrics -> error dataset -> fitted models -> tolerance table -> checks -> evaluate -> cli
                     (metrics)   (dataset, io,    (estimators,    (bounds, table,    (checks,   (evaluate,
                                  collect,         scale)          selection)         pytest_   corpus,
                                  stream,                                             plugin)   plots)
                                  statistics)
"""

from . import _numba_cache

_numba_cache.install()  # before any @njit(cache=True) kernel is defined: cache outside the package

from ._dtypes import SUPPORTED_DTYPES, canonical_dtype
from ._version import __version__
from ._runs import Hardware
from .collect import Inputs, collect, from_pairs, hardware_fingerprint
from .dataset import concat, indexed, validate
from .estimators import fit
from .io import open_errors, save
from .merge import merge_records
from .metrics import ErrorMetrics, error_metrics, ulp_distance
from .statistics import RunScores, Statistic
from .scale import ScaleModel, ScaleOptions
from .bounds import Calibration, Exceedance, NotEnoughData, TailOptions, split_budget
from .table import StatEntry, ToleranceEntry, ToleranceTable, load_table
from .selection import calibrate, select
from .checks import CheckResult, assert_close, check
from .hwshift import ShiftResult, shift
from .comparison import CompareResult, compare
from . import noise, statistics, stream, tail
from .stream import StoreProgress, collect_to_store, open_store
from .estimators.tail import group_topk

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
    "Hardware",
    "validate",
    "concat",
    "merge_records",
    "indexed",
    "save",
    "open_errors",
    "noise",
    "stream",
    "tail",
    "statistics",
    "collect_to_store",
    "open_store",
    "StoreProgress",
    "group_topk",
    "fit",
    "Statistic",
    "RunScores",
    "ScaleModel",
    "ScaleOptions",
    "TailOptions",
    "NotEnoughData",
    "select",
    "calibrate",
    "Calibration",
    "Exceedance",
    "split_budget",
    "ToleranceTable",
    "ToleranceEntry",
    "StatEntry",
    "load_table",
    "check",
    "assert_close",
    "CheckResult",
    "shift",
    "ShiftResult",
    "compare",
    "CompareResult",
]
