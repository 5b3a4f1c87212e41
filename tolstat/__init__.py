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
    "error_metrics": "measure.metrics",
    "Inputs": "dataset.runs", "collect": "dataset.collection", "from_pairs": "dataset.collection",
    "CollectOptions": "dataset.options",
    "open_errors": "dataset.io", "save": "dataset.io", "concat": "dataset.schema",
    "fit": "models.estimators",
    "select": "calibration.selection", "SelectOptions": "calibration.options", "certify": "calibration.engine",
    "NotEnoughData": "_base.util",
    "ToleranceTable": "calibration.table", "load_table": "calibration.table",
    "CheckResult": "checks.result", "assert_close": "checks.checking", "check": "checks.checking",
    "check_runs": "checks.checking", "CheckOptions": "checks.options",
    "CompareResult": "assess.comparison", "compare": "assess.comparison",
    "ShiftResult": "assess.hwshift", "shift": "assess.hwshift",
}
#: the packages of the flow, exposed as attributes (``tolstat.dataset``, ...) and imported on first access
_SUBMODULES = ("measure", "ops", "dataset", "models", "calibration", "checks", "assess", "corpus")

if TYPE_CHECKING:  # static analysers see the eager imports
    from tolstat import assess, calibration, checks, corpus, dataset, measure, models, ops
    from tolstat.assess.comparison import CompareResult, compare
    from tolstat.assess.hwshift import ShiftResult, shift
    from tolstat._base.util import NotEnoughData
    from tolstat.calibration.engine import certify
    from tolstat.calibration.options import SelectOptions
    from tolstat.calibration.selection import select
    from tolstat.calibration.table import ToleranceTable, load_table
    from tolstat.checks.checking import assert_close, check, check_runs
    from tolstat.checks.options import CheckOptions
    from tolstat.checks.result import CheckResult
    from tolstat.dataset.collection import collect, from_pairs
    from tolstat.dataset.runs import Inputs
    from tolstat.dataset.io import open_errors, save
    from tolstat.dataset.schema import concat
    from tolstat.dataset.options import CollectOptions
    from tolstat.measure.metrics import error_metrics
    from tolstat.models.estimators import fit


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


#: the front door: what a test author (collect, select, check) and an estimator researcher
#: (fit, certify, compare, shift) call; everything else is reachable from its package
__all__ = [
    "__version__",
    # collect correct runs into an error dataset
    "from_pairs", "collect", "Inputs", "CollectOptions", "save", "open_errors", "concat", "error_metrics",
    # calibrate a tolerance table
    "select", "SelectOptions", "certify", "fit", "NotEnoughData", "ToleranceTable", "load_table",
    # check outputs against it
    "check", "check_runs", "assert_close", "CheckOptions", "CheckResult",
    # assess tolerance rules
    "compare", "CompareResult", "shift", "ShiftResult",
]
