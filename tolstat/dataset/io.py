"""Save and open error datasets (netCDF or zarr, chosen by extension), atomically.

:func:`save` writes losslessly compressed files (netCDF: zlib with byte shuffle on every
numeric variable; zarr: its default Blosc compressor), stores ``|d|`` once (``sample_abs``
as -1 where it is ``abs(sample_signed)``) and an element-sample variable as float32 when
every value round-trips through float32 exactly (the ULP distances: integers);
:func:`open_errors` restores both, so the values a consumer sees are bit for bit those
saved. :func:`storage_info` (and the
``tolstat summary`` command) says what a file keeps and how it is stored.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import xarray as xr

from tolstat._base.util import atomic_write
from tolstat.dataset.schema import GROUP_DIMS, SAMPLE_VARS, normalize_labels, validate

__all__ = ["save", "open_errors", "format_for", "default_encoding", "storage_info", "describe_storage",
           "NETCDF_COMPRESSION"]

#: the lossless compression :func:`save` gives every numeric variable of a netCDF file
#: (zlib level 1 with byte shuffle: on 2,400 runs of 4,096 elements about as small as
#: level 4 at half the write time, ``docs/schema.md``)
NETCDF_COMPRESSION: dict[str, Any] = {"zlib": True, "complevel": 1, "shuffle": True}

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


def save(ds: xr.Dataset, path: str | os.PathLike[str], *, encoding: Mapping[str, Any] | None = None,
         compress: bool = True) -> Path:
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
        Per-variable encoding passed to xarray (compression, chunks, dtype). A variable
        named here is written with exactly this encoding; the others get the defaults
        (:func:`default_encoding`): netCDF compresses every numeric variable with
        :data:`NETCDF_COMPRESSION`, zarr with its default compressor, and an
        element-sample variable whose values are all exact in float32 is stored as
        float32. ``sample_abs`` is stored once: as -1 wherever it is bit for bit
        ``abs(sample_signed)`` (compressed files; :func:`open_errors` restores it; naming
        ``sample_abs`` in ``encoding`` writes it as it is). Every default is lossless.
    compress : bool, default True
        netCDF: compress the numeric variables (:data:`NETCDF_COMPRESSION`). ``False``
        writes them uncompressed: faster and larger (``tolstat evaluate``'s calibration
        dataset of 29,600 runs with 512-element samples: 1.4 s against 3.2 s, 451 MB against
        130 MB, measured on 2 cores; ``evaluate`` writes it so; ``docs/schema.md``).
        zarr keeps its default compressor either way.

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
    if encoding is not None and not isinstance(encoding, Mapping):
        raise TypeError(f"encoding must be a mapping {{variable: encoding}} or None, got {type(encoding).__name__}")
    if not isinstance(compress, bool):
        raise TypeError(f"compress must be True or False, got {compress!r}")
    if "sample_abs" not in dict(encoding or {}) and (compress or fmt == "zarr"):
        # uncompressed netCDF (the fast write) stores it as it is: -1s save nothing there
        ds = _abs_derived(ds)
    enc = default_encoding(ds, fmt, compress=compress)
    for key, value in dict(encoding or {}).items():
        if not isinstance(value, Mapping):
            raise TypeError(f"encoding[{key!r}] must be a mapping of encoding keys, got {type(value).__name__}")
        enc[str(key)] = dict(value)
    if dest.is_dir() and not dest.is_symlink() and fmt == "netcdf":
        raise ValueError(f"{os.fspath(dest)!r} is a directory; a netCDF dataset is a file")
    if not dest.parent.exists():
        raise FileNotFoundError(f"directory {os.fspath(dest.parent)!r} does not exist")

    def write(tmp: Path) -> None:
        if fmt == "netcdf":
            ds.to_netcdf(tmp, engine="h5netcdf", encoding=enc)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        else:
            ds.to_zarr(tmp, mode="w", encoding=enc, consolidated=True,
                       write_empty_chunks=True, zarr_format=2)

    return atomic_write(dest, write)


#: attribute of a stored ``sample_abs`` whose entries equal to :data:`_DERIVED` stand for
#: ``abs(sample_signed)`` (bit for bit the value saved there): ``|d|`` is not stored twice
ABS_DERIVED_ATTR = "tolstat_abs_of_signed"
#: the stored value meaning "``abs(sample_signed)``" (never a valid ``|d|``: errors are >= 0)
_DERIVED = -1.0


def _abs_derived(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with ``sample_abs`` stored as :data:`_DERIVED` wherever it is bit for bit
    ``abs(sample_signed)`` (the finite errors and the padding), the other values kept (the
    infinite errors of non-finite outputs); unchanged where either is not an in-memory
    float64 array. :func:`_read` restores it exactly."""
    if "sample_abs" not in ds or "sample_signed" not in ds:
        return ds
    a, d = ds["sample_abs"].variable, ds["sample_signed"].variable
    if a.dtype != np.float64 or d.dtype != np.float64 or a.chunks is not None or d.chunks is not None:
        return ds
    av, dv = np.asarray(a.values), np.asarray(d.values)
    out = np.empty_like(av)
    flat_a, flat_d, flat_o = av.reshape(-1), dv.reshape(-1), out.reshape(-1)
    for i in range(0, flat_a.size, _EXACT_BLOCK):  # in blocks: temporaries stay small
        blk = slice(i, i + _EXACT_BLOCK)
        va = flat_a[blk]
        same = va.view(np.int64) == np.abs(flat_d[blk]).view(np.int64)
        np.copyto(flat_o[blk], va)
        flat_o[blk][same] = _DERIVED
    new = xr.Variable(a.dims, out, dict(a.attrs))
    new.attrs[ABS_DERIVED_ATTR] = f"{_DERIVED:g} stands for abs(sample_signed)"
    return ds.assign(sample_abs=new)


