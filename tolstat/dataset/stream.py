"""Streaming, resumable collection into a zarr store (for collections too large for memory).

``tolstat.collect(..., store=path)`` (or ``store=Store(path, ...)``, see
:class:`~tolstat.dataset.options.Store`) writes every run to a
zarr store (``zarr_format=2``) in blocks of consecutive runs (at most ``min(chunk_runs,
256)`` runs, or what was measured in one second), so memory stays bounded and a crash
loses at most the runs of the block in flight: re-running with the same arguments continues where
the collection stopped, without duplicating runs (a run is identified by
``(op, dtype, seed, run_index)``; run ``i`` always uses ``default_rng([seed, i])``).

Store layout
------------
The store is an ordinary error dataset (``docs/schema.md``) pre-allocated for ``runs`` runs
(the ``sample`` dimension padded to ``sample_size``), written block by block into its region.
Every zarr chunk write is atomic (write to a temporary file, rename), so a killed process
never leaves a torn chunk. Next to the arrays, the zarr sub-group ``tolstat_stream`` holds
the collection's arguments (attribute ``manifest``) and ``done.log``: one JSON line per
completed run with its string labels, appended (and fsync'ed) only after all of the block's
arrays are written. A run is done exactly when its line is in the log. When all runs are
done the store is *finalized*: string labels are written from the log, the ``sample``
dimension is trimmed as :func:`tolstat.dataset.records.build_dataset` trims it, provenance is set
and the metadata consolidated; the result opens with :func:`tolstat.open_errors` and
equals ``tolstat.collect(...)`` with the same arguments (operator statistics of
``CollectOptions(magnitude=..., rowwise=...)`` and those derived from the inputs of a
known op, ``CollectOptions.op_model``, included) except for provenance.
Finalizing is re-runnable from any point (:func:`_finalize`): label arrays are staged in
the side group and swapped in by renames, and the manifest is marked complete last, so a
collection killed while finalizing is finished by the next call.

A lock file ``.<store name>.lock`` next to the store keeps two processes from writing the
same store. Durability is against process crashes (SIGKILL, OOM, exceptions); chunk data
are not fsync'ed, so after a power loss the log may be ahead of the data.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import xarray as xr
from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from tolstat._base.dtypes import canonical_dtype
from tolstat._base.util import _tmp_path, clean_stale, remove_tree
from tolstat._base.validate import code_fingerprint
from tolstat._version import __version__
from tolstat.dataset.runs import _as_inputs, _hardware_of_runs, _merged, _name, _provenance, _record, uses_op_model
from tolstat.dataset.options import CollectOptions, Store
from tolstat.dataset.records import RunRecord, _label_value, build_dataset
from tolstat.dataset.schema import BUILTIN_COVARIATES, FINGERPRINT, FIT_SAMPLE, RUN_STATS, SAMPLE_VARS
from tolstat.dataset.io import open_errors

__all__ = ["open_store", "store_progress", "StoreProgress"]

SIDE = "tolstat_stream"
LOG = "done.log"
MANIFEST_VERSION = 1
#: manifest keys that must match for a resume
IDENTITY = ("op", "dtype", "seed", "runs", "hardware", "labels", "covariates", "sample_size",
            "rel_floor", "allow_nan", "magnitude", "rowwise", "kernel", "reference", "make_inputs",
            "kernel_code", "reference_code", "make_inputs_code", "magnitude_code", "op_model")
#: what a manifest written before a key existed means by its absence (no operator statistics)
IDENTITY_DEFAULTS: dict[str, Any] = {"magnitude": None, "rowwise": False, "magnitude_code": None,
                                     "op_model": False}
#: data variables holding operator statistics (``RunRecord.op_stats``) carry this role
OP_ROLE = "op_statistic"
STRING_LABELS = ("op", "dtype", "hardware", "platform", "shape")


@dataclass(frozen=True)
class StoreProgress:
    """State of a streaming store.

    Attributes
    ----------
    runs : int
        Runs the collection asks for.
    done : list of int
        Completed run indices, sorted.
    complete : bool
        The store is finished.
    manifest : dict
        The store's manifest (the arguments it was made with).
    """

    runs: int
    done: list[int]
    complete: bool
    manifest: dict[str, Any] = field(default_factory=dict)


def _manifest(*, op: str, dtype: str, seed: int, runs: int, hardware: str, options: CollectOptions,
              kernel: Any, reference: Any, make_inputs: Any, chunk_runs: int,
              op_model: bool = False) -> dict[str, Any]:
    o = options
    mag = o.magnitude
    return {
        "version": MANIFEST_VERSION,
        "op": str(op), "dtype": dtype, "seed": int(seed), "runs": int(runs),
        "hardware": hardware,
        "labels": {str(k): _label_value(k, v) for k, v in (o.labels or {}).items()},
        "covariates": {str(k): float(v) for k, v in (o.covariates or {}).items()},
        "sample_size": int(o.sample_size),
        "rel_floor": None if o.rel_floor is None else float(o.rel_floor),
        "allow_nan": bool(o.allow_nan),
        # the operator statistics: None, "ref" or the magnitude function's qualified name
        # (a callable object or partial: its class's; its code is compared by magnitude_code)
        "magnitude": (getattr(mag, "__qualname__", None) or type(mag).__qualname__) if callable(mag) else mag,
        "rowwise": bool(o.rowwise),
        # operator statistics derived from the inputs by tolstat.ops (CollectOptions.op_model, resolved)
        "op_model": bool(op_model),
        "kernel": _name(kernel), "reference": _name(reference), "make_inputs": _name(make_inputs),
        # identity by code, not by name: a kernel whose body changed is another kernel
        "kernel_code": code_fingerprint(kernel), "reference_code": code_fingerprint(reference),
        "make_inputs_code": code_fingerprint(make_inputs),
        "magnitude_code": code_fingerprint(mag) if callable(mag) else None,
        "chunk_runs": int(chunk_runs),
        "complete": False,
    }


@contextlib.contextmanager
def _locked(store: Path) -> Iterator[None]:
    """Hold the store's lock file (portable: ``filelock`` uses ``flock`` on POSIX and
    ``msvcrt`` on Windows); fail at once if another process holds it."""
    lock = store.with_name(f".{store.name}.lock")
    try:
        held = FileLock(os.fspath(lock), timeout=0, thread_local=False, is_singleton=False)
        held.acquire()
    except Timeout:
        raise RuntimeError(
            f"{os.fspath(store)!r} is being written by another process (lock {os.fspath(lock)!r})"
        ) from None
    try:
        yield
    finally:
        held.release()


def _zarr_group(path: Path, mode: str = "r+") -> Any:
    import zarr

    with zarr.config.set({"array.write_empty_chunks": True}):
        return zarr.open_group(str(path), mode=mode, zarr_format=2)


def _arrays(group: Any) -> dict[str, Any]:
    """The group's arrays, configured to write every chunk (also all-fill-value ones), so
    that :func:`tolstat.open_errors` finds no missing chunk."""
    import zarr

    with zarr.config.set({"array.write_empty_chunks": True}):  # zarr < 3.1.3: config at open
        arrays = dict(group.arrays())
    return {name: _write_empty(arr) for name, arr in arrays.items()}


def _write_empty(arr: Any) -> Any:
    with_config = getattr(arr, "with_config", None)
    return with_config({"write_empty_chunks": True}) if with_config is not None else arr


def _read_manifest(store: Path) -> dict[str, Any]:
    try:
        g = _zarr_group(store / SIDE, mode="r")
        return dict(g.attrs["manifest"])
    except Exception as exc:
        raise ValueError(
            f"{os.fspath(store)!r} exists but is not a tolstat streaming store (no readable "
            f"'{SIDE}' manifest: {type(exc).__name__}: {exc}); remove it or pass overwrite=True"
        ) from exc


def _write_manifest(store: Path, manifest: Mapping[str, Any]) -> None:
    g = _zarr_group(store / SIDE, mode="a")
    g.attrs["manifest"] = dict(manifest)


def _read_log(store: Path) -> dict[int, dict[str, str]]:
    """Completed runs -> their string labels. A torn last line (crash mid-append) is ignored."""
    p = store / SIDE / LOG
    out: dict[int, dict[str, str]] = {}
    if not p.exists():
        return out
    with open(p, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
                out[int(rec["i"])] = {str(k): str(v) for k, v in rec["labels"].items()}
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _append_log(store: Path, done: list[tuple[int, Mapping[str, str]]]) -> None:
    """Append one line per completed run (after its data are written) and fsync once."""
    text = "".join(json.dumps({"i": int(i), "labels": dict(lab)}, separators=(",", ":")) + "\n"
                   for i, lab in done)
    p = store / SIDE / LOG
    with open(p, "rb+" if p.exists() else "wb") as fh:
        # a torn line left by a crash is terminated first, so that it stays unparseable alone
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write(text.encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def _string_labels(rec: RunRecord) -> dict[str, str]:
    out = {name: str(getattr(rec, name)) for name in STRING_LABELS}
    out.update(rec.labels)
    return out


def _dims(arr: Any) -> list[str]:
    return list(arr.attrs.get("_ARRAY_DIMENSIONS", []))


def _create_store(store: Path, rec0: RunRecord, manifest: dict[str, Any]) -> None:
    """Write the pre-allocated store (template from run 0) atomically: tmp dir, then rename."""
    runs = manifest["runs"]
    size = manifest["sample_size"]
    crun = manifest["chunk_runs"]
    ds = build_dataset([rec0], sample_size=size)
    k0 = ds.sizes["sample"]
    if k0 < size:
        ds = ds.pad(sample=(0, size - k0), constant_values=np.nan)
        for name in SAMPLE_VARS:  # pad() drops nothing but keep attrs explicit
            ds[name].attrs = build_dataset([rec0], sample_size=size)[name].attrs
    # chunks: sample arrays ~1 MiB per chunk, run-level arrays chunk_runs * 8 runs
    srun = max(1, min(crun, (1 << 20) // (8 * size)))
    enc: dict[str, dict[str, Any]] = {}
    for name, var in ds.variables.items():
        if var.dims and var.dims[0] == "run":
            first = srun if "sample" in var.dims else min(runs, 8 * crun)
            enc[str(name)] = {"chunks": (first,) + tuple(var.shape[1:])}
    clean_stale(store)  # pre-allocated copies of killed creators
    tmp = _tmp_path(store)
    try:
        ds.to_zarr(tmp, mode="w-", zarr_format=2, consolidated=False, encoding=enc,
                   write_empty_chunks=True)
        g = _zarr_group(tmp)
        for _, arr in g.arrays():
            if _dims(arr)[:1] == ["run"]:
                arr.resize((runs,) + tuple(arr.shape[1:]))
        _write_manifest(tmp, manifest)
        (tmp / SIDE / LOG).touch()
        os.replace(tmp, store)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_run(i: int, rec: RunRecord, size: int, label_keys: list[str], cov_keys: list[str],
               op_keys: list[str]) -> None:
    if set(rec.op_stats) != set(op_keys):
        raise ValueError(f"run {i} has operator statistics {sorted(rec.op_stats)} but the store has "
                         f"{sorted(op_keys)}: give a magnitude for every run or for none (inputs give one)")
    if set(rec.labels) != set(label_keys):
        raise ValueError(f"run {i} has labels {sorted(rec.labels)} but the store has "
                         f"{sorted(label_keys)}: every run of a dataset needs the same label names")
    if set(rec.covariates) != set(cov_keys):
        raise ValueError(f"run {i} has covariates {sorted(rec.covariates)} but the store has "
                         f"{sorted(cov_keys)}: every run needs the same covariates")
    n = len(rec.samples["sample_abs"])
    if n > size:
        raise ValueError(f"run {i} has {n} samples, more than sample_size={size}")


def _write_block(arrays: Mapping[str, Any], block: list[tuple[int, RunRecord]], size: int,
                 cov_keys: list[str], op_keys: list[str]) -> None:
    """Write consecutive runs ``block`` (checked by :func:`_check_run`) with one zarr write per array."""
    i0, m = block[0][0], len(block)
    recs = [r for _, r in block]
    sl = slice(i0, i0 + m)
    for name in SAMPLE_VARS:
        rows = np.full((m, size), np.nan)
        for j, rec in enumerate(recs):
            v = rec.samples[name]
            rows[j, :len(v)] = v
        arrays[name][sl, :] = rows
    arrays["abs_quantile"][sl, :] = np.stack([np.asarray(r.quantiles) for r in recs])
    for name in RUN_STATS:
        arrays[name][sl] = np.array([r.stats[name] for r in recs])
    for name in cov_keys:
        arrays[name][sl] = np.array([r.covariates[name] for r in recs])
    for name in op_keys:
        arrays[name][sl] = np.array([r.op_stats[name] for r in recs], dtype=np.float64)
    if FINGERPRINT in arrays:
        arrays[FINGERPRINT][sl] = np.array([r.ref_fingerprint for r in recs], dtype=np.int64)
    arrays["n_sample"][sl] = np.array([len(r.samples["sample_abs"]) for r in recs])
    if FIT_SAMPLE in arrays:
        arrays[FIT_SAMPLE][sl] = np.array([len(r.samples["sample_abs"]) if r.n_fit is None else r.n_fit
                                           for r in recs], dtype=np.int64)
    arrays["seed"][sl] = np.array([r.seed for r in recs])
    arrays["run_index"][sl] = np.array([r.run_index for r in recs])


#: folder of the side group where :func:`_finalize` stages rewritten label arrays (not a zarr node)
STAGE = "finalize"


def _label_is(path: Path, values: np.ndarray) -> bool:
    """True if ``path`` is a complete zarr array holding exactly the final label ``values``."""
    import zarr

    try:
        arr = zarr.open_array(str(path), mode="r", zarr_format=2)
        return (dict(arr.attrs) == {"_ARRAY_DIMENSIONS": ["run"]} and arr.dtype == values.dtype
                and arr.shape == values.shape and arr.nchunks_initialized == arr.nchunks
                and bool(np.array_equal(np.asarray(arr[:]), values)))
    except Exception:  # absent, torn or foreign: not final
        return False


def _replace_label(store: Path, name: str, values: np.ndarray, chunks: tuple[int, ...]) -> None:
    """Make the store's array ``name`` hold ``values``, re-runnable from any crash.

    The new array is written in full to ``SIDE/finalize/<name>``; the old one is renamed
    away to ``SIDE/finalize/<name>.old`` and the new one renamed into place (two
    renames; the store's node is the old array, absent, or the new complete one, never
    torn), then the old one is deleted. A re-run after a crash at any step finds the
    final array in place (nothing to do) or writes the staged copy again.
    """
    import zarr

    dest = store / name
    stage_dir = store / SIDE / STAGE
    stage, old = stage_dir / name, stage_dir / f"{name}.old"
    if not _label_is(dest, values):
        remove_tree(stage)  # a copy staged by a killed run may be torn
        stage_dir.mkdir(parents=True, exist_ok=True)
        with zarr.config.set({"array.write_empty_chunks": True}):
            new = zarr.create_array(str(stage), shape=values.shape, dtype=values.dtype, chunks=chunks,
                                    zarr_format=2, attributes={"_ARRAY_DIMENSIONS": ["run"]})
            _write_empty(new)[:] = values
        if dest.exists():
            remove_tree(old)
            os.replace(dest, old)
        os.replace(stage, dest)
    remove_tree(old)


def _finalize(store: Path, manifest: dict[str, Any], log: Mapping[int, Mapping[str, str]]) -> None:
    """Labels from the log, trim ``sample``, provenance, consolidate; mark the manifest complete.

    Idempotent and resumable: every step either is done already (and is skipped) or can
    be done again, from whatever a crash at any point left (the log, the source of every
    label, is never changed). Labels are swapped in by :func:`_replace_label`; the
    manifest is marked complete last, so an interrupted finalize is redone by the next
    ``collect`` with the same arguments.
    """
    import zarr

    runs = manifest["runs"]
    g = _zarr_group(store)
    label_names = [x for x in str(g.attrs.get("labels", "")).split(",") if x]
    # the pre-allocated arrays' chunking along run (_create_store)
    chunks = (min(runs, 8 * int(manifest.get("chunk_runs", Store.chunk_runs))),)
    for name in list(STRING_LABELS) + label_names:
        values = np.array([log[i][name] for i in range(runs)], dtype=str)
        _replace_label(store, name, values, chunks)
    remove_tree(store / SIDE / STAGE)
    arrays = _arrays(_zarr_group(store))
    n_sample = np.asarray(arrays["n_sample"][:])
    k = min(int(manifest["sample_size"]), max(int(n_sample.max()), 1))
    for name in SAMPLE_VARS:
        arr = arrays[name]
        if arr.shape[1] != k:
            arr.resize((runs, k))
    prov = {"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "tolstat_version": __version__}
    prov.update(_provenance("tolstat.collect", kernel=manifest["kernel"],
                            reference=manifest["reference"], seed=manifest["seed"],
                            runs=runs, store=os.fspath(store), streamed=True))
    g.attrs["provenance"] = json.dumps([prov])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # done.log is not a zarr node
        zarr.consolidate_metadata(str(store), zarr_format=2)
    manifest = dict(manifest, complete=True)
    _write_manifest(store, manifest)


def _clean_partials(store: Path) -> None:
    """Remove temporary chunk files of writes interrupted by a crash."""
    for p in store.rglob("*.partial"):
        with contextlib.suppress(OSError):
            p.unlink()


def _collect_to_store(
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    make_inputs: Callable[[np.random.Generator], Any],
    *,
    op: str,
    dtype: Any,
    runs: int,
    store: Store,
    hardware: str | None,
    seed: int,
    options: CollectOptions,
) -> xr.Dataset:
    """``tolstat.collect(..., store=store)``: stream every run to a resumable zarr store.

    Parameters
    ----------
    kernel, reference, make_inputs, op, dtype, runs, hardware, seed, options
        As in :func:`tolstat.collect` (run ``i`` uses ``numpy.random.default_rng([seed, i])``,
        so the store equals the in-memory collection, operator statistics included).
    store : Store
        The zarr store and how it is written and opened
        (:class:`~tolstat.dataset.options.Store`). If it exists and was made with the
        same arguments, the collection resumes: completed runs are kept and only the
        missing ones are measured.

    Returns
    -------
    xarray.Dataset
        The finished error dataset, opened from the store (``store.chunks``).

    Raises
    ------
    ValueError
        The store exists but was made with different arguments (the message lists them),
        is not a streaming store, or any error of :func:`tolstat.collect`. Runs finished
        before an error stay in the store; re-running continues after them.
    RuntimeError
        Another process is writing the same store.
    """
    path = _check_store_args(kernel, reference, make_inputs, runs, store)
    o = options
    dt = canonical_dtype(dtype)
    hw, plat = _hardware_of_runs(hardware)
    runs = int(runs)
    derive = uses_op_model(op, o.op_model, o.magnitude)
    manifest = _manifest(op=op, dtype=dt, seed=seed, runs=runs, hardware=hw, options=o, kernel=kernel,
                         reference=reference, make_inputs=make_inputs, chunk_runs=store.chunk_runs,
                         op_model=derive)

    def measure(i: int) -> RunRecord:
        rng = np.random.default_rng([seed, i])
        inp = _as_inputs(make_inputs(rng))
        actual = kernel(*inp.args, **inp.kwargs)
        expected = reference(*inp.args, **inp.kwargs)
        mag = o.magnitude(*inp.args, **inp.kwargs) if callable(o.magnitude) else o.magnitude
        return _record(actual, expected, i, op=op, dtype=dt, hardware=hw, platform=plat,
                       seed=seed, labels=_merged(o.labels, inp.labels),
                       covariates=_merged(o.covariates, inp.covariates), sample_size=o.sample_size,
                       rel_floor=o.rel_floor, allow_nan=o.allow_nan, rng=rng,
                       magnitude=mag, rowwise=o.rowwise, op_args=(inp.args, inp.kwargs) if derive else None)

    with _locked(path):
        manifest, first = _open_or_create(path, manifest, bool(store.overwrite), measure)
        log = _read_log(path)
        if not manifest.get("complete"):
            todo = [i for i in range(runs) if i not in log]
            if todo:
                disable = None if o.progress is None else not o.progress
                bar = tqdm(todo, desc=f"collect {op}/{dt} -> {path.name}", disable=disable, leave=False)
                _write_runs(path, manifest, log, bar, first, measure)
            _finalize(path, manifest, log)
    return open_errors(path, chunks=store.chunks)


def _check_store_args(kernel: Any, reference: Any, make_inputs: Any, runs: Any, store: Store) -> Path:
    """Validate the arguments of a streaming collection; the store path."""
    if not isinstance(runs, (int, np.integer)) or runs < 1:
        raise ValueError(f"runs must be a positive integer, got {runs!r}")
    for nm, f in (("kernel", kernel), ("reference", reference), ("make_inputs", make_inputs)):
        if not callable(f):
            raise TypeError(f"{nm} must be callable, got {type(f).__name__}")
    path = Path(store.path)
    if not path.parent.exists():
        raise FileNotFoundError(f"directory {os.fspath(path.parent)!r} does not exist")
    return path


def _open_or_create(path: Path, manifest: dict[str, Any], overwrite: bool,
                    measure: Callable[[int], RunRecord]) -> tuple[dict[str, Any], RunRecord | None]:
    """Resume a store made with the same arguments, or create it from run 0 (returned)."""
    if overwrite and (path.exists() or path.is_symlink()):
        remove_tree(path)
    if path.exists():
        old = _read_manifest(path)
        was = {key: old.get(key, IDENTITY_DEFAULTS.get(key)) for key in IDENTITY}
        diff = [(f"{key[:-5]}: the code of {manifest[key[:-5]]!r} differs from the one the store "
                 f"was collected with (code hash {was[key]!r} vs {manifest[key]!r})")
                if key.endswith("_code") else f"{key}: store has {was[key]!r}, call has {manifest[key]!r}"
                for key in IDENTITY if was[key] != manifest[key]]
        if diff:
            raise ValueError(
                f"store {os.fspath(path)!r} was made with different arguments; resuming "
                "would mix collections. Use another store or overwrite=True. Differences: "
                + "; ".join(diff)
            )
        _clean_partials(path)
        return old, None
    first = measure(0)
    _create_store(path, first, manifest)
    return manifest, first


#: runs measured before one block write (at most ``chunk_runs``), and the longest a
#: measured run waits for its write: a crash loses at most the runs of one block
BLOCK_RUNS = 256
FLUSH_SECONDS = 1.0


def _write_runs(path: Path, manifest: Mapping[str, Any], log: dict[int, dict[str, str]], todo: Any,
                first: RunRecord | None, measure: Callable[[int], RunRecord]) -> None:
    """Measure the runs ``todo`` (run 0 may already be measured: ``first``) and write them
    in blocks of consecutive runs: one zarr write per array and one log append (fsync'ed
    after the data) per block. Runs measured before an exception are written first."""
    g = _zarr_group(path)
    arrays = _arrays(g)
    label_keys = [x for x in str(g.attrs.get("labels", "")).split(",") if x]
    cov_keys = [x for x in str(g.attrs.get("covariates", "")).split(",") if x
                and x not in BUILTIN_COVARIATES]
    op_keys = [name for name, arr in arrays.items() if arr.attrs.get("role") == OP_ROLE]
    size = int(manifest["sample_size"])
    limit = max(1, min(BLOCK_RUNS, int(manifest.get("chunk_runs", BLOCK_RUNS))))
    buf: list[tuple[int, RunRecord]] = []
    last = time.monotonic()

    def flush() -> None:
        start = 0
        for k in range(1, len(buf) + 1):  # consecutive run indices share one write
            if k == len(buf) or buf[k][0] != buf[k - 1][0] + 1:
                _write_block(arrays, buf[start:k], size, cov_keys, op_keys)
                start = k
        labs = [(i, _string_labels(rec)) for i, rec in buf]
        _append_log(path, labs)
        log.update(labs)
        buf.clear()

    try:
        for i in todo:
            rec = first if (i == 0 and first is not None) else measure(i)
            _check_run(i, rec, size, label_keys, cov_keys, op_keys)
            buf.append((i, rec))
            if len(buf) >= limit or time.monotonic() - last >= FLUSH_SECONDS:
                flush()
                last = time.monotonic()
    finally:
        if buf:
            flush()


def store_progress(store: str | os.PathLike[str]) -> StoreProgress:
    """How far a streaming collection got (:class:`StoreProgress`)."""
    path = Path(store)
    if not path.exists():
        raise FileNotFoundError(f"no store at {os.fspath(path)!r}")
    manifest = _read_manifest(path)
    done = sorted(_read_log(path))
    return StoreProgress(runs=manifest["runs"], done=done,
                         complete=bool(manifest.get("complete")), manifest=manifest)


def open_store(store: str | os.PathLike[str], *, chunks: Any = None, partial: bool = False) -> xr.Dataset:
    """Open a streaming store; with ``partial=True`` also an unfinished one (done runs only).

    Parameters
    ----------
    store : str or path-like
        A store written by ``tolstat.collect(..., store=...)``.
    chunks : dict, "auto" or None
        As in :func:`tolstat.open_errors`.
    partial : bool, default False
        Return the completed runs of an unfinished collection (in run order, ``sample``
        trimmed, labels from the log) instead of raising.

    Raises
    ------
    ValueError
        The collection is unfinished and ``partial`` is False, or no run is done yet.
    """
    prog = store_progress(store)
    path = Path(store)
    if prog.complete:
        return open_errors(path, chunks=chunks)
    if not partial:
        raise ValueError(
            f"collection in {os.fspath(path)!r} is unfinished ({len(prog.done)} of "
            f"{prog.runs} runs done): re-run collect(..., store=...) with the same arguments to "
            "finish it, or pass partial=True"
        )
    if not prog.done:
        raise ValueError(f"no run of {os.fspath(path)!r} is done yet")
    log = _read_log(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_dataset(path, engine="zarr", consolidated=False, chunks=chunks)
    done = np.asarray(prog.done)
    ds = ds.isel(run=done)
    names = list(STRING_LABELS) + [x for x in str(ds.attrs.get("labels", "")).split(",") if x]
    ds = ds.assign_coords({n: ("run", np.array([log[int(i)][n] for i in done], dtype=str)) for n in names})
    k = min(int(prog.manifest["sample_size"]), max(int(ds["n_sample"].max()), 1))
    ds = ds.isel(sample=slice(0, k))
    return ds if chunks is not None else ds.load()
