"""Where numba caches tolstat's compiled kernels: a per-user cache folder, never the package.

numba's default for ``@njit(cache=True)`` writes ``*.nbi``/``*.nbc`` files into the
``__pycache__`` folder next to the source. For an installed tolstat that is
``site-packages/tolstat/**/__pycache__``: pip's uninstall does not know those files and
leaves the folders behind, and an empty ``tolstat`` folder left in ``site-packages``
then shadows a later editable install as a namespace package.

:func:`install` puts one cache locator in front of numba's in-tree locator. It applies
only to functions defined in files of this package (other numba users are unaffected)
and sends their cache to, in order of preference:

1. ``$TOLSTAT_CACHE_DIR/numba`` if the environment variable ``TOLSTAT_CACHE_DIR`` is set;
2. the per-user cache folder (``~/.cache/tolstat/numba`` on Linux, the platform's
   equivalent elsewhere);
3. ``<temp dir>/tolstat-numba-<user>``.

The first of these that can be created and written to is used. Only if none can (not
even the temp directory) does numba's default chain apply. numba's own ``NUMBA_CACHE_DIR`` keeps precedence
(numba's user-provided locator is consulted before this one), and so does
``NUMBA_CACHE_LOCATOR_CLASSES``. Kernels are cached below ``<root>/<LAYOUT>/``.

:func:`install` also makes the names numba gives compiled functions unique across
processes. numba names every function it compiles ``<qualname>$<id>`` with a per-process
counter that starts at 1, and a cached library exports the helpers it compiled in (sort,
argsort, ...) as weak symbols under those names. Two kernels cached by two processes (two
pytest workers, two scripts) can therefore carry *different* helpers under the *same*
name: the closure of ``a.sort()`` in one and of ``np.argsort(a)`` in the other. Loaded into
one process, the first library's helper serves both, and the second kernel returns garbage
or crashes. :func:`install` starts the counter of each process at a random offset in
``[2**32, 2**48)``, so the id ranges of two processes overlap with probability about
``2 * ids / 2**48`` (``ids`` the count each compiles, a few thousand: about 1e-11). Caches written before this (counter from 1) live outside ``<LAYOUT>`` and are
not read.
"""

from __future__ import annotations

import getpass
import itertools
import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any

__all__ = ["LAYOUT", "PACKAGE_DIR", "cache_root", "install"]

#: the folder of the tolstat package; only functions defined below it are located here
PACKAGE_DIR = Path(__file__).resolve().parents[1]

_ENV = "TOLSTAT_CACHE_DIR"

#: subfolder of the cache root holding the kernels; a new value when the names inside
#: cached libraries change meaning ("2": function ids unique across processes)
LAYOUT = "2"

#: the range of the per-process start of numba's function-id counter
_ID_OFFSETS = (2**32, 2**48)


def _user_cache_dir() -> Path | None:
    try:
        from numba.misc.appdirs import AppDirs
    except ImportError:  # pragma: no cover - numba moved its vendored appdirs
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "tolstat"
    return Path(AppDirs(appname="tolstat", appauthor=False).user_cache_dir)


def _temp_cache_dir() -> Path:
    try:
        user = getpass.getuser()
    except Exception:  # pragma: no cover - no user name (some containers)
        user = str(os.getpid())
    return Path(tempfile.gettempdir()) / f"tolstat-numba-{user}"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder)
    except ValueError:
        return False
    return True


def cache_root() -> Path | None:
    """The folder tolstat's numba kernels are cached in, or ``None`` when none is writable.

    Returns
    -------
    pathlib.Path or None
        The first writable candidate: ``$TOLSTAT_CACHE_DIR/numba``, the per-user cache
        folder's ``numba`` subfolder, then a per-user folder in the temp directory.
        A candidate inside the package folder itself is skipped.
    """
    candidates: list[Path] = []
    env = os.environ.get(_ENV)
    if env:
        candidates.append(Path(env).expanduser() / "numba")
    user = _user_cache_dir()
    if user is not None:
        candidates.append(user / "numba")
    candidates.append(_temp_cache_dir())
    for cand in candidates:
        if not _inside(cand, PACKAGE_DIR) and _writable(cand):
            return cand
    return None


def _locator_class() -> type:
    from numba.core import caching

    class TolstatCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """numba cache locator for tolstat's own kernels: a per-user folder, never in-tree."""

        _root: Path | None = None
        _root_known = False

        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            root = type(self)._root
            assert root is not None
            self._cache_path = os.path.join(os.fspath(root), LAYOUT, self.get_suitable_cache_subpath(py_file))

        def get_cache_path(self) -> str:
            return self._cache_path

        @classmethod
        def _owns(cls, py_file: str) -> bool:
            return os.path.exists(py_file) and _inside(Path(py_file), PACKAGE_DIR)

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if not cls._owns(py_file):
                return None
            if not cls._root_known:
                cls._root = cache_root()
                cls._root_known = True
            if cls._root is None:
                return None
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    return TolstatCacheLocator


_installed = False


def _unique_function_ids() -> bool:
    """Start numba's function-id counter of this process at a random offset (see the module
    docstring); ``False`` when this numba keeps the counter elsewhere."""
    try:
        from numba.core.bytecode import FunctionIdentity
    except ImportError:  # pragma: no cover - numba moved it
        return False
    counter = getattr(FunctionIdentity, "_unique_ids", None)
    if not isinstance(counter, itertools.count):  # pragma: no cover - numba changed it
        return False
    lo, hi = _ID_OFFSETS
    FunctionIdentity._unique_ids = itertools.count(lo + secrets.randbelow(hi - lo))
    return True


def install() -> None:
    """Register tolstat's cache locators with numba and make function names unique across
    processes (idempotent).

    Must run before the first ``@njit(cache=True)`` function of tolstat is compiled,
    which is why every module defining kernels calls it right before them.
    """
    global _installed
    if _installed:
        return
    if not _unique_function_ids():  # pragma: no cover - a numba without these internals
        warnings.warn("tolstat: cannot make numba's function names unique across processes with "
                      "this numba; kernels cached by different processes may clash when loaded "
                      "together", RuntimeWarning, stacklevel=2)
    try:
        from numba.core import caching

        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        classes = impl._locator_classes  # shared by numba's cache implementations
        located = _locator_class()
    except (ImportError, AttributeError) as exc:  # pragma: no cover - a numba without these internals
        warnings.warn(f"tolstat: cannot place numba's cache outside the package with this numba "
                      f"({exc}); numba's default cache locations apply", RuntimeWarning, stacklevel=2)
        _installed = True
        return
    # after numba's user-provided locator (NUMBA_CACHE_DIR keeps precedence), before the
    # in-tree one
    user = getattr(caching, "UserProvidedCacheLocator", None) or getattr(caching, "_UserProvidedCacheLocator", None)
    pos = 1 if classes and user is not None and classes[0] is user else 0  # numba < 0.61: _-prefixed
    classes.insert(pos, located)
    _installed = True
