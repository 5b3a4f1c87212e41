"""Record parts of the pytest plugin: passing checks appended as they are made, merged at the end.

A part file (one per xdist worker, or per session) is one JSON header line, then one
frame per record, appended in one write as each check passes, then an end frame when its
writer finished normally. :func:`merge_parts` (``tolstat merge-parts PARTS RECORD``)
merges the complete parts of a folder into the record file (one atomic write) and names
what it could not read. Used by :mod:`tolstat.checks.pytest_plugin`; independent of pytest.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["merge_parts", "PartsMerge"]


# ----------------------------------------------------------------------- record parts
# A part file: one JSON header line, then one frame per record, appended in one write as
# each check passes, then an end frame when its writer finished normally. A frame is
# ``_FRAME`` (magic, JSON length, array-bytes length, CRC-32) + the JSON (the record's
# fields, arrays named by dtype, shape and byte offset) + the arrays' raw bytes: exact, and
# cheap to write and read. A frame cut short by a crash fails its length or CRC check.
_PART_SUFFIX = ".part"
_PART_FORMAT = "tolstat-record-part"
_PART_VERSION = 1
#: a frame: magic, the lengths of its JSON and of its array bytes, the CRC-32 of both
_FRAME = struct.Struct("<4sIQI")
_MAGIC = b"TSR1"


def _new_parts_folder(record_path: str | os.PathLike[str]) -> Path:
    """Create a new hidden parts folder next to the record path and return it."""
    p = Path(record_path).resolve()
    d = p.parent / f".{p.name}.parts-{uuid.uuid4().hex[:8]}"
    os.makedirs(d)
    return d


def _merge_command(parts_dir: str | os.PathLike[str], record_path: str | os.PathLike[str]) -> str:
    """The shell command that merges a parts folder left behind into the record file."""
    import shlex

    return (f"tolstat merge-parts {shlex.quote(os.fspath(parts_dir))} "
            f"{shlex.quote(os.fspath(record_path))}")


def _json_default(v: Any) -> Any:
    import numpy as np

    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot write a {type(v).__name__} into a record part")


def _frame(meta: Mapping[str, Any], arrays: Sequence[Any] = ()) -> bytes:
    """One frame: ``meta`` as JSON and the raw bytes of ``arrays`` (C order)."""
    data = b"".join(a.tobytes() for a in arrays)
    js = json.dumps(meta, default=_json_default, separators=(",", ":")).encode("utf-8")
    return _FRAME.pack(_MAGIC, len(js), len(data), zlib.crc32(data, zlib.crc32(js))) + js + data


def _record_frame(rec: Any) -> bytes:
    """One record as one frame (arrays exact: dtype, shape and their bytes)."""
    import numpy as np

    d = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}
    arrays: list[Any] = []
    offset = 0

    def ref(a: Any) -> list[Any]:
        nonlocal offset
        a = np.ascontiguousarray(a)
        arrays.append(a)
        offset += a.nbytes
        return [a.dtype.str, list(a.shape), offset - a.nbytes, a.nbytes]

    d["quantiles"] = ref(rec.quantiles)
    d["samples"] = {str(k): ref(a) for k, a in rec.samples.items()}
    return _frame({"record": d}, arrays)


def _record_from_frame(meta: Mapping[str, Any], data: bytes) -> Any:
    import numpy as np

    from tolstat.dataset.records import RunRecord

    def arr(v: Any) -> Any:
        dt, shape, start, n = v
        dtype = np.dtype(str(dt))
        if dtype.hasobject or not 0 <= int(start) <= int(start) + int(n) <= len(data):
            raise ValueError(f"bad array {v!r} in a record part")
        return np.frombuffer(data, dtype=dtype, count=int(n) // dtype.itemsize,
                             offset=int(start)).reshape([int(s) for s in shape]).copy()

    d = dict(meta["record"])
    d["quantiles"] = arr(d["quantiles"])
    d["samples"] = {str(k): arr(a) for k, a in d["samples"].items()}
    return RunRecord(**d)


@dataclasses.dataclass
class _Part:
    """What one part file held."""

    records: list[Any]
    worker: str
    finished: bool
    skipped: list[str]


def _read_part(path: Path) -> _Part:
    """Read a part file; a frame its writer did not complete (killed mid-write) is skipped.

    Raises
    ------
    ValueError
        The file is not a record part (no valid header line).
    OSError
        The file cannot be read.
    """
    records: list[Any] = []
    skipped: list[str] = []
    finished = False
    n_end = None
    with open(path, "rb") as fh:
        head = fh.readline(65536)
        try:
            header = json.loads(head) if head.endswith(b"\n") else None
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("format") != _PART_FORMAT:
            raise ValueError("not a tolstat record part (no valid header line)")
        if header.get("version") != _PART_VERSION:
            raise ValueError(f"record part version {header.get('version')!r}, this tolstat reads version "
                             f"{_PART_VERSION}")
        k = 0
        while True:
            at = fh.tell()
            pre = fh.read(_FRAME.size)
            if not pre:
                break
            k += 1
            if len(pre) < _FRAME.size:
                skipped.append(f"frame {k} (byte {at}) is incomplete (its writer stopped while writing it)")
                break
            magic, n_js, n_data, crc = _FRAME.unpack(pre)
            if magic != _MAGIC:
                skipped.append(f"frame {k} (byte {at}) is damaged; the rest of the part is skipped")
                break
            js, data = fh.read(n_js), fh.read(n_data)
            if len(js) < n_js or len(data) < n_data:
                skipped.append(f"frame {k} (byte {at}) is incomplete (its writer stopped while writing it)")
                break
            if zlib.crc32(data, zlib.crc32(js)) != crc:
                skipped.append(f"frame {k} (byte {at}) fails its checksum: skipped")
                continue
            try:
                meta = json.loads(js)
                if "end" in meta:
                    finished, n_end = True, int(meta["end"])
                    continue
                records.append(_record_from_frame(meta, data))
            except (ValueError, KeyError, TypeError) as exc:
                skipped.append(f"frame {k} (byte {at}) unreadable ({type(exc).__name__}: {exc})")
    if n_end is not None and n_end != len(records):
        skipped.append(f"its writer recorded {n_end} record(s), {len(records)} could be read")
    return _Part(records, str(header.get("worker", "?")), finished, skipped)


@dataclasses.dataclass
class PartsMerge:
    """What :func:`merge_parts` (or the end of a recording session) did.

    Attributes
    ----------
    path : pathlib.Path or None
        The record file written; ``None`` when there was no record to write.
    n_records : int
        Records written (every record of every part that could be read).
    parts : list of str
        The part files merged.
    unfinished : list of str
        Workers (``gw0``, ``main``, ...) whose part was merged although they did not
        finish: they crashed, were killed or interrupted; every record they completed
        is kept.
    skipped : list of str
        Parts merged without some of their lines, and why.
    unreadable : list of str
        Parts that could not be read, and why; they are left in the parts folder.
    ignored : list of str
        Other entries of the parts folder (temporaries); left there.
    parts_dir : pathlib.Path or None
        The parts folder.
    """

    path: Path | None
    n_records: int
    parts: list[str]
    unfinished: list[str]
    skipped: list[str]
    unreadable: list[str]
    ignored: list[str]
    parts_dir: Path | None = None

    def lines(self) -> list[str]:
        """The report, one line per fact (what the plugin prints in the terminal summary)."""
        n_parts = len(self.parts)
        src = f" (merged from {n_parts} part(s))" if n_parts else ""
        out = [f"tolstat: recorded {self.n_records} passing check(s) to {self.path}{src}" if self.path is not None
               else f"tolstat: no passing check recorded{src}: no record file written"]
        if self.unfinished:
            out.append(f"tolstat: merged the records of {len(self.unfinished)} worker(s) that did not finish "
                       f"(crashed, killed or interrupted): {', '.join(self.unfinished)}; every check they "
                       "completed is kept")
        out += [f"tolstat: part {s}" for s in self.skipped]
        if self.unreadable:
            out.append(f"tolstat: could not read {len(self.unreadable)} part(s), left in {self.parts_dir}: "
                       + "; ".join(self.unreadable))
        if self.ignored:
            out.append(f"tolstat: ignored {len(self.ignored)} other file(s) in {self.parts_dir} (temporaries of "
                       f"writers that stopped?): {', '.join(self.ignored)}")
        return out


def _records_dataset(records: Sequence[Any], provenance: Mapping[str, Any]) -> Any:
    """One error dataset of the given records (covariates a record lacks are NaN)."""
    from tolstat.dataset.merge import merge_records
    from tolstat.dataset.records import build_dataset

    names = sorted({k for r in records for k in r.covariates})
    for r in records:  # every run needs the same covariates: NaN where a test gave none
        for k in names:
            r.covariates.setdefault(k, math.nan)
    # runs with the same operator statistics (none, or those of one op) build one dataset;
    # several are merged, each run keeping its own (NaN where it has none)
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for r in records:
        groups.setdefault((tuple(r.op_stats), r.op_rowwise), []).append(r)
    dss = [build_dataset(rs, provenance=provenance) for rs in groups.values()]
    return dss[0] if len(dss) == 1 else merge_records(dss, dedupe=False)


def _merge(parts_dir: Path | None, record_path: str | os.PathLike[str], records: Sequence[Any] = ()) -> PartsMerge:
    """Read every part in ``parts_dir``, write ``records`` and theirs to ``record_path`` (atomically).

    Nothing is removed: a failure or an interrupt leaves the parts as they were.
    """
    from tolstat.dataset.io import save

    allrec = list(records)
    parts: list[str] = []
    unfinished: list[str] = []
    skipped: list[str] = []
    unreadable: list[str] = []
    ignored: list[str] = []
    workers = ["main"] if allrec else []
    entries = sorted(parts_dir.iterdir()) if parts_dir is not None else []
    for p in entries:
        if p.name.startswith(".") or p.suffix != _PART_SUFFIX or not p.is_file():
            ignored.append(p.name)
            continue
        try:
            part = _read_part(p)
        except (OSError, ValueError) as exc:
            unreadable.append(f"{p.name} ({exc})")
            continue
        parts.append(p.name)
        allrec += part.records
        workers.append(part.worker)
        if not part.finished:
            unfinished.append(part.worker)
        skipped += [f"{p.name}: {s}" for s in part.skipped]
    out = None
    if allrec:
        prov = {"created_by": "tolstat.checks.pytest_plugin", "worker": ",".join(dict.fromkeys(workers))}
        out = save(_records_dataset(allrec, prov), record_path)
    return PartsMerge(out, len(allrec), parts, unfinished, skipped, unreadable, ignored, parts_dir)


def _remove_parts(res: PartsMerge) -> None:
    """Remove the merged parts, and the parts folder when nothing else is left in it."""
    if res.parts_dir is None:
        return
    for name in res.parts:
        try:
            (res.parts_dir / name).unlink()
        except FileNotFoundError:
            pass
    try:
        res.parts_dir.rmdir()
    except OSError:  # not empty: unreadable parts or other files, named in the report
        pass


def merge_parts(parts_dir: str | os.PathLike[str], record_path: str | os.PathLike[str], *,
                remove: bool = True) -> PartsMerge:
    """Merge a parts folder that a recording session left behind into a record file.

    A session interrupted (Ctrl-C) while merging its records, or one that was killed,
    leaves its records in a hidden folder ``.<record name>.parts-<id>`` next to the
    record path, and names it with this command. Every part that can be read is merged
    (a line its writer did not complete is skipped and reported); the record file is
    written atomically.

    Parameters
    ----------
    parts_dir : path-like
        The parts folder.
    record_path : path-like
        The record file to write (``.nc`` or ``.zarr``); an existing one is replaced.
    remove : bool, default True
        Remove the merged parts afterwards (and the folder when nothing else is left).

    Returns
    -------
    PartsMerge
        What was merged and what could not be read (:meth:`PartsMerge.lines`).

    Raises
    ------
    FileNotFoundError
        ``parts_dir`` is not a folder.
    ValueError
        ``record_path`` does not end in ``.nc`` or ``.zarr``.
    """
    d = Path(parts_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"no parts folder at {os.fspath(d)!r}")
    if Path(record_path).suffix.lower() not in (".nc", ".zarr"):
        raise ValueError(f"record path {os.fspath(record_path)!r} must end in .nc or .zarr")
    res = _merge(d, record_path)
    if remove:
        _remove_parts(res)
    return res
