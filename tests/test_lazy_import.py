"""``import tolstat`` and the pytest plugin load no heavy dependency (behaviour, not timing)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tolstat

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numba", "xarray", "scipy.stats", "statsmodels", "dask", "matplotlib", "zarr")


def _loaded_after(code: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    prog = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_tolstat_loads_no_heavy_module():
    assert _loaded_after("import tolstat; tolstat.__version__") == []


def test_pytest_plugin_module_loads_no_heavy_module():
    assert _loaded_after("import tolstat.checks.pytest_plugin") == []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    prog = "import sys, pytest, tolstat.checks.pytest_plugin\nprint('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"  # not even numpy: pytest start-up pays nothing for it


@pytest.mark.slow
def test_a_public_name_loads_its_module_on_first_use():
    loaded = _loaded_after("import tolstat; tolstat.ToleranceTable")
    assert "xarray" in loaded  # the table's netCDF IO: the lazy path really imports it


@pytest.mark.parametrize("name", tolstat.__all__)
def test_every_public_name_resolves_to_its_definition(name):
    value = getattr(tolstat, name)
    if name in tolstat._SUBMODULES:
        assert value is importlib.import_module(f"tolstat.{name}")
    elif name != "__version__":
        mod = importlib.import_module(f"tolstat.{tolstat._LAZY[name]}")
        assert value is getattr(mod, name)


def test_no_module_or_package_shares_a_public_name():
    """``tolstat.collect`` is the function: no submodule of that name can replace it on import."""
    pkg = ROOT / "tolstat"
    shadowed = [n for n in tolstat.__all__ if n not in tolstat._SUBMODULES
                and ((pkg / f"{n}.py").exists() or (pkg / n / "__init__.py").exists())]
    assert shadowed == []


@pytest.mark.parametrize("package", tolstat._SUBMODULES)
def test_a_package_of_the_flow_loads_no_module_until_a_name_is_used(package):
    assert _loaded_after(f"import tolstat.{package}") == []


def test_a_package_resolves_a_name_to_its_defining_module():
    import tolstat.dataset
    import tolstat.dataset.schema

    assert tolstat.dataset.run_units is tolstat.dataset.schema.run_units
    assert "run_units" in tolstat.dataset.__all__ and "run_units" in dir(tolstat.dataset)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        tolstat.dataset.nope  # noqa: B018


@pytest.mark.parametrize("package", ["measure", "dataset", "models", "models.estimators", "calibration", "checks",
                                     "assess", "corpus"])
def test_a_package_lists_only_its_own_modules_and_their_names(package):
    """A module listed in a package's __all__ is that package's own (a subpackage's modules
    stay the subpackage's: ``tolstat.models.bootstrap`` is not a name)."""
    import inspect

    pkg = importlib.import_module(f"tolstat.{package}")
    for name in pkg.__all__:
        obj = getattr(pkg, name)
        if inspect.ismodule(obj):
            assert obj.__name__ == f"{pkg.__name__}.{name}", (name, obj.__name__)
