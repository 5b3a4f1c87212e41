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
    assert _loaded_after("import tolstat.pytest_plugin") == []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    prog = "import sys, pytest, tolstat.pytest_plugin\nprint('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"  # not even numpy: pytest start-up pays nothing for it


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


def test_submodule_import_keeps_the_public_function():
    import tolstat.collect  # noqa: F401  (the submodule shares the function's name)

    assert callable(tolstat.collect) and tolstat.collect.__name__ == "collect"
    from tolstat import collect

    assert collect is tolstat.collect


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        tolstat.nope  # noqa: B018


def test_every_cached_kernel_uses_tolstats_cache_locator():
    """The cache locator is installed by each kernel module (not by ``import tolstat``,
    which must not import numba): every cached kernel of the package is located by it."""
    code = (
        "import importlib, json, numba\n"
        "mods = ['tolstat.metrics', 'tolstat.dataset', 'tolstat._fused', 'tolstat.estimators.quantile',\n"
        "        'tolstat.estimators.evt', 'tolstat.estimators.bootstrap', 'tolstat.estimators._apply']\n"
        "out = {}\n"
        "for name in mods:\n"
        "    mod = importlib.import_module(name)\n"
        "    for k, v in vars(mod).items():\n"
        "        impl = getattr(getattr(v, '_cache', None), '_impl', None)\n"
        "        if isinstance(v, numba.core.registry.CPUDispatcher) and impl is not None and v.__module__ == name:\n"
        "            out[name + '.' + k] = type(impl.locator).__name__\n"
        "print(json.dumps(out))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("NUMBA_CACHE_DIR", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    found = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(found) >= 20 and any(k.startswith("tolstat._fused.") for k in found)
    assert set(found.values()) == {"TolstatCacheLocator"}, found
