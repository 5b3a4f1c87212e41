"""Small shared helpers: argument validation, atomic file writes, grouping of runs.

Foundation layer: imports nothing from the rest of the package.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["unit_interval", "atomic_write", "atomic_write_text", "Groups", "group_rows", "ANY", "GROUP_DIMS", "NotEnoughData"]

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
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {f!r}")
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
@dataclass(frozen=True)
class Groups:
    """Rows grouped by several label columns (see :func:`group_rows`).

    Attributes
    ----------
    levels : list of numpy.ndarray
        The sorted distinct values of each label column.
    shape : tuple of int
        ``len`` of each level: the dense grid of all label combinations.
    flat : numpy.ndarray of int
        Per row, the flat (C-order) index of its combination in the grid.
    present : numpy.ndarray of int
        The flat grid indices of the combinations that have rows, sorted.
    codes : numpy.ndarray of int
        Per row, the index of its combination in ``present``.
    """

    levels: list[np.ndarray]
    shape: tuple[int, ...]
    flat: np.ndarray
    present: np.ndarray
    codes: np.ndarray

    def keys(self) -> list[tuple[Any, ...]]:
        """The label values of each present combination (in ``present`` order)."""
        idx = np.unravel_index(self.present, self.shape) if self.levels else ()
        return [tuple(lv[i[j]] for lv, i in zip(self.levels, idx)) for j in range(self.present.size)]


def group_rows(labels: Sequence[Any], n: int | None = None) -> Groups:
    """Group rows by label columns (e.g. the ``op``, ``dtype``, ``hardware`` of each run).

    Parameters
    ----------
    labels : sequence of array_like
        Label columns of equal length (may be empty: one group of all rows).
    n : int, optional
        Number of rows (needed only when ``labels`` is empty).
    """
    levels, inv = [], []
    for col in labels:
        u, i = np.unique(np.asarray(col), return_inverse=True)
        levels.append(u)
        inv.append(np.asarray(i, dtype=np.int64).ravel())
    shape = tuple(len(u) for u in levels)
    rows = len(inv[0]) if inv else int(n or 0)
    flat = np.ravel_multi_index(inv, shape) if inv and rows else np.zeros(rows, np.int64)
    present, codes = np.unique(flat, return_inverse=True)
    return Groups(levels, shape, np.asarray(flat, dtype=np.int64), present,
                  np.asarray(codes, dtype=np.int64).ravel())


class NotEnoughData(ValueError):
    """Too few independent calibration units (runs, or declared clusters) to keep a promise.

    Raised by every calibration path (``tolstat.select``, ``tolstat.calibrate``,
    ``tolstat.certify``); ``on_error="skip"`` and ``tolstat evaluate`` catch only this.

    Attributes
    ----------
    n : int or None
        Units available.
    n_needed : int or None
        Units the group would need for the bound asked for.
    group : str or None
        The group refused, where known.
    """

    def __init__(self, message: str, *, n: int | None = None, n_needed: int | None = None,
                 group: str | None = None):
        super().__init__(message)
        self.n = None if n is None else int(n)
        self.n_needed = None if n_needed is None else int(n_needed)
        self.group = group
