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
from tolstat.dataset.runs import _as_inputs, _hardware_of_runs, _merged, _name, _provenance, _record
from tolstat.dataset.records import RunRecord, build_dataset
from tolstat.dataset.options import CollectOptions, Store, _options, _store
from tolstat.dataset.stream import _collect_to_store

__all__ = ["collect", "from_pairs"]


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
    options: CollectOptions | None = None,
    store: str | os.PathLike[str] | Store | None = None,
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
        Hardware label; default: :func:`~tolstat.dataset.runs.hardware_fingerprint`.
    seed : int, default 0
        Base seed of the input generator and of the element sampling.
    options : CollectOptions, optional
        What is measured and recorded of each run and how the work is shown
        (:class:`~tolstat.dataset.options.CollectOptions`: shared labels and covariates,
        ``sample_size``, ``rel_floor``, ``allow_nan``, the operator statistics
        ``magnitude`` / ``rowwise``, ``progress``); default ``CollectOptions()``.
    store : str, path-like or Store, optional
        Stream the runs to this zarr store (``.zarr``) instead of keeping them in memory;
        a plain path means ``Store(path)`` (:class:`~tolstat.dataset.options.Store` sets
        ``chunk_runs``, how the finished store is opened, ``chunks``, and ``overwrite``).
        The collection is resumable: re-running with the same arguments continues after
        the last completed run (see :mod:`tolstat.dataset.stream`). Everything of
        ``options`` is supported, operator statistics included; the result equals the
        in-memory collection except for provenance.

    Returns
    -------
    xarray.Dataset
        An error dataset with ``runs`` runs.

    Raises
    ------
    ValueError
        ``runs < 1``, unknown dtype, or any error of :func:`tolstat.error_metrics`
        (reported with the run index); with ``store``, a store made with different
        arguments.
    TypeError
        ``options`` is not a :class:`~tolstat.dataset.options.CollectOptions`, ``store``
        not a path or :class:`~tolstat.dataset.options.Store`, or a non-callable kernel.

    Examples
    --------
    >>> import numpy as np, tolstat
    >>> ds = tolstat.collect(lambda x: x.astype(np.float16), lambda x: x.astype(np.float64),
    ...                      lambda rng: rng.standard_normal(64), op="copy", dtype="float16",
    ...                      runs=3, options=tolstat.CollectOptions(sample_size=16, progress=False))
    >>> ds.sizes["run"]
    3
    """
    opts = _options(options)
    st = _store(store)
    if st is not None:
        return _collect_to_store(kernel, reference, make_inputs, op=op, dtype=dtype, runs=runs,
                                 store=st, hardware=hardware, seed=seed, options=opts)
    if not isinstance(runs, (int, np.integer)) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    for nm, f in (("kernel", kernel), ("reference", reference), ("make_inputs", make_inputs)):
        if not callable(f):
            raise TypeError(f"{nm} must be callable, got {type(f).__name__}")
    dt = canonical_dtype(dtype)
    hw, plat = _hardware_of_runs(hardware)
    records: list[RunRecord] = []
    disable = None if opts.progress is None else not opts.progress
    for i in tqdm(range(int(runs)), desc=f"collect {op}/{dt}", disable=disable, leave=False):
        rng = np.random.default_rng([seed, i])
        inp = _as_inputs(make_inputs(rng))
        actual = kernel(*inp.args, **inp.kwargs)
        expected = reference(*inp.args, **inp.kwargs)
        cov = _merged(opts.covariates, inp.covariates)
        mag = opts.magnitude(*inp.args, **inp.kwargs) if callable(opts.magnitude) else opts.magnitude
        records.append(
            _record(actual, expected, i, op=op, dtype=dt, hardware=hw, platform=plat,
                    seed=seed, labels=_merged(opts.labels, inp.labels),
                    covariates=cov, sample_size=opts.sample_size,
                    rel_floor=opts.rel_floor, allow_nan=opts.allow_nan, rng=rng,
                    magnitude=mag, rowwise=opts.rowwise)
        )
    return build_dataset(
        records,
        sample_size=opts.sample_size,
        provenance=_provenance("tolstat.collect", kernel=_name(kernel),
                               reference=_name(reference), seed=seed, runs=int(runs)),
    )


def from_pairs(
    pairs: Iterable[Any],
    *,
    op: str,
    dtype: Any,
    hardware: str | None = None,
    seed: int = 0,
    options: CollectOptions | None = None,
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
    op, dtype, hardware
        As in :func:`collect`.
    seed : int, default 0
        Seed of the element sampling (run ``i`` uses ``default_rng([seed, i])``).
    options : CollectOptions, optional
        As in :func:`collect`, except that ``options.magnitude`` may only be ``"ref"``:
        store the operator-noise statistics for pairs without a magnitude array too,
        with ``m = |expected|``.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    ValueError
        No pairs, a malformed pair, ``options.magnitude`` other than None or ``"ref"``, or
        any error of :func:`tolstat.error_metrics` (reported with the pair index).
    TypeError
        ``options`` is not a :class:`~tolstat.dataset.options.CollectOptions`.
    """
    opts = _options(options)
    magnitude, labels, covariates = opts.magnitude, opts.labels, opts.covariates
    if magnitude not in (None, "ref"):
        raise ValueError(f"from_pairs: CollectOptions.magnitude must be None or 'ref' (a pair carries its "
                         f"own magnitude array), got {magnitude!r}")
    dt = canonical_dtype(dtype)
    hw, plat = _hardware_of_runs(hardware)
    records: list[RunRecord] = []
    disable = None if opts.progress is None else not opts.progress
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
                    sample_size=opts.sample_size, rel_floor=opts.rel_floor, allow_nan=opts.allow_nan,
                    rng=rng, magnitude=mag, rowwise=opts.rowwise)
        )
    if not records:
        raise ValueError("from_pairs got no pairs")
    return build_dataset(records, sample_size=opts.sample_size,
                         provenance=_provenance("tolstat.from_pairs", runs=len(records)))
