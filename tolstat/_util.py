"""Small shared helpers: argument validation, atomic file writes, grouping of runs.

Foundation layer: imports nothing from the rest of the package.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["unit_interval", "atomic_write", "atomic_write_text", "group_codes", "ANY", "GROUP_DIMS"]

#: the grouping of an error dataset and of a tolerance table
GROUP_DIMS = ("op", "dtype", "hardware")
#: the label of a group pooled over a dimension (e.g. hardware ``"*"``)
ANY = "*"


# --------------------------------------------------------------------------- validation
def unit_interval(name: str, value: Any) -> float:
    """``float(value)``, checked to lie strictly between 0 and 1.

    Raises
    ------
    ValueError
        ``value`` is not a number, or not in the open interval (0, 1); the message names
        the argument and the value.
    """
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}") from None
    if not (0.0 < f < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return f


# --------------------------------------------------------------------------- atomic writes
def _tmp_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}{dest.suffix}")


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Write a file atomically: ``write(tmp)`` to a unique temporary name, then one ``os.replace``.

    A reader sees either the old file or the complete new one; a failed ``write`` leaves
    the destination untouched and removes the temporary file. ``write`` may also create
    a directory (a zarr store): an existing destination directory is then kept aside
    until the new one is in place.

    Parameters
    ----------
    path : path-like
        Destination file or directory.
    write : callable
        Called with the temporary path (same folder, same suffix); must create it.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    dest = Path(path)
    tmp = _tmp_path(dest)
    try:
        write(tmp)
        _replace(tmp, dest)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        raise
    return dest


def _replace(tmp: Path, dest: Path) -> None:
    """Move ``tmp`` onto ``dest``; for directories keep the old one until the new is in place."""
    if not tmp.is_dir():
        os.replace(tmp, dest)
        return
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(dest, old)
    try:
        os.replace(tmp, dest)
    except BaseException:
        if old is not None:
            os.replace(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text file."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


# --------------------------------------------------------------------------- grouping
def group_codes(labels: Sequence[Any]) -> tuple[list[tuple[str, ...]], np.ndarray]:
    """Group rows by several label columns.

    Parameters
    ----------
    labels : sequence of array_like
        Label columns of equal length (converted to ``str``).

    Returns
    -------
    keys : list of tuple of str
        The distinct label combinations, sorted.
    codes : numpy.ndarray of int
        For each row, the index of its key in ``keys``.
    """
    cols = [np.asarray(c).astype(str) for c in labels]
    if not cols:
        raise ValueError("group_codes needs at least one label column")
    keys = np.array(["\x00".join(t) for t in zip(*cols)], dtype=str) if len(cols[0]) else np.empty(0, str)
    uniq, inv = np.unique(keys, return_inverse=True)
    return [tuple(str(u).split("\x00")) for u in uniq], np.asarray(inv, dtype=np.int64).ravel()
