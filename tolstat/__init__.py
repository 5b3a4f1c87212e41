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

import sys as _sys
import types as _types
from typing import TYPE_CHECKING, Any

from ._version import __version__

# numba's cache locator for tolstat's kernels (tolstat._numba_cache) is installed by each
# module that defines @njit(cache=True) kernels, right before them: not here, so that
# ``import tolstat`` does not import numba.

#: public name -> submodule defining it. ``import tolstat`` imports none of them (numba,
#: xarray, scipy and statsmodels stay unloaded until a name is first used, PEP 562); the
#: first access of a name imports its module once and caches the name here.
_LAZY: dict[str, str] = {
    "SUPPORTED_DTYPES": "_dtypes", "canonical_dtype": "_dtypes",
    "Hardware": "_runs",
    "Inputs": "collect", "collect": "collect", "from_pairs": "collect", "hardware_fingerprint": "collect",
    "concat": "dataset", "indexed": "dataset", "validate": "dataset",
    "fit": "estimators",
    "open_errors": "io", "save": "io",
    "merge_records": "merge",
    "ErrorMetrics": "metrics", "error_metrics": "metrics", "ulp_distance": "metrics",
    "RunScores": "statistics", "Statistic": "statistics",
    "ScaleModel": "scale", "ScaleOptions": "scale",
    "Calibration": "bounds", "Exceedance": "bounds", "NotEnoughData": "bounds", "TailOptions": "bounds",
    "split_budget": "bounds",
    "StatEntry": "table", "ToleranceEntry": "table", "ToleranceTable": "table", "load_table": "table",
    "calibrate": "selection", "select": "selection",
    "CheckResult": "checks", "assert_close": "checks", "check": "checks", "check_runs": "checks",
    "StoreProgress": "stream", "collect_to_store": "stream", "open_store": "stream",
    "group_topk": "estimators.tail",
    "ShiftResult": "hwshift", "shift": "hwshift",
    "CompareResult": "comparison", "compare": "comparison",
}
#: submodules exposed as attributes (``tolstat.stream``, ...), imported on first access
_SUBMODULES = ("noise", "statistics", "stream", "tail")

if TYPE_CHECKING:  # static analysers see the eager imports
    from . import noise, statistics, stream, tail
    from .comparison import CompareResult, compare
    from .hwshift import ShiftResult, shift
    from ._dtypes import SUPPORTED_DTYPES, canonical_dtype
    from ._runs import Hardware
    from .bounds import Calibration, Exceedance, NotEnoughData, TailOptions, split_budget
    from .checks import CheckResult, assert_close, check, check_runs
    from .collect import Inputs, collect, from_pairs, hardware_fingerprint
    from .dataset import concat, indexed, validate
    from .estimators import fit
    from .estimators.tail import group_topk
    from .io import open_errors, save
    from .merge import merge_records
    from .metrics import ErrorMetrics, error_metrics, ulp_distance
    from .scale import ScaleModel, ScaleOptions
    from .selection import calibrate, select
    from .statistics import RunScores, Statistic
    from .stream import StoreProgress, collect_to_store, open_store
    from .table import StatEntry, ToleranceEntry, ToleranceTable, load_table


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


class _Package(_types.ModuleType):
    """The package module: loading the submodule ``tolstat.collect`` must not replace the
    public function ``tolstat.collect`` (the import system sets the submodule as an
    attribute; the eager imports used to overwrite it right after)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if _LAZY.get(name) == name and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


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
    "check_runs",
    "assert_close",
    "CheckResult",
    "shift",
    "ShiftResult",
    "compare",
    "CompareResult",
]
