"""``tolstat collect`` for the user's own kernels: ``module:function`` specs.

``--kernel mymod:kern --reference mymod:ref --inputs mymod:make_inputs`` names three
callables the way ``python -m`` and entry points do: an importable module (the current
directory is searched first) or a ``.py`` file path, a colon, then an attribute path
(``mymod:Suite.kernel`` works too). They are passed to :func:`tolstat.collect`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["resolve_spec", "add_arguments", "run"]


def resolve_spec(spec: str, *, option: str = "spec") -> Callable[..., Any]:
    """Import the callable named by ``module:attr`` or ``path/to/file.py:attr``.

    Parameters
    ----------
    spec : str
        ``"package.module:function"``, ``"module:Class.method"`` or ``"file.py:function"``.
    option : str
        The option that gave ``spec``, for error messages.

    Returns
    -------
    callable

    Raises
    ------
    ValueError
        If ``spec`` has no ``:``, the module cannot be imported, the attribute does not
        exist, or it is not callable.
    """
    mod_name, sep, attr = str(spec).partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"{option} {spec!r} must be MODULE:FUNCTION (e.g. mykernels:matmul)")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if not path.is_file():
            raise ValueError(f"{option} {spec!r}: no file {os.fspath(path)!r}")
        name = f"_tolstat_user_{path.stem}"
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != str(path.resolve()):
            loader_spec = importlib.util.spec_from_file_location(name, path.resolve())
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
    else:
        cwd = os.getcwd()
        if cwd not in sys.path and "" not in sys.path:
            sys.path.insert(0, cwd)  # as ``python -m``: the user's modules in the current folder
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ValueError(f"{option} {spec!r}: cannot import module {mod_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{option} {spec!r}: {mod_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"{option} {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def add_arguments(c: argparse.ArgumentParser) -> None:
    """The user-kernel options of ``tolstat collect``."""
    g = c.add_argument_group("your own kernel (instead of the corpus)")
    g.add_argument("--kernel", metavar="MODULE:FUNCTION", help="the kernel under calibration")
    g.add_argument("--reference", metavar="MODULE:FUNCTION", help="its float64 reference")
    g.add_argument("--inputs", metavar="MODULE:FUNCTION",
                   help="make_inputs(rng) -> the arguments of one run (see tolstat.collect)")
    g.add_argument("--op", help="operator name recorded in the dataset")
    g.add_argument("--dtype", help="target dtype of the kernel output (fp16, bf16, fp8_e4m3, ...)")
    g.add_argument("--runs", type=int, default=None, help="number of runs (default 100)")
    g.add_argument("--hardware", default=None, help="hardware label (default: this machine's fingerprint)")


_CORPUS_ONLY = ("ops", "quick")


def wanted(args: argparse.Namespace) -> bool:
    """Whether ``args`` ask for the user's own kernel (any of its options given)."""
    return any(getattr(args, k) is not None for k in ("kernel", "reference", "inputs", "op", "dtype",
                                                      "runs", "hardware"))


def run(args: argparse.Namespace) -> Any:
    """Collect the error dataset of the user's kernel named by ``args``."""
    from tolstat import CollectOptions, collect

    missing = [f"--{k}" for k in ("kernel", "reference", "inputs", "op", "dtype")
               if getattr(args, k) is None]
    if missing:
        raise ValueError(f"collecting your own kernel needs {', '.join(missing)} "
                         "(or none of --kernel/--reference/--inputs/--op/--dtype/--runs for the corpus)")
    clash = [f"--{k}" for k in _CORPUS_ONLY if getattr(args, k)]
    if clash:
        raise ValueError(f"{', '.join(clash)} only apply to the corpus, not with --kernel")
    runs = 100 if args.runs is None else args.runs
    if runs < 1:
        raise ValueError(f"--runs must be >= 1, got {runs}")
    return collect(resolve_spec(args.kernel, option="--kernel"),
                   resolve_spec(args.reference, option="--reference"),
                   resolve_spec(args.inputs, option="--inputs"),
                   op=args.op, dtype=args.dtype, runs=runs, seed=args.seed,
                   hardware=args.hardware, options=CollectOptions(progress=args.progress))
