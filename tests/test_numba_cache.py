"""tolstat's numba kernels cache outside the installed package (issue: an empty
``site-packages/tolstat`` left by pip's uninstall shadowed an editable install)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tolstat
from tolstat._base import numba_cache as _numba_cache
from tolstat.models.estimators import evt
from tolstat.measure.metrics import _ulp_kernel

ROOT = Path(__file__).resolve().parents[1]


def _locator(dispatcher):
    return dispatcher._cache._impl.locator


def test_package_kernels_cache_outside_the_package():
    for fn in (_ulp_kernel, evt._gpd_mle_core):
        loc = _locator(fn)
        assert type(loc).__name__ == "TolstatCacheLocator"
        path = Path(loc.get_cache_path()).resolve()
        assert not path.is_relative_to(_numba_cache.PACKAGE_DIR), path


def test_other_numba_functions_keep_numbas_locators(tmp_path):
    import numba

    mod = tmp_path / "usermod.py"
    mod.write_text("import numba\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import usermod
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("usermod", None)
    assert isinstance(usermod.f, numba.core.registry.CPUDispatcher)
    assert type(_locator(usermod.f)).__name__ != "TolstatCacheLocator"


def test_cache_root_prefers_env_and_skips_unwritable(tmp_path, monkeypatch):
    monkeypatch.setenv("TOLSTAT_CACHE_DIR", str(tmp_path / "c"))
    assert _numba_cache.cache_root() == tmp_path / "c" / "numba"
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TOLSTAT_CACHE_DIR", str(blocker))  # cannot mkdir below a file
    root = _numba_cache.cache_root()
    assert root is not None and root != blocker / "numba"
    assert not root.resolve().is_relative_to(_numba_cache.PACKAGE_DIR)


def test_cache_root_never_inside_the_package(monkeypatch):
    monkeypatch.setenv("TOLSTAT_CACHE_DIR", str(_numba_cache.PACKAGE_DIR))
    root = _numba_cache.cache_root()
    assert root is None or not root.resolve().is_relative_to(_numba_cache.PACKAGE_DIR)


def test_install_is_idempotent():
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    before = list(impl._locator_classes)
    _numba_cache.install()
    assert impl._locator_classes == before
    assert sum(c.__name__ == "TolstatCacheLocator" for c in before) == 1


@pytest.mark.slow
def test_a_fresh_process_writes_its_cache_to_the_user_folder(tmp_path):
    code = textwrap.dedent("""
        import numpy as np
        from tolstat.measure.metrics import _ulp_kernel
        from tolstat.measure import ulp_distance
        a = np.linspace(-1, 1, 11)
        ulp_distance(a.astype(np.float16), a, np.float16)
    """)
    env = dict(os.environ, TOLSTAT_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("NUMBA_CACHE_DIR", None)
    before = set(Path(tolstat.__file__).parent.rglob("*.nb[ic]"))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    assert list((tmp_path / "numba").rglob("*.nbi")), "nothing cached"
    assert set(Path(tolstat.__file__).parent.rglob("*.nb[ic]")) == before


_SORTS = """\
import numpy as np
import numba

@numba.njit(cache=True)
def sort_in_place(a):
    a.sort()
    return a

@numba.njit(cache=True)
def argsort(a):
    return np.argsort(a)
"""

_CALL = """\
import sys
import numpy as np
from tolstat._base import numba_cache
numba_cache.install()  # what every tolstat module defining kernels does first
from numba.core.bytecode import FunctionIdentity
print("first id", next(FunctionIdentity._unique_ids))
import sorts
a = np.random.default_rng(0).standard_normal(50)
for name in sys.argv[1:]:
    out = getattr(sorts, name)(a.copy())
    want = np.sort(a) if name == "sort_in_place" else np.argsort(a)
    print(name, bool(np.array_equal(out, want)))
"""


@pytest.mark.slow
def test_kernels_cached_by_different_processes_load_together(tmp_path):
    """Two processes each compile one kernel first (same numba state, so without unique ids
    the sort and the argsort helpers get the same names); a third loads both from the
    cache: each must still compute its own function (numba keeps the first weak symbol).
    Each process starts numba's function ids at its own offset in ``_ID_OFFSETS``."""
    (tmp_path / "sorts.py").write_text(_SORTS)
    (tmp_path / "call.py").write_text(_CALL)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               NUMBA_CACHE_DIR=str(tmp_path / "cache"), TOLSTAT_CACHE_DIR=str(tmp_path / "t"))
    starts = []

    def call(*names: str) -> str:
        done = subprocess.run([sys.executable, str(tmp_path / "call.py"), *names], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        first, rest = done.stdout.split("\n", 1)
        starts.append(int(first.removeprefix("first id ")))
        return rest

    assert call("sort_in_place") == "sort_in_place True\n"
    assert call("argsort") == "argsort True\n"
    assert list((tmp_path / "cache").rglob("*.nbi")), "nothing cached"
    assert call("sort_in_place", "argsort") == "sort_in_place True\nargsort True\n"
    lo, hi = _numba_cache._ID_OFFSETS
    assert all(lo <= s < hi for s in starts), starts
    assert len(set(starts)) == 3, starts


def test_kernels_are_cached_below_the_layout_folder():
    path = Path(_locator(_ulp_kernel).get_cache_path())
    root = _numba_cache.cache_root()
    if root is None:
        pytest.skip("no writable cache folder")
    assert path.parent.name == _numba_cache.LAYOUT and path.parent.parent == root


def test_every_kernel_module_caches_outside_the_package_when_imported_first():
    # each module with @njit(cache=True) kernels installs the locator itself: imported
    # first in a fresh process, none of its kernels may use numba's in-tree locator
    mods = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                  for p in (ROOT / "tolstat").rglob("*.py")
                  if re.search(r"^@(numba\.)?njit\(.*cache=True", p.read_text(), re.M))
    assert "tolstat._base.label_kernels" in mods and "tolstat.measure.fused" in mods
    code = textwrap.dedent("""
        import importlib, sys
        m = importlib.import_module(sys.argv[1])
        kinds = {type(f._cache._impl.locator).__name__ for f in vars(m).values()
                 if getattr(f, "_cache", None) is not None and hasattr(f._cache, "_impl")}
        print(",".join(sorted(kinds)))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NUMBA_CACHE_DIR", None)
    for mod in mods:
        out = subprocess.run([sys.executable, "-c", code, mod], env=env, check=True, timeout=300,
                             capture_output=True, text=True).stdout.strip()
        assert out == "TolstatCacheLocator", (mod, out)
