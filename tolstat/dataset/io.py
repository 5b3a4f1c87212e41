"""Save and open error datasets (netCDF or zarr, chosen by extension), atomically."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import xarray as xr

from tolstat._base.util import atomic_write
from tolstat.dataset.schema import GROUP_DIMS, normalize_labels, validate

__all__ = ["save", "open_errors", "format_for"]

_NETCDF = (".nc", ".nc4", ".netcdf", ".h5", ".hdf5")
_ZARR = (".zarr",)


def format_for(path: str | os.PathLike[str]) -> str:
    """Return ``"netcdf"`` or ``"zarr"`` for a path, from its extension.

    Raises
    ------
    ValueError
        For any other extension.
    """
    suffix = Path(path).suffix.lower()
    if suffix in _NETCDF:
        return "netcdf"
    if suffix in _ZARR:
        return "zarr"
    raise ValueError(
        f"cannot tell the format of {os.fspath(path)!r} from its extension; use one of "
        f"{', '.join(_NETCDF + _ZARR)}"
    )


def _plain(ds: xr.Dataset) -> xr.Dataset:
    """Drop a multi-index over op/dtype/hardware (set by ``tolstat.dataset.indexed``).

    A dataset without a ``run`` dimension is returned as it is (:func:`validate` names
    what it lacks)."""
    if "run" not in ds.dims:
        return ds
    if "run" in ds.indexes and ds.indexes["run"].__class__.__name__ == "MultiIndex":
        ds = ds.reset_index("run").drop_vars(["run", "pos"], errors="ignore")
    n = ds.sizes["run"]
    for name in GROUP_DIMS:
        # a selection like indexed(ds).sel(op="x") leaves the label as a scalar
        if name in ds.coords and ds[name].dims == ():
            ds = ds.assign_coords({name: ("run", np.array([str(ds[name].item())] * n))})
    return ds


def save(ds: xr.Dataset, path: str | os.PathLike[str], *, encoding: Mapping[str, Any] | None = None) -> Path:
    """Write an error dataset to ``path`` atomically (netCDF or zarr, by extension).

    The data are written to a temporary file next to ``path`` and renamed onto it only
    when complete, so a failed or interrupted save leaves any previous file intact.
    String labels are written by the label encoding rule
    (:func:`tolstat.dataset.schema.normalize_labels`): their stored width comes from their
    values, never from an encoding recorded when they were read.

    Parameters
    ----------
    ds : xarray.Dataset
        A valid error dataset (checked with :func:`tolstat.dataset.validate`).
    path : str or path-like
        Destination; ``.nc``/``.nc4``/``.h5`` write netCDF-4 (h5netcdf), ``.zarr`` a zarr
        store (a directory).
    encoding : dict, optional
        Per-variable encoding passed to xarray (compression, chunks).

    Returns
    -------
    pathlib.Path
        The destination path.

    Raises
    ------
    TypeError
        ``ds`` is not an ``xarray.Dataset``.
    ValueError
        An unknown extension, or ``ds`` is not a valid error dataset (the message names
        what is missing, e.g. the ``tolstat_schema`` attribute or the ``run`` dimension);
        nothing is written.
    FileNotFoundError
        The folder of ``path`` does not exist.
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"save needs an error dataset (xarray.Dataset), got {type(ds).__name__}")
    dest = Path(path)
    fmt = format_for(dest)
    ds = normalize_labels(validate(_plain(ds), deep=False))
    if dest.is_dir() and not dest.is_symlink() and fmt == "netcdf":
        raise ValueError(f"{os.fspath(dest)!r} is a directory; a netCDF dataset is a file")
    if not dest.parent.exists():
        raise FileNotFoundError(f"directory {os.fspath(dest.parent)!r} does not exist")

    def write(tmp: Path) -> None:
        if fmt == "netcdf":
            ds.to_netcdf(tmp, engine="h5netcdf", encoding=dict(encoding or {}))
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        else:
            ds.to_zarr(tmp, mode="w", encoding=dict(encoding or {}), consolidated=True,
                       write_empty_chunks=True, zarr_format=2)

    return atomic_write(dest, write)


def _check_zarr_complete(path: Path) -> None:
    import zarr

    group = zarr.open_group(str(path), mode="r")
    for name, arr in group.arrays():
        if arr.nchunks_initialized < arr.nchunks:
            raise ValueError(
                f"array {name!r} has {arr.nchunks - arr.nchunks_initialized} of "
                f"{arr.nchunks} chunks missing (truncated copy?)"
            )


def open_errors(path: str | os.PathLike[str], chunks: Any = None) -> xr.Dataset:
    """Open an error dataset saved by :func:`save`.

    Parameters
    ----------
    path : str or path-like
        A ``.nc`` file or ``.zarr`` store.
    chunks : dict, "auto" or None
        ``None`` loads everything into memory (and closes the file); otherwise a dask
        chunking, e.g. ``{"run": 1000}`` (never chunk ``sample``: estimators reduce over
        it).

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        The file is truncated, not readable in its format, foreign, or not a valid error
        dataset; the message names the file and the problem.
    """
    p = Path(path)
    fmt = format_for(p)
    if not p.exists():
        raise FileNotFoundError(f"no error dataset at {os.fspath(p)!r}")
    if fmt == "netcdf" and p.is_dir():
        raise ValueError(f"{os.fspath(p)!r} is a directory, not a netCDF file")
    if fmt == "zarr" and not p.is_dir():
        raise ValueError(f"{os.fspath(p)!r} is a plain file, not a zarr store (a directory)")
    if isinstance(chunks, Mapping) and "sample" in chunks and chunks["sample"] not in (-1, None):
        raise ValueError("do not chunk along 'sample': estimators reduce over it (use -1)")
    for attempt in range(_RETRIES):
        # a zarr dataset saved by tolstat is a link to an immutable version directory:
        # read through the resolved version, and if a concurrent save removed it
        # mid-read, read the new version (never a mix of the two)
        real = p.resolve()
        try:
            ds = _read(real, fmt, chunks)
            if fmt == "zarr" and chunks is None and not real.is_dir():
                # the version was retired while we read it: some chunks may have been
                # missing (read as fill values); read the current version again
                raise _Retired(os.fspath(real))
            break
        except _Retired:
            if attempt + 1 < _RETRIES:
                continue
            raise ValueError(f"{os.fspath(p)!r} was replaced {_RETRIES} times while being read; "
                             "try again when the writers are done") from None
        except (FileNotFoundError, PermissionError) as exc:
            if attempt + 1 < _RETRIES and p.resolve() != real:
                continue
            if isinstance(exc, FileNotFoundError) and not p.exists():
                raise
            raise ValueError(f"cannot read {os.fspath(p)!r} as a {fmt} error dataset: "
                             f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if attempt + 1 < _RETRIES and p.resolve() != real:
                continue
            raise ValueError(
                f"cannot read {os.fspath(p)!r} as a {fmt} error dataset "
                f"(truncated or corrupt?): {type(exc).__name__}: {exc}"
            ) from exc
    return validate(ds, source=os.fspath(p))


_RETRIES = 8


class _Retired(Exception):
    """The version directory being read was retired by a concurrent save."""


def _read(real: Path, fmt: str, chunks: Any) -> xr.Dataset:
    if fmt == "netcdf":
        ds = xr.open_dataset(real, engine="h5netcdf", chunks=chunks)
    else:
        _check_zarr_complete(real)
        ds = xr.open_dataset(real, engine="zarr", chunks=chunks, consolidated=None)
    if chunks is None:
        ds = ds.load()
        ds.close()
    return ds
