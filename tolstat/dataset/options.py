"""Option objects of the collection functions (:func:`tolstat.collect`, :func:`tolstat.from_pairs`).

:class:`CollectOptions` says what is measured and recorded of each run and how the work
is shown; :class:`Store` says where and how :func:`tolstat.collect` streams its runs
(``collect(..., store=Store(...))``). Both validate their fields when made. Dataset layer:
imports only :mod:`tolstat.dataset.schema` and the base.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from tolstat.dataset.schema import DEFAULT_SAMPLE_SIZE
from tolstat._base.validate import option_object, short_repr as _short

__all__ = ["CollectOptions", "Store", "MAX_SAMPLE_SIZE"]

#: the largest ``CollectOptions.sample_size``: element-wise errors kept per run (four float64
#: sample arrays of this length are 512 MiB per run; a typo like ``10**11`` would ask for TiB)
MAX_SAMPLE_SIZE = 2**24


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {_short(value)} ({type(value).__name__})")
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive integer, got {int(value)}")


def _flag(name: str, value: Any, *, optional: bool = False) -> None:
    if isinstance(value, (bool, np.bool_)) or (optional and value is None):
        return
    allowed = "True, False or None" if optional else "True or False"
    raise TypeError(f"{name} must be {allowed}, got {_short(value)} ({type(value).__name__})")


def _mapping(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping {{name: value}} or None, got {_short(value)} "
                        f"({type(value).__name__})")


@dataclass(frozen=True)
class CollectOptions:
    """What is measured and recorded of each run, and how the work is shown.

    Passed as ``options=`` to :func:`tolstat.collect` and :func:`tolstat.from_pairs`; the
    default (``None``) is ``CollectOptions()``.

    Attributes
    ----------
    labels : mapping, optional
        Labels shared by all runs (per-run labels of :class:`~tolstat.dataset.runs.Inputs`
        or of a pair win).
    covariates : mapping, optional
        Covariates shared by all runs (per-run ones win).
    sample_size : int, default 320
        Element-wise errors kept per run, at most :data:`MAX_SAMPLE_SIZE` (``2**24``):
        every element of a shorter run; of a longer one the fit sample (a uniform draw of
        256 elements, the same for every ``sample_size`` of at least 320), the run's
        Pareto front or its hull, and uniform draws (:func:`tolstat.dataset.records.summarize_run`).
        Thresholds of every form are the same for any ``sample_size`` >= 320 (the
        scale fits read the fit sample only, run scores are exact from the front).
    rel_floor : float, optional
        Floor of the relative error's denominator (see :func:`tolstat.error_metrics`);
        default: the target dtype's smallest normal number.
    allow_nan : bool, default False
        Accept NaN in the reference (see :func:`tolstat.error_metrics`).
    magnitude : callable or "ref", optional
        Record the operator-noise statistics of :func:`tolstat.measure.noise.record_statistics`
        (``op_max``, ``op_rms``, ..., the op's invariants, and the same under the
        intermediate-store noise shape with suffix ``_mid``) as per-run variables. For
        :func:`tolstat.collect` a callable takes the reference's arguments and returns the
        op applied to the absolute inputs (float64, e.g. ``|A| @ |B|``); ``"ref"`` uses
        ``|expected|``. :func:`tolstat.from_pairs` takes only ``"ref"`` (a pair carries its
        own magnitude array). The reduction length ``K`` is the run's covariate ``K`` (1
        if absent).
    rowwise : bool, default False
        With ``magnitude``: the op works on rows along the last axis (softmax, norms,
        attention); adds the per-row statistics. With operator statistics derived from
        the inputs (``op_model``) the op's own flag is used (True for an op that is not
        row-wise is an error).
    op_model : bool, optional
        Derive each run's operator statistics (the magnitude, the reduction length as the
        covariate ``K``, the row-wise flag) from the op's own arguments with
        :func:`tolstat.ops.op_statistics`: :func:`tolstat.collect` passes the
        ``Inputs(args, kwargs)`` the kernel is called with. None (default): automatic,
        when ``magnitude`` is not given and :mod:`tolstat.ops` knows the op (an unknown op
        is collected without operator statistics, as before); True: required (an
        unknown op raises, naming :func:`tolstat.ops.register`; with ``magnitude`` a
        ``ValueError``); False: never (the plain pairs). :func:`tolstat.from_pairs`
        derives them from pairs with ``inputs``; True there requires ``inputs`` in
        every pair, False refuses them.
    progress : bool, optional
        Show a progress bar; default: only when writing to a terminal.

    Raises
    ------
    TypeError, ValueError
        A field of the wrong type or out of range (the message names the field and the value).
    """

    labels: Mapping[str, Any] | None = None
    covariates: Mapping[str, float] | None = None
    sample_size: int = DEFAULT_SAMPLE_SIZE
    rel_floor: float | None = None
    allow_nan: bool = False
    magnitude: Callable[..., Any] | str | None = None
    rowwise: bool = False
    progress: bool | None = None
    op_model: bool | None = None

    def __post_init__(self) -> None:
        _mapping("CollectOptions.labels", self.labels)
        _mapping("CollectOptions.covariates", self.covariates)
        _positive_int("CollectOptions.sample_size", self.sample_size)
        if int(self.sample_size) > MAX_SAMPLE_SIZE:
            raise ValueError(f"CollectOptions.sample_size must be at most {MAX_SAMPLE_SIZE} (2**24) elements "
                             f"per run, got {int(self.sample_size)}")
        if self.rel_floor is not None:
            if isinstance(self.rel_floor, (bool, np.bool_)) or not isinstance(
                    self.rel_floor, (int, float, np.integer, np.floating)):
                raise TypeError(f"CollectOptions.rel_floor must be a real number or None, got "
                                f"{_short(self.rel_floor)} ({type(self.rel_floor).__name__})")
            if not np.isfinite(self.rel_floor) or self.rel_floor < 0:
                raise ValueError(f"CollectOptions.rel_floor must be finite and >= 0, got {self.rel_floor}")
        _flag("CollectOptions.allow_nan", self.allow_nan)
        mag = self.magnitude
        if not (mag is None or callable(mag) or (isinstance(mag, str) and mag == "ref")):
            raise ValueError(f"CollectOptions.magnitude must be a callable, 'ref' or None, got "
                             f"{_short(self.magnitude)}")
        _flag("CollectOptions.rowwise", self.rowwise)
        _flag("CollectOptions.progress", self.progress, optional=True)
        _flag("CollectOptions.op_model", self.op_model, optional=True)


@dataclass(frozen=True)
class Store:
    """Where and how :func:`tolstat.collect` streams its runs (a zarr store, resumable).

    ``collect(..., store=path)`` is ``collect(..., store=Store(path))``. The collection
    writes every run to the store as it goes; re-running with the same arguments
    continues after the last completed run (see :mod:`tolstat.dataset.stream`).

    Attributes
    ----------
    path : str or path-like
        The zarr store (a directory ending in ``.zarr``). If it exists and was made by a
        collection with the same arguments, the collection resumes: completed runs are
        kept and only the missing ones are measured.
    chunk_runs : int, default 1024
        Chunk length along ``run`` of the run-level arrays is ``8 * chunk_runs``; the
        sample arrays use chunks of about 1 MiB (at most ``chunk_runs`` runs).
    chunks : dict, "auto" or None
        How to open the finished store (:func:`tolstat.open_errors`): ``None`` loads it
        into memory, ``{"run": N}`` returns a dask-backed dataset (use this for large
        stores).
    overwrite : bool, default False
        Delete an existing store first instead of resuming.

    Raises
    ------
    TypeError, ValueError
        A field of the wrong type or out of range, or a path that does not end in ``.zarr``.
    """

    path: str | os.PathLike[str]
    chunk_runs: int = 1024
    chunks: Any = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"Store.path must be a str or path-like, got {_short(self.path)} "
                            f"({type(self.path).__name__})")
        if Path(self.path).suffix.lower() != ".zarr":
            raise ValueError(f"Store.path must be a zarr directory ending in '.zarr', got {os.fspath(self.path)!r}")
        _positive_int("Store.chunk_runs", self.chunk_runs)
        if not (self.chunks is None or isinstance(self.chunks, (str, Mapping, int, tuple))) \
                or isinstance(self.chunks, bool):
            raise TypeError(f"Store.chunks must be None, 'auto', an int or a mapping {{dim: size}}, got "
                            f"{_short(self.chunks)} ({type(self.chunks).__name__})")
        _flag("Store.overwrite", self.overwrite)


def _options(options: Any) -> CollectOptions:
    """``options`` checked to be a :class:`CollectOptions` (``None``: the defaults)."""
    return option_object(options, CollectOptions)


def _store(store: Any) -> Store | None:
    """``store`` as a :class:`Store` (a plain path means ``Store(path)``), or None."""
    if store is None or isinstance(store, Store):
        return store
    if isinstance(store, (str, os.PathLike)):
        return Store(store)
    raise TypeError(f"store must be a path (str or path-like), a tolstat.dataset.Store or None, got "
                    f"{_short(store)} ({type(store).__name__})")
