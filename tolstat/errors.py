"""Backward-compatible alias of :mod:`tolstat.dataset` (the error dataset)."""

from .dataset import *  # noqa: F401,F403
from .dataset import __all__  # noqa: F401