def _abs_restored(ds: xr.Dataset) -> xr.Dataset:
    """Undo :func:`_abs_derived` on a dataset read (lazily where it is dask-backed)."""
    if "sample_abs" not in ds or ABS_DERIVED_ATTR not in ds["sample_abs"].attrs:
        return ds
    a, d = ds["sample_abs"].variable, ds["sample_signed"].variable
    attrs = {k: v for k, v in a.attrs.items() if k != ABS_DERIVED_ATTR}
    enc = dict(a.encoding)
    if a.chunks is None and d.chunks is None:
        av = np.asarray(a.values, dtype=np.float64)
        new = xr.Variable(a.dims, np.where(av == _DERIVED, np.abs(np.asarray(d.values, dtype=np.float64)), av), attrs)
    else:
        new = xr.where(ds["sample_abs"] == _DERIVED, abs(ds["sample_signed"]), ds["sample_abs"]).variable
        new.attrs = attrs
    new.encoding = enc
    return ds.assign(sample_abs=new)


def _exact_in_float32(var: xr.Variable) -> bool:
    """True when ``var`` is in-memory float64 and every value round-trips through float32
    exactly (NaN, signed zeros and infinities included); dask-backed data: False (the
    check would read everything once more)."""
    if var.dtype != np.float64 or var.chunks is not None:
        return False
    flat = np.asarray(var.values).reshape(-1)
    # in blocks: the temporaries stay small next to a sample of millions of values, and a
    # variable that is not exact (the errors, the references) is told by its first block
    for i in range(0, flat.size, _EXACT_BLOCK):
        v = flat[i:i + _EXACT_BLOCK]
        with np.errstate(over="ignore", invalid="ignore"):
            back = v.astype(np.float32).astype(np.float64)
        same = (back == v) | (np.isnan(back) & np.isnan(v))
        if not (same.all() and np.array_equal(np.signbit(back), np.signbit(v))):
            return False
    return True


