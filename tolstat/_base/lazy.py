"""Lazy package namespaces (PEP 562).

A package of tolstat lists its modules; its public names are those modules' ``__all__``,
found and imported on first use. Importing a package therefore loads none of its modules
(``import tolstat.checks.pytest_plugin`` stays free of numpy), while
``tolstat.dataset.run_units`` still works without naming the module that defines it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

__all__ = ["namespace"]


def namespace(package: str, modules: tuple[str, ...]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public modules are ``modules``.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    modules : tuple of str
        Its public modules, in order of precedence: a name is taken from the first module
        whose ``__all__`` lists it (the defining module comes before one re-exporting it).
        The package's ``__all__`` is these modules, then their names.
    """

    def names() -> list[str]:
        out: list[str] = [m for m in modules if not m.startswith("_")]
        for m in modules:
            sub = importlib.import_module(f"{package}.{m}")
            # a subpackage's own modules are its names, not this package's
            own = set(getattr(sub, "__lazy_modules__", ()))
            for n in getattr(sub, "__all__", ()):
                if n not in out and n not in own:
                    out.append(n)
        return out

    def __getattr__(name: str) -> Any:
        if name in modules:
            value = importlib.import_module(f"{package}.{name}")
        elif name == "__all__":
            value = names()
        else:
            for m in modules:
                mod = importlib.import_module(f"{package}.{m}")
                if name in getattr(mod, "__all__", ()):
                    value = getattr(mod, name)
                    break
            else:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(modules) | set(names()))

    sys.modules[package].__lazy_modules__ = tuple(modules)  # type: ignore[attr-defined]
    return __getattr__, __dir__
