"""Small shared helpers: argument validation, atomic file writes, grouping of runs.

Foundation layer: imports nothing from the rest of the package.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

__all__ = ["atomic_write", "atomic_write_text", "clean_stale", "remove_tree", "Groups", "rows_by_code",
           "group_rows", "ANY", "GROUP_DIMS", "NotEnoughData", "percent"]

#: the grouping of an error dataset and of a tolerance table
GROUP_DIMS = ("op", "dtype", "hardware")
#: the label of a group pooled over a dimension (e.g. hardware ``"*"``)
ANY = "*"


# --------------------------------------------------------------------------- validation


# --------------------------------------------------------------------------- atomic writes
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old|lnk)-(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-[0-9a-f]{8}")
_VER = "v-"


def _tmp_path(dest: Path, kind: str = "tmp") -> Path:
    """``.<name>.<kind>-<host>-<pid>-<random><suffix>`` next to ``dest``: unique per writer,
    and naming its writer so that a later save can remove it once that writer is dead."""
    return dest.with_name(f".{dest.name}.{kind}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}{dest.suffix}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(p: Path) -> None:
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()
    except FileNotFoundError:
        pass


def remove_tree(p: str | os.PathLike[str]) -> None:
    """Remove a file, a directory, or a link written by :func:`atomic_write` and its version."""
    p = Path(p)
    if p.is_symlink():
        target = p.parent / os.readlink(p)
        p.unlink()
        if target.parent == p.parent and target.name.startswith(f".{p.name}.{_VER}"):
            _remove(target)
    elif p.exists():
        _remove(p)


def clean_stale(dest: str | os.PathLike[str]) -> list[Path]:
    """Remove temporaries of ``dest`` left by killed writers (same host, process gone).

    Temporaries of live writers (a save in progress) are left alone. Returns the paths
    removed.
    """
    dest = Path(dest)
    removed = []
    try:
        entries = list(dest.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _TMP_RE.match(p.name)
        if not m or m.group("name") != dest.name or m.group("host") != _HOST:
            continue
        if not _alive(int(m.group("pid"))):
            _remove(p)
            removed.append(p)
    return removed


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], Any]) -> Path:
    """Write a file atomically: ``write(tmp)`` to a unique temporary name, then one rename.

    A reader sees either the old file or the complete new one, never a torn or missing
    file; a failed ``write`` leaves the destination untouched and removes the temporary.
    Temporaries of earlier writers that were killed (SIGKILL, OOM) are removed first.
    Concurrent writers of the same path do not collide (unique temporary names); the
    last rename wins.

    ``write`` may also create a directory (a zarr store). A directory cannot replace
    another one in a single rename, so the destination is then a *symbolic link* to a
    versioned directory ``.<name>.v-<id>`` next to it: the new version is written in
    full, a new link is made and renamed over the old one (one atomic rename), and only
    then is the previous version removed (under a lock, see ``docs/errors.md``). A
    destination that is a plain directory (written by an older tolstat) is swapped for
    the link with ``renameat2(RENAME_EXCHANGE)`` where the OS has it.

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
    clean_stale(dest)
    tmp = _tmp_path(dest)
    try:
        write(tmp)
        if tmp.is_dir():
            _publish_dir(tmp, dest)
        else:
            _fsync(tmp)
            os.replace(tmp, dest)
            _fsync_dir(dest.parent)
    except BaseException:
        _remove(tmp)
        raise
    return dest