#: values per block of :func:`_exact_in_float32`
_EXACT_BLOCK = 1 << 20


def default_encoding(ds: xr.Dataset, fmt: str, *, compress: bool = True) -> dict[str, dict[str, Any]]:
    """The lossless encodings :func:`save` writes ``ds`` with (``fmt``: ``"netcdf"`` or ``"zarr"``).

    Every element-sample variable (:data:`~tolstat.dataset.schema.SAMPLE_VARS`) is stored
    as float32 when all its values are exact in float32 (the ULP distances, which are
    integers), else as float64 (the dtype recorded when a file was read is not reused:
    the values decide). netCDF: every numeric data variable and coordinate is compressed
    with :data:`NETCDF_COMPRESSION`; zarr keeps its default compressor (Blosc lz4 with
    shuffle). A variable given an encoding here is written without the one recorded when
    its file was read (its chunks included: the writer picks them). ``compress=False``:
    netCDF variables uncompressed (the float32 rule still applies).

    Raises
    ------
    ValueError
        ``fmt`` is neither ``"netcdf"`` nor ``"zarr"``.
    """
    if fmt not in ("netcdf", "zarr"):
        raise ValueError(f"fmt must be 'netcdf' or 'zarr', got {fmt!r}")
    enc: dict[str, dict[str, Any]] = {}
    if fmt == "netcdf":
        for name, var in ds.variables.items():
            if var.dtype.kind in "fiub" and name not in ds.xindexes:
                enc[str(name)] = dict(NETCDF_COMPRESSION) if compress else {"zlib": False}
    for name in SAMPLE_VARS:
        if name in ds.variables:
            enc.setdefault(name, {})["dtype"] = "float32" if _exact_in_float32(ds[name].variable) else "float64"
    return enc


def _disk_size(path: Path) -> int:
    """Bytes of a file, or of every file under a directory (a zarr store; links resolved)."""
    p = path.resolve()
    if p.is_file():
        return p.stat().st_size
    return sum((Path(root) / f).stat().st_size for root, _, files in os.walk(p) for f in files)


def _compression(enc: Mapping[str, Any]) -> str:
    """The compression of one variable as read from its encoding, in words."""
    comps = enc.get("compressors") or ((enc["compressor"],) if enc.get("compressor") is not None else ())
    if comps:
        return "+".join(type(c).__name__ if not hasattr(c, "cname") else f"blosc-{c.cname}" for c in comps)
    if enc.get("zlib"):
        return f"zlib-{enc.get('complevel', '?')}" + ("+shuffle" if enc.get("shuffle") else "")
    for key in ("zstd", "blosc", "bzip2", "szip"):
        if enc.get(key):
            return key
    if enc.get("compression"):
        return str(enc["compression"])
    return "none"


