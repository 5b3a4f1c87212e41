"""Collect error datasets: run kernels against float64 references, or wrap outputs.

Step between metrics and the error dataset: :func:`collect` runs a kernel and its
reference on generated inputs; :func:`from_pairs` takes outputs the user already has.
Both return an error dataset (``docs/schema.md``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from tolstat._base.dtypes import canonical_dtype
from tolstat.dataset.runs import _as_inputs, _merged, _name, _provenance, _record, hardware_fingerprint
from tolstat.dataset.records import RunRecord, build_dataset
from tolstat.dataset.schema import DEFAULT_SAMPLE_SIZE
from tolstat.dataset.stream import collect_to_store

__all__ = ["collect", "from_pairs", "hardware_fingerprint"]


def collect(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[np.random.Generator], Any],
    *,
    op: str,
    dtype: Any,
    runs: int,
    hardware: str | None = None,
    seed: int = 0,
    labels: Mapping[str, Any] | None = None,
    covariates: Mapping[str, float] | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    rel_floor: float | None = None,
    allow_nan: bool = False,
    progress: bool | None = None,
    store: str | os.PathLike[str] | None = None,
    chunks: Any = None,
    magnitude: Callable[..., Any] | str | None = None,
    rowwise: bool = False,
) -> xr.Dataset:
    """Run a kernel and its float64 reference on generated inputs; return the errors.

    Parameters
    ----------
    kernel : callable
        The kernel under calibration; called as ``kernel(*args, **kwargs)``.
    reference : callable
        Its float64 reference, called with the same arguments.
    make_inputs : callable
        ``make_inputs(rng)`` returns the inputs of one run: a tuple (positional args),
        a dict (keyword args), an :class:`~tolstat.dataset.runs.Inputs` (with per-run labels and covariates),
        or a single argument. ``rng`` is ``numpy.random.default_rng([seed, i])`` for
        run ``i``, so a run is reproducible on its own.
    op : str
        Operator name.
    dtype : str or dtype
        Target dtype of the kernel output (ULPs are counted in it).
    runs : int
        Number of runs.
    hardware : str, optional
        Hardware label; default: :func:`hardware_fingerprint`.
    seed : int, default 0
        Base seed of the input generator and of the element sampling.
    labels, covariates : dict, optional
        Labels / covariates shared by all runs (per-run ones from :class:`~tolstat.dataset.runs.Inputs` win).
    sample_size : int, default 4096
        Element-wise errors kept per run.
    rel_floor, allow_nan
        See :func:`tolstat.error_metrics`.
    progress : bool, optional
        Show a progress bar; default: only when writing to a terminal.
    store : str or path-like, optional
        Stream the runs to this zarr store (``.zarr``) instead of keeping them in memory;
        the collection is resumable: re-running with the same arguments continues after
        the last completed run (see :func:`tolstat.dataset.stream.collect_to_store`).
    chunks : dict, "auto" or None
        With ``store``: how to open the finished store (``None`` loads it into memory,
        ``{"run": N}`` returns a dask-backed dataset).
    magnitude : callable or "ref", optional
        Record the operator-noise statistics of :func:`tolstat.measure.noise.record_statistics`
        (``op_max``, ``op_rms``, ..., the op's invariants, and the same under the
        intermediate-store noise shape with suffix ``_mid``) as per-run variables.
        A callable takes the reference's arguments and returns the op applied to the
        absolute inputs (float64, e.g. ``|A| @ |B|``); ``"ref"`` uses ``|expected|``.
        The reduction length ``K`` is the run's covariate ``K`` (1 if absent). Not
        supported with ``store``.
    rowwise : bool, default False
        With ``magnitude``: the op works on rows along the last axis (softmax, norms,
        attention); adds the per-row statistics.

    Returns
    -------
    xarray.Dataset
        An error dataset with ``runs`` runs.

    Raises
    ------
    ValueError
        ``runs < 1``, unknown dtype, or any error of :func:`tolstat.error_metrics`
        (reported with the run index).
    """
    if store is not None and magnitude is not None:
        raise ValueError("magnitude (operator statistics) is not supported with store=...")
    if store is not None:
        return collect_to_store(kernel, reference, make_inputs, op=op, dtype=dtype, runs=runs,
                                store=store, hardware=hardware, seed=seed, labels=labels,
                                covariates=covariates, sample_size=sample_size,
                                rel_floor=rel_floor, allow_nan=allow_nan, progress=progress,
                                chunks=chunks)
    if not isinstance(runs, (int, np.integer)) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    for nm, f in (("kernel", kernel), ("reference", reference), ("make_inputs", make_inputs)):
        if not callable(f):
            raise TypeError(f"{nm} must be callable, got {type(f).__name__}")
    dt = canonical_dtype(dtype)
    found = hardware_fingerprint()
    hw_label, plat = found.label, found.platform
    hw = hw_label if hardware is None else str(hardware)
    records: list[RunRecord] = []
    disable = None if progress is None else not progress
    for i in tqdm(range(int(runs)), desc=f"collect {op}/{dt}", disable=disable, leave=False):
        rng = np.random.default_rng([seed, i])
        inp = _as_inputs(make_inputs(rng))
        actual = kernel(*inp.args, **inp.kwargs)
        expected = reference(*inp.args, **inp.kwargs)
        cov = _merged(covariates, inp.covariates)
        mag = magnitude(*inp.args, **inp.kwargs) if callable(magnitude) else magnitude
        records.append(
            _record(actual, expected, i, op=op, dtype=dt, hardware=hw, platform=plat,
                    seed=seed, labels=_merged(labels, inp.labels),
                    covariates=cov, sample_size=sample_size,
                    rel_floor=rel_floor, allow_nan=allow_nan, rng=rng,
                    magnitude=mag, rowwise=rowwise)
        )
    return build_dataset(
        records,
        sample_size=sample_size,
        provenance=_provenance("tolstat.collect", kernel=_name(kernel),
                               reference=_name(reference), seed=seed, runs=int(runs)),
    )


def from_pairs(
    pairs: Iterable[Any],
    *,
    op: str,
    dtype: Any,
    hardware: str | None = None,
    labels: Mapping[str, Any] | None = None,
    covariates: Mapping[str, float] | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
    rel_floor: float | None = None,
    allow_nan: bool = False,
    progress: bool | None = None,
    magnitude: str | None = None,
    rowwise: bool = False,
) -> xr.Dataset:
    """Build an error dataset from (actual, expected) outputs the user already has.

    Parameters
    ----------
    pairs : iterable
        Each item is ``(actual, expected)``, ``(actual, expected, labels)``,
        ``(actual, expected, labels, covariates)``, the same with a magnitude array
        third: ``(actual, expected, magnitude[, labels[, covariates]])`` (a third item
        that is not a mapping is a magnitude), or a mapping with keys ``actual``,
        ``expected`` and optionally ``magnitude``, ``labels``, ``covariates``. Arrays may
        be numpy arrays, torch tensors, or anything with ``__array__`` / ``__dlpack__``.
        The magnitude is the op applied to the absolute inputs (see
        :func:`tolstat.measure.noise.noise_scale`); with it, the operator-noise statistics of
        :func:`tolstat.measure.noise.record_statistics` are stored per run. Either every pair has a
        magnitude or none.
    op, dtype, hardware, labels, covariates, sample_size, rel_floor, allow_nan, progress
        As in :func:`collect`.
    seed : int, default 0
        Seed of the element sampling (run ``i`` uses ``default_rng([seed, i])``).
    magnitude : "ref", optional
        ``"ref"``: store the operator-noise statistics for pairs without a magnitude
        array too, with ``m = |expected|``.
    rowwise : bool, default False
        As in :func:`collect`.

    Returns
    -------
    xarray.Dataset
    """
    if magnitude not in (None, "ref"):
        raise ValueError(f"magnitude must be None or 'ref', got {magnitude!r}")
    dt = canonical_dtype(dtype)
    found = hardware_fingerprint()
    hw_label, plat = found.label, found.platform
    hw = hw_label if hardware is None else str(hardware)
    records: list[RunRecord] = []
    disable = None if progress is None else not progress
    for i, item in enumerate(tqdm(pairs, desc=f"from_pairs {op}/{dt}", disable=disable, leave=False)):
        if isinstance(item, Mapping):
            try:
                actual, expected = item["actual"], item["expected"]
            except KeyError as exc:
                raise ValueError(f"pair {i}: mapping needs keys 'actual' and 'expected'") from exc
            lab, cov = item.get("labels"), item.get("covariates")
            mag = item.get("magnitude")
        elif isinstance(item, (tuple, list)) and 2 <= len(item) <= 5:
            actual, expected, *rest = item
            mag = None
            if len(item) == 5 or (rest and rest[0] is not None
                                  and not isinstance(rest[0], Mapping)):
                mag, rest = rest[0], rest[1:]
            lab = rest[0] if len(rest) > 0 else None
            cov = rest[1] if len(rest) > 1 else None
        else:
            raise TypeError(
                f"pair {i}: expected (actual, expected[, magnitude][, labels[, covariates]]) "
                f"or a mapping, got {type(item).__name__}"
            )
        if mag is None:
            mag = magnitude
        rng = np.random.default_rng([seed, i])
        records.append(
            _record(actual, expected, i, op=op, dtype=dt, hardware=hw, platform=plat,
                    seed=-1, labels=_merged(labels, lab), covariates=_merged(covariates, cov),
                    sample_size=sample_size, rel_floor=rel_floor, allow_nan=allow_nan, rng=rng,
                    magnitude=mag, rowwise=rowwise)
        )
    if not records:
        raise ValueError("from_pairs got no pairs")
    return build_dataset(records, sample_size=sample_size,
                         provenance=_provenance("tolstat.from_pairs", runs=len(records)))