def _fsync(p: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(d: Path) -> None:
    _fsync(d)


@contextlib.contextmanager
def _publish_lock(dest: Path) -> Iterator[None]:
    """Exclusive lock (waiting) for publishing a new version of the directory ``dest``
    (portable: ``filelock`` uses ``flock`` on POSIX, ``msvcrt`` on Windows)."""
    from filelock import FileLock

    lock = FileLock(os.fspath(dest.with_name(f".{dest.name}.publish-lock")), thread_local=False,
                    is_singleton=False)
    with lock:
        yield


def _publish_dir(tmp: Path, dest: Path) -> None:
    """Make the complete directory ``tmp`` the content of ``dest`` with one atomic rename."""
    with _publish_lock(dest):
        version = dest.with_name(f".{dest.name}.{_VER}{uuid.uuid4().hex}")
        os.replace(tmp, version)
        link = _tmp_path(dest, "lnk")
        os.symlink(version.name, link)
        try:
            if dest.is_dir() and not dest.is_symlink():
                _exchange(link, dest)  # the old plain directory is now at ``link``
            else:
                os.replace(link, dest)
        except BaseException:
            _remove(link)
            _remove(version)
            raise
        _remove(link)
        # every other version is superseded. It is first renamed away in one step, then
        # deleted: a reader that read a whole version and finds it still in place after
        # the read knows that it read an intact copy (tolstat.open_errors retries otherwise)
        for p in dest.parent.iterdir():
            if p.name.startswith(f".{dest.name}.{_VER}") and p.name != version.name:
                trash = _tmp_path(dest, "old")
                try:
                    os.rename(p, trash)
                except FileNotFoundError:
                    continue
                _remove(trash)
        _fsync_dir(dest.parent)


def _exchange(a: Path, b: Path) -> None:
    """Atomically exchange two paths (Linux ``renameat2(RENAME_EXCHANGE)``); fall back to
    two renames (a short window without ``b``) where the OS has no exchange."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        AT_FDCWD, RENAME_EXCHANGE = -100, 2
        if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
            return
    aside = _tmp_path(b, "old")
    os.replace(b, aside)
    os.replace(a, b)
    os.replace(aside, a)


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

    def rows(self) -> list[np.ndarray]:
        """Each combination's row indices (ascending, in ``present`` order): :func:`rows_by_code`."""
        return rows_by_code(self.codes, int(self.present.size))

    def keys(self) -> list[tuple[Any, ...]]:
        """The label values of each present combination (in ``present`` order)."""
        idx = np.unravel_index(self.present, self.shape) if self.levels else ()
        return [tuple(lv[i[j]] for lv, i in zip(self.levels, idx)) for j in range(self.present.size)]


#: below this many values :func:`factorize` calls ``numpy.unique`` (hashing pays off above it)
_FACTORIZE_MIN = 4096


def factorize(values: Any, *, sort: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(values, return_inverse=True)`` of a 1-D array: the same two arrays.

    Labels of a million runs (``op``, ``dtype``, ``hardware`` strings) make
    ``numpy.unique`` sort a million strings (0.13 s for 1e6 labels of 7 characters, 1.6 s
    of 30). For a string or bytes array of at least 4,096 values this hashes each value's
    code units into one 64-bit number (a numba pass, :mod:`tolstat._base.label_kernels`),
    groups the hashes with :func:`pandas.factorize` (pandas comes with xarray; codes in
    order of first appearance), **verifies** that every value equals its group's first
    value code unit for code unit (a hash collision falls back to ``numpy.unique``), and
    sorts only the distinct values. An object array of Python strings is grouped by
    :func:`pandas.factorize` directly (``str`` hashing and equality). An integer or
    boolean array (unit ids, codes) is grouped by :func:`pandas.factorize` (exact integer
    equality) and only its distinct values are sorted; integers spanning a range of at
    most ``4 * size + 65536`` values (and at most 2**24) are counted instead
    (``numpy.bincount``: no hashing, no sort; about 17 bytes of temporaries per value of
    the range). Other arrays (floats, whose ``-0.0``/``NaN`` rules are numpy's own, other
    objects, small arrays) call ``numpy.unique``.

    Parameters
    ----------
    values : array_like, 1-D
        The labels.
    sort : bool, default True
        False: the distinct values and the codes numbered in an unspecified order (the
        order of first appearance where the values are hashed), for callers that only
        group (the number of distinct values, or which rows share one): no sort of the
        distinct values, which dominates for a million distinct 64-bit fingerprints.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray of int64)
        The sorted distinct values (the input's dtype) and, per value, its index in them.
    """
    a = np.asarray(values)
    if a.ndim != 1 or a.size < _FACTORIZE_MIN or a.dtype.kind not in "USOiub" or a.dtype.itemsize == 0:
        return _unique(a)
    import pandas as pd

    if a.dtype.kind in "iu":
        lo, hi = int(a.min()), int(a.max())
        if hi - lo <= min(4 * a.size + 65536, 1 << 24):  # dense integers (codes, run indices): count them
            # offsets from the minimum, without wrapping: unsigned values are >= it, and
            # signed ones (a narrow type would wrap) are widened to int64 first
            off = np.asarray(a - a.dtype.type(lo) if a.dtype.kind == "u" else a.astype(np.int64) - lo,
                             dtype=np.intp)
            present = np.bincount(off, minlength=hi - lo + 1) > 0
            rank = np.cumsum(present, dtype=np.int64) - 1
            wide = np.uint64 if a.dtype.kind == "u" else np.int64  # holds lo and every value
            return (np.flatnonzero(present).astype(wide) + wide(lo)).astype(a.dtype), rank[off]
    if a.dtype.kind in "iub":
        codes, uniq = pd.factorize(a)
        if not sort:
            return np.asarray(uniq, dtype=a.dtype), np.asarray(codes, dtype=np.int64)
        return _sorted_codes(np.asarray(uniq, dtype=a.dtype), codes)

    if a.dtype.kind == "O":  # Python strings (a label per run pointing at a few shared str objects)
        if pd.api.types.infer_dtype(a, skipna=False) != "string":
            return _unique(a)
        codes, uniq = pd.factorize(a)  # str equality and hash, as numpy.unique's comparisons
        if not sort:
            return np.asarray(uniq, dtype=object), np.asarray(codes, dtype=np.int64)
        return _sorted_codes(np.asarray(uniq, dtype=object), codes)
    from tolstat._base.label_kernels import row_hashes, rows_equal_first

    chars = np.ascontiguousarray(a).view(np.uint32 if a.dtype.kind == "U" else np.uint8).reshape(a.size, -1)
    codes, _ = pd.factorize(row_hashes(chars))
    codes = np.asarray(codes, dtype=np.int64)
    # codes count up in order of first appearance: a new running maximum is a first occurrence
    first = np.flatnonzero(np.diff(np.maximum.accumulate(codes), prepend=-1) > 0)
    if not rows_equal_first(chars, first, codes):  # a hash collision: two labels in one group
        return _unique(a)
    return _sorted_codes(a[first], codes) if sort else (a[first], codes)


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``numpy.unique(a, return_inverse=True)``, the inverse as flat int64."""
    u, inv = np.unique(a, return_inverse=True)
    return u, np.asarray(inv, dtype=np.int64).ravel()


def _sorted_codes(reps: np.ndarray, codes: Any) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values ``reps`` (in order of first appearance) sorted, and each code
    (an index into ``reps``) renumbered to its value's rank: ``numpy.unique``'s two arrays."""
    order = np.argsort(reps, kind="stable")
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return reps[order], rank[np.asarray(codes, dtype=np.int64)]


def rows_by_code(codes: Any, n_groups: int) -> list[np.ndarray]:
    """The row indices (ascending) of each group code ``0 .. n_groups - 1``, from one stable
    sort: a mask per group (``codes == g``) makes a loop over the groups quadratic in their
    number."""
    codes = np.asarray(codes, dtype=np.int64).ravel()
    # numpy's stable sort is a radix sort for 16-bit integers: the same order in linear time
    small = codes.size and 0 <= int(codes.min()) and int(codes.max()) <= np.iinfo(np.int16).max
    narrow = codes.astype(np.int16) if small else codes
    order = np.argsort(narrow, kind="stable")
    ends = np.cumsum(np.bincount(codes, minlength=n_groups)[:n_groups])
    starts = np.concatenate([[0], ends[:-1]]) if n_groups else ends
    return [order[b:e] for b, e in zip(starts, ends)]


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
        u, i = factorize(np.asarray(col).ravel())
        levels.append(u)
        inv.append(i)
    shape = tuple(len(u) for u in levels)
    rows = len(inv[0]) if inv else int(n or 0)
    flat = np.ravel_multi_index(inv, shape) if inv and rows else np.zeros(rows, np.int64)
    present, codes = factorize(np.asarray(flat, dtype=np.int64))
    return Groups(levels, shape, np.asarray(flat, dtype=np.int64), present,
                  np.asarray(codes, dtype=np.int64).ravel())


class NotEnoughData(ValueError):
    """Too few independent calibration units (runs, or declared clusters) to keep a promise.

    Raised by every calibration path (``tolstat.select``, ``tolstat.calibration.calibrate``,
    ``tolstat.calibration.engine``); ``on_error="skip"`` and ``tolstat evaluate`` catch only this.

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


def percent(x: Any, digits: int) -> str:
    """``x`` (a fraction) as a percentage with ``digits`` decimals; ``-`` for NaN or None
    (nothing was measured)."""
    return "-" if x is None or x != x else f"{100 * x:.{digits}f}%"