def storage_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What an error dataset file keeps and how it is stored (``tolstat summary`` prints it).

    Parameters
    ----------
    path : str or path-like
        A ``.nc`` file or ``.zarr`` store written by :func:`save` (or by an older tolstat).

    Returns
    -------
    dict
        ``path``, ``format``, ``bytes`` (on disk), ``runs``, ``sample`` (length of the
        ``sample`` dimension), ``sample_per_run`` (min, median, max of ``n_sample``),
        ``bytes_per_run``, ``variables`` (run-level data variables: statistics,
        covariates, operator statistics), ``labels`` (run labels), and ``stored``:
        per element-sample variable its on-disk ``dtype`` and ``compression``, plus
        ``"run-level"``, the compressions of the other numeric variables.

    Raises
    ------
    FileNotFoundError, ValueError
        As :func:`open_errors`.
    """
    p = Path(path)
    fmt = format_for(p)
    if not p.exists():
        raise FileNotFoundError(f"no error dataset at {os.fspath(p)!r}")
    try:
        raw = _read(p.resolve(), fmt, chunks=None, load=False)
    except Exception as exc:
        raise ValueError(f"cannot read {os.fspath(p)!r} as a {fmt} error dataset: {type(exc).__name__}: {exc}") from exc
    try:
        stored: dict[str, dict[str, str]] = {}
        for name in SAMPLE_VARS:
            if name in raw.variables:
                var = raw[name]
                stored[name] = {"dtype": str(np.dtype(var.encoding.get("dtype", var.dtype))),
                                "compression": _compression(var.encoding)}
                if ABS_DERIVED_ATTR in var.attrs:
                    stored[name]["derived"] = "abs(sample_signed) where equal, bit for bit"
        run_level = [v for k, v in raw.variables.items()
                     if k not in SAMPLE_VARS and v.dtype.kind in "fiub" and "run" in v.dims]
        stored["run-level"] = {
            "dtype": "/".join(sorted({str(np.dtype(v.encoding.get("dtype", v.dtype))) for v in run_level})) or "none",
            "compression": ", ".join(sorted({_compression(v.encoding) for v in run_level})) or "none"}
        ns = np.asarray(raw["n_sample"].values) if "n_sample" in raw else np.zeros(0, dtype=np.int64)
        runs = int(raw.sizes.get("run", 0))
        size = _disk_size(p)
        return {
            "path": os.fspath(p), "format": fmt, "bytes": size, "runs": runs,
            "sample": int(raw.sizes.get("sample", 0)),
            "sample_per_run": (int(ns.min()), float(np.median(ns)), int(ns.max())) if ns.size else (0, 0.0, 0),
            "bytes_per_run": size / runs if runs else float("nan"),
            "variables": sum(1 for v in raw.data_vars.values() if v.dims == ("run",)),
            "labels": sum(1 for k, v in raw.coords.items() if v.dims == ("run",) and k not in raw.xindexes),
            "stored": stored,
        }
    finally:
        raw.close()


def describe_storage(info: Mapping[str, Any]) -> str:
    """:func:`storage_info` as a few lines of text."""
    lo, med, hi = info["sample_per_run"]
    per_run = f"{lo}" if lo == hi else f"{lo}..{hi} (median {med:g})"
    lines = [f"file: {info['path']} ({info['format']}), {info['bytes'] / 1e6:.2f} MB on disk, "
             f"{info['runs']} runs, {info['bytes_per_run'] / 1e3:.2f} kB per run",
             f"kept per run: {info['labels']} labels, {info['variables']} run-level variables (statistics, "
             f"covariates, operator statistics), an element sample of {per_run} elements "
             f"(sample dimension {info['sample']})"]
    for name, s in info["stored"].items():
        derived = f"; {s['derived']} (not stored twice)" if s.get("derived") else ""
        lines.append(f"  {name}: {s['dtype']}, compression {s['compression']}{derived}")
    return "\n".join(lines)


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


def _read(real: Path, fmt: str, chunks: Any, *, load: bool = True) -> xr.Dataset:
    """Open one file; with ``load`` element-sample variables stored as float32 become
    float64 again (exact: :func:`save` stores float32 only when lossless) and
    ``chunks=None`` loads everything."""
    if fmt == "netcdf":
        ds = xr.open_dataset(real, engine="h5netcdf", chunks=chunks)
    else:
        _check_zarr_complete(real)
        ds = xr.open_dataset(real, engine="zarr", chunks=chunks, consolidated=None)
    if not load:
        return ds
    wide = {}
    for name in SAMPLE_VARS:
        if name in ds.variables and ds[name].dtype == np.float32:
            var = ds[name].variable
            new = var.astype(np.float64)
            new.attrs, new.encoding = dict(var.attrs), dict(var.encoding)
            wide[name] = new
    if wide:
        ds = ds.assign(wide)
    ds = _abs_restored(ds)
    if chunks is None:
        ds = ds.load()
        ds.close()
    return ds
