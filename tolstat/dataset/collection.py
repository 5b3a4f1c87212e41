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
from tolstat.dataset.runs import _as_inputs, _hardware_of_runs, _merged, _name, _provenance, _record, uses_op_model
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
        ``op_model`` / ``magnitude`` / ``rowwise``, ``progress``); default
        ``CollectOptions()``. For an op :mod:`tolstat.ops` knows (``matmul``,
        ``layer_norm``, ...; the kernel's arguments are that torch function's, as
        ``make_inputs`` returns them) and no ``magnitude``, the operator statistics of
        each run (magnitude, the covariate ``K``, row-wise flag) are derived from the
        arguments the kernel is called with, so the default :func:`tolstat.select` uses
        the operator form; ``CollectOptions(op_model=False)`` opts out. An unknown op is
        collected without them.
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
        (reported with the run index); a covariate ``K`` that the op's inputs
        contradict; with ``store``, a store made with different arguments.
    KeyError
        ``CollectOptions(op_model=True)`` for an op :mod:`tolstat.ops` does not know.
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
    derive = uses_op_model(op, opts.op_model, opts.magnitude)
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
                    magnitude=mag, rowwise=opts.rowwise, op_args=(inp.args, inp.kwargs) if derive else None)
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
        ``expected`` and optionally ``inputs``, ``params``, ``labels``, ``covariates``,
        ``magnitude`` (another key is an error). Arrays may be numpy arrays, torch
        tensors, or anything with ``__array__`` / ``__dlpack__``. ``inputs`` are the
        positional arguments of the torch function named by ``op``, exactly as the kernel
        took them, ``params`` its keyword arguments (e.g. ``{"actual": y, "expected": r,
        "inputs": (x, (n,), w, b), "params": {"eps": 1e-5}}`` for ``op="layer_norm"``):
        :func:`tolstat.ops.op_statistics` derives from them the magnitude, the reduction
        length (stored as the run's covariate ``K``; a ``K`` given in ``covariates``
        must equal it) and the row-wise flag, so the operator-noise statistics of
        :func:`tolstat.measure.noise.record_statistics` are stored per run and the default
        :func:`tolstat.select` uses the operator form. An op :mod:`tolstat.ops` does not
        know raises its error (naming :func:`tolstat.ops.register`). A hand-computed
        magnitude (the op applied to the absolute inputs, see
        :func:`tolstat.measure.noise.noise_scale`) is the expert alternative; ``inputs``
        and ``magnitude`` in one pair is an error. Either every pair has operator
        statistics (inputs or a magnitude) or none, and their row-wise flags agree.
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
        No pairs, a malformed pair (an unknown key, ``params`` without ``inputs``,
        ``inputs`` with a magnitude), ``options.magnitude`` other than None or ``"ref"``
        (or ``"ref"`` with inputs), a covariate ``K`` the inputs contradict, pairs mixing
        operator statistics and none, or any error of :func:`tolstat.error_metrics`
        (reported with the pair index).
    KeyError
        ``inputs`` for an op :mod:`tolstat.ops` does not know.
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
        actual, expected, mag, lab, cov, op_args = _pair(i, item)
        if opts.op_model is not None and (op_args is not None) != opts.op_model:
            raise ValueError(f"pair {i}: CollectOptions.op_model={opts.op_model} but the pair has "
                             f"{'inputs' if op_args is not None else 'no inputs'}")
        if op_args is not None and magnitude is not None:
            raise ValueError(f"pair {i}: inputs give the operator statistics; CollectOptions.magnitude="
                             f"{magnitude!r} is for pairs without them: pass one or the other")
        if mag is None and op_args is None:
            mag = magnitude
        rng = np.random.default_rng([seed, i])
        records.append(
            _record(actual, expected, i, op=op, dtype=dt, hardware=hw, platform=plat,
                    seed=-1, labels=_merged(labels, lab), covariates=_merged(covariates, cov),
                    sample_size=opts.sample_size, rel_floor=opts.rel_floor, allow_nan=opts.allow_nan,
                    rng=rng, magnitude=mag, rowwise=opts.rowwise, op_args=op_args)
        )
    if not records:
        raise ValueError("from_pairs got no pairs")
    for i, r in enumerate(records):
        if bool(r.op_stats) != bool(records[0].op_stats):
            raise ValueError(f"pair {i} has {'no ' if not r.op_stats else ''}operator statistics but pair 0 has "
                             f"{'none' if not records[0].op_stats else 'them'}: give a magnitude for every run "
                             "or for none (inputs give one)")
    return build_dataset(records, sample_size=opts.sample_size,
                         provenance=_provenance("tolstat.from_pairs", runs=len(records)))


#: the keys of a mapping item of :func:`from_pairs`
PAIR_KEYS = ("actual", "expected", "magnitude", "labels", "covariates", "inputs", "params")


def _pair(i: int, item: Any) -> tuple[Any, Any, Any, Any, Any, tuple[Any, Any] | None]:
    """``(actual, expected, magnitude, labels, covariates, op_args)`` of pair ``i`` of
    :func:`from_pairs` (``op_args``: ``(inputs, params)`` or None)."""
    if isinstance(item, Mapping):
        unknown = sorted(str(k) for k in item if k not in PAIR_KEYS)
        if unknown:
            raise ValueError(f"pair {i}: unknown key(s) {unknown} of a mapping item (keys: {list(PAIR_KEYS)})")
        try:
            actual, expected = item["actual"], item["expected"]
        except KeyError as exc:
            raise ValueError(f"pair {i}: mapping needs keys 'actual' and 'expected'") from exc
        mag, inputs, params = item.get("magnitude"), item.get("inputs"), item.get("params")
        if inputs is None and params is not None:
            raise ValueError(f"pair {i}: 'params' needs 'inputs' (the op's positional arguments)")
        if inputs is not None and mag is not None:
            raise ValueError(f"pair {i}: give 'inputs' (the operator statistics are derived from them) or "
                             "'magnitude', not both")
        op_args = None if inputs is None else (inputs, params)
        return actual, expected, mag, item.get("labels"), item.get("covariates"), op_args
    if isinstance(item, (tuple, list)) and 2 <= len(item) <= 5:
        actual, expected, *rest = item
        mag = None
        if len(item) == 5 or (rest and rest[0] is not None and not isinstance(rest[0], Mapping)):
            mag, rest = rest[0], rest[1:]
        lab = rest[0] if len(rest) > 0 else None
        cov = rest[1] if len(rest) > 1 else None
        return actual, expected, mag, lab, cov, None
    raise TypeError(
        f"pair {i}: expected (actual, expected[, magnitude][, labels[, covariates]]) "
        f"or a mapping, got {type(item).__name__}"
    )
