"""tolstat: turn measured numerical error into trustworthy test tolerances.

One package per step of the data flow, each importing only earlier ones
(``tests/test_architecture.py`` enforces it; ``docs/architecture.md`` describes it)::

    kernel outputs -> measure -> dataset -> models -> calibration -> checks -> assess -> cli
                      (metrics,  (schema,   (statistics, (decision,   (check,   (compare,
                       noise)     collect,   scale,       engine,      plugin)   shift,
                                  stream,    estimators)  select,                evaluate)
                                  io)                     table)

``tolstat._base`` (dtypes, validation, inference primitives, atomic writes) lies under all
of them; ``tolstat.corpus`` (the embedded kernels with known bugs) imports only the base and
``measure``. The names below are the front door; everything else is reachable from its
package (``tolstat.dataset.run_units``, ``tolstat.calibration.engine.certify``, ...).
"""

from typing import TYPE_CHECKING, Any

from tolstat._version import __version__

# numba's cache locator for tolstat's kernels (tolstat._base.numba_cache) is installed by each
# module that defines @njit(cache=True) kernels, right before them: not here, so that
# ``import tolstat`` does not import numba.

#: public name -> submodule defining it. ``import tolstat`` imports none of them (numba,
#: xarray, scipy and statsmodels stay unloaded until a name is first used, PEP 562); the
#: first access of a name imports its module once and caches the name here.
_LAZY: dict[str, str] = {
    "SUPPORTED_DTYPES": "_base.dtypes", "canonical_dtype": "_base.dtypes",
    "Hardware": "dataset.runs",
    "Inputs": "dataset.collection", "collect": "dataset.collection", "from_pairs": "dataset.collection", "hardware_fingerprint": "dataset.collection",
    "concat": "dataset.schema", "indexed": "dataset.schema", "validate": "dataset.schema",
    "fit": "models.estimators",
    "open_errors": "dataset.io", "save": "dataset.io",
    "merge_records": "dataset.merge",
    "ErrorMetrics": "measure.metrics", "error_metrics": "measure.metrics", "ulp_distance": "measure.metrics",
    "RunScores": "models.statistics", "Statistic": "models.statistics",
    "ScaleModel": "models.scale", "ScaleOptions": "models.scale",
    "Calibration": "calibration.bounds", "Exceedance": "calibration.bounds", "NotEnoughData": "calibration.bounds", "TailOptions": "calibration.bounds",
    "split_budget": "calibration.bounds",
    "StatEntry": "calibration.table", "ToleranceEntry": "calibration.table", "ToleranceTable": "calibration.table", "load_table": "calibration.table",
    "calibrate": "calibration.selection", "select": "calibration.selection",
    "CheckResult": "checks.checking", "assert_close": "checks.checking", "check": "checks.checking", "check_runs": "checks.checking",
    "StoreProgress": "dataset.stream", "collect_to_store": "dataset.stream", "open_store": "dataset.stream",
    "group_topk": "models.estimators.tail",
    "ShiftResult": "assess.hwshift", "shift": "assess.hwshift",
    "CompareResult": "assess.comparison", "compare": "assess.comparison",
}
#: the packages of the flow, exposed as attributes (``tolstat.dataset``, ...) and imported on first access
_SUBMODULES = ("measure", "dataset", "models", "calibration", "checks", "assess", "corpus")

if TYPE_CHECKING:  # static analysers see the eager imports
    from tolstat import assess, calibration, checks, corpus, dataset, measure, models
    from tolstat._base.dtypes import SUPPORTED_DTYPES, canonical_dtype
    from tolstat.assess.comparison import CompareResult, compare
    from tolstat.assess.hwshift import ShiftResult, shift
    from tolstat.calibration.bounds import Calibration, Exceedance, NotEnoughData, TailOptions, split_budget
    from tolstat.calibration.selection import calibrate, select
    from tolstat.calibration.table import StatEntry, ToleranceEntry, ToleranceTable, load_table
    from tolstat.checks.checking import CheckResult, assert_close, check, check_runs
    from tolstat.dataset.collection import Inputs, collect, from_pairs, hardware_fingerprint
    from tolstat.dataset.io import open_errors, save
    from tolstat.dataset.merge import merge_records
    from tolstat.dataset.runs import Hardware
    from tolstat.dataset.schema import concat, indexed, validate
    from tolstat.dataset.stream import StoreProgress, collect_to_store, open_store
    from tolstat.measure.metrics import ErrorMetrics, error_metrics, ulp_distance
    from tolstat.models.estimators import fit
    from tolstat.models.estimators.tail import group_topk
    from tolstat.models.scale import ScaleModel, ScaleOptions
    from tolstat.models.statistics import RunScores, Statistic


def __getattr__(name: str) -> Any:
    """Import the submodule behind a public name on first use (PEP 562)."""
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "check_runs",
    "assert_close",
    "CheckResult",
    "shift",
    "ShiftResult",
    "compare",
    "CompareResult",
]
