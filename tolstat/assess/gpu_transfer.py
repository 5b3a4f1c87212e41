"""Does a tolerance table transfer to another GPU? The shipped FP8 GEMM dataset of two emulated GPUs.

tolstat ships one error dataset of ``torch._scaled_mm`` (``float8_e4m3fn`` inputs,
per-tensor scales, float32 accumulation, bfloat16 output): the same cases computed as an
NVIDIA H100 PCIe (hardware ``H100-PCIe/hopper``) and an RTX 4060 (``RTX4060/ada``) compute
them, bit for bit, by the emulator ``mmaemu``, and by torch's CPU kernel
(``torch-cpu:<CPU model>``). How it was made is in the file's provenance
(``attrs["provenance"]``, last entry) and ``benchmarks/fp8_emulated_collect.py``.

Its runs carry the labels ``variant`` (``correct`` or a bug of the field on this path:
``wrong_scale``, ``rowwise_scale``, ``dropped_k_tile``, ``bf16_accumulation``), ``split``
(``cal``: calibration blocks; ``test``: held-out blocks, where the bugs run too),
``dist`` (``normal``, ``outlier``), ``case`` and ``same_as_correct`` (a buggy output equal
bit for bit to the correct one on that case, which no check can catch).

:func:`transfer` calibrates a table per hardware on the ``cal`` correct runs
(:func:`tolstat.select`, its default form) and checks every hardware's held-out correct
runs and buggy runs with it (:func:`tolstat.checks.checking.check_runs`):

* **FP rate** ``k/n`` of the held-out correct runs, with the exact two-sided
  (Clopper-Pearson) interval at ``confidence``; status as in :func:`tolstat.shift`
  (``within``: ``k/n <= fp_budget``; ``broken``: the whole interval above the budget;
  ``above`` between);
* **what the hardware policy does** (:mod:`tolstat.calibration.hwpolicy`) on a machine the
  table was not calibrated on: which group each policy uses, or that it refuses;
* **recall** per bug on each hardware: the share of its buggy runs (those whose output
  differs from the correct one) that fail the check, with its interval; the table's
  group is the one the ``nearest`` policy takes.

The held-out runs are independent of the calibration runs (other seeds); the runs of one
block are the same cases on every hardware, so rows of different hardware are paired,
not independent.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr

__all__ = ["DATA_FILE", "H100", "RTX4060", "BUGS", "TransferResult", "dataset_path", "open_dataset", "runs_of",
           "shift_pair", "transfer"]

#: file name of the shipped dataset (package ``tolstat.data``)
DATA_FILE = "fp8_emulated.nc"
#: hardware labels of the two emulated GPUs
H100, RTX4060 = "H100-PCIe/hopper", "RTX4060/ada"
#: the buggy variants of the dataset
BUGS = ("wrong_scale", "rowwise_scale", "dropped_k_tile", "bf16_accumulation")
_POLICIES = ("exact", "error", "pooled", "nearest")


def dataset_path() -> Path:
    """Path of the shipped dataset (``tolstat/data/fp8_emulated.nc``)."""
    from importlib import resources

    return Path(str(resources.files("tolstat") / "data" / DATA_FILE))


def open_dataset(path: str | os.PathLike[str] | None = None) -> xr.Dataset:
    """The shipped dataset (or the one at ``path``), opened with :func:`tolstat.open_errors` and loaded.

    Raises
    ------
    FileNotFoundError
        No file at ``path`` (or the package was installed without its data).
    """
    from tolstat.dataset.io import open_errors

    p = dataset_path() if path is None else Path(path)
    if not p.exists():
        raise FileNotFoundError(f"path: no error dataset at {os.fspath(p)!r}"
                                + (" (tolstat installed without its package data?)" if path is None else ""))
    return open_errors(p).load()


def _label(ds: xr.Dataset, name: str) -> np.ndarray:
    if name not in ds.variables:
        raise ValueError(f"the dataset has no label {name!r} (labels: {ds.attrs.get('labels', '')!r}); "
                         "it is needed to tell correct, buggy, calibration and held-out runs apart")
    return np.asarray(ds[name].values).astype(str)


def runs_of(ds: xr.Dataset, hardware: str | Sequence[str] | None = None, *, variant: str | None = "correct",
            split: str | None = None) -> xr.Dataset:
    """The runs of ``hardware`` (a label or several; None: all) with this ``variant`` and ``split`` label.

    ``variant=None`` / ``split=None``: any. A dataset without a ``variant`` label is taken
    as all correct runs.

    Raises
    ------
    ValueError
        No run matches (the message names the argument, its value and what the dataset has).
    """
    keep = np.ones(ds.sizes["run"], dtype=bool)
    hw = _label(ds, "hardware")
    if hardware is not None:
        want = [hardware] if isinstance(hardware, str) else list(hardware)
        missing = [h for h in want if h not in set(hw)]
        if missing:
            raise ValueError(f"hardware={hardware!r}: no runs of {missing} (the dataset has {sorted(set(hw))})")
        keep &= np.isin(hw, want)
    if variant is not None and ("variant" in ds.variables or variant != "correct"):
        v = _label(ds, "variant")
        if variant not in set(v):
            raise ValueError(f"variant={variant!r}: no such runs (the dataset has {sorted(set(v))})")
        keep &= v == variant
    if split is not None:
        s = _label(ds, "split")
        if split not in set(s):
            raise ValueError(f"split={split!r}: no such runs (the dataset has {sorted(set(s))})")
        keep &= s == split
    if not keep.any():
        raise ValueError(f"no runs with hardware={hardware!r}, variant={variant!r}, split={split!r}")
    return ds.isel(run=np.flatnonzero(keep))


def shift_pair(ds: xr.Dataset | None = None, hardware_a: str = H100,
               hardware_b: str = RTX4060) -> tuple[xr.Dataset, xr.Dataset]:
    """The correct runs of ``hardware_a`` and of ``hardware_b``: the A and B of :func:`tolstat.shift`.

    ``ds`` defaults to the shipped dataset. ``tolstat shift --fp8-emulated`` prints the
    report of this pair.
    """
    ds = open_dataset() if ds is None else ds
    return runs_of(ds, hardware_a), runs_of(ds, hardware_b)


@dataclass
class TransferResult:
    """Outcome of :func:`transfer`.

    Attributes
    ----------
    fp : xarray.Dataset
        One row per (table, checked_on, policy) (dim ``row``): ``table`` (the hardware it
        was calibrated on, ``+``-joined, ``*`` for a pooled table), ``checked_on``,
        ``policy``, ``group`` (the hardware of the group the policy uses; ``""``: refused),
        ``n`` (held-out correct runs), ``k`` (failed), ``rate``, ``ci_low``, ``ci_high``,
        ``status`` (``within`` / ``above`` / ``broken``; ``refused``; ``no threshold``),
        ``note``.
    recall : xarray.Dataset
        One row per (table, checked_on, bug): ``n`` (buggy runs whose output differs from
        the correct one), ``caught``, ``recall``, ``ci_low``, ``ci_high``, ``n_same``
        (buggy runs equal to the correct output, left out), ``group``.
    settings : dict
        ``fp_budget``, ``confidence``, the tables' thresholds and calibration units.
    """

    fp: xr.Dataset
    recall: xr.Dataset
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: settings, the FP rows and the recall rows."""
        def rows(d: xr.Dataset) -> list[dict[str, Any]]:
            out = []
            for i in range(d.sizes["row"]):
                r: dict[str, Any] = {}
                for v in d.data_vars:
                    x = d[v].values[i]
                    if isinstance(x, (np.integer, int)):
                        r[v] = int(x)
                    elif isinstance(x, (np.floating, float)):
                        r[v] = None if math.isnan(float(x)) else float(x)
                    else:
                        r[v] = str(x)
                out.append(r)
            return out

        return {"settings": self.settings, "fp": rows(self.fp), "recall": rows(self.recall)}

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Return (and, with ``path``, atomically write) the result as JSON."""
        from tolstat.assess.hwshift import report_json

        return report_json(self.to_dict(), path)

    def to_text(self) -> str:
        """Two tables: the FP rate of each table on each hardware (with the policies that give
        it), then the recall per bug."""
        s = self.settings
        conf = f"{100 * s['confidence']:g}% CI"
        head = (f"tolerance transfer: tables calibrated on the 'cal' correct runs (tolstat.select, "
                f"fp_budget={s['fp_budget']:g}, confidence={s['confidence']:g}); checked on each hardware's "
                f"held-out runs")
        d = self.fp
        rows = [("table (calibrated on)", "checked on", "policies -> group used", "FP on held-out", conf,
                 "status")]
        seen: dict[tuple[str, str, str], list[str]] = {}
        first: dict[tuple[str, str, str], int] = {}
        for i in range(d.sizes["row"]):
            key = (str(d["table"].values[i]), str(d["checked_on"].values[i]), str(d["group"].values[i]))
            seen.setdefault(key, []).append(str(d["policy"].values[i]))
            first.setdefault(key, i)
        for key, pols in seen.items():
            i = first[key]
            grp = key[2] or "refused"
            st = str(d["status"].values[i])
            has = st not in ("refused", "no threshold")
            rows.append((key[0], key[1], f"{', '.join(pols)} -> {grp}",
                         f"{int(d['k'].values[i])}/{int(d['n'].values[i])} = {float(d['rate'].values[i]):.3g}"
                         if has else "n/a",
                         f"[{float(d['ci_low'].values[i]):.3g}, {float(d['ci_high'].values[i]):.3g}]" if has else "",
                         st.upper() if st == "broken" else st))
        lines = [head, ""] + _columns(rows)
        r = self.recall
        if r.sizes["row"]:
            lines += ["", "recall per bug (buggy runs whose output differs from the correct one; the group the "
                          "'nearest' policy uses)", ""]
            rr = [("table (calibrated on)", "checked on", "bug", "caught", "recall", conf, "same as correct")]
            for i in range(r.sizes["row"]):
                n = int(r["n"].values[i])
                rr.append((str(r["table"].values[i]), str(r["checked_on"].values[i]), str(r["bug"].values[i]),
                           f"{int(r['caught'].values[i])}/{n}", f"{float(r['recall'].values[i]):.3g}" if n else "n/a",
                           f"[{float(r['ci_low'].values[i]):.3g}, {float(r['ci_high'].values[i]):.3g}]" if n else "",
                           str(int(r["n_same"].values[i]))))
            lines += _columns(rr)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _status(k: int, n: int, lo: float, budget: float) -> str:
    rate = k / n
    return "within" if rate <= budget else ("broken" if lo > budget else "above")


def _default_tables(hws: Sequence[str]) -> dict[str, tuple[list[str], bool]]:
    """name -> (hardware calibrated on, pooled into one '*' group)."""
    tables: dict[str, tuple[list[str], bool]] = {h: ([h], False) for h in hws}
    gpus = [h for h in (H100, RTX4060) if h in hws]
    if len(gpus) == 2:
        tables[f"{'+'.join(gpus)} (*)"] = (gpus, True)
    return tables


def transfer(ds: xr.Dataset | None = None, *, fp_budget: float = 0.01, confidence: float = 0.95,
             tables: Mapping[str, tuple[Sequence[str], bool]] | None = None) -> TransferResult:
    """Calibrate a table per hardware and check every hardware's held-out runs with it.

    See the module docstring for what is computed.

    Parameters
    ----------
    ds : xarray.Dataset, optional
        An error dataset with the labels ``variant`` and ``split`` (default: the shipped
        dataset, :func:`open_dataset`).
    fp_budget : float, default 0.01
        False-positive budget per check of the tables, in (0, 1).
    confidence : float, default 0.95
        Confidence of the tables and level of the intervals.
    tables : mapping, optional
        ``name -> (hardware labels calibrated on, pooled)``: ``pooled=True`` calibrates
        one ``"*"`` group over them (``by=("op", "dtype")``), else one group per
        hardware. Default: one table per hardware of the dataset and, with both emulated
        GPUs present, their pooled table.

    Returns
    -------
    TransferResult

    Raises
    ------
    ValueError
        A bad ``fp_budget`` / ``confidence`` (named by :func:`tolstat.select`), a dataset
        without the ``variant`` / ``split`` labels, or a table naming hardware the
        dataset lacks.
    """
    from tolstat._base.inference import clopper_pearson
    from tolstat.calibration.selection import select
    from tolstat.checks.checking import check_runs

    ds = open_dataset() if ds is None else ds
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"ds must be an error dataset (xarray.Dataset), got {type(ds).__name__}")
    _label(ds, "variant"), _label(ds, "split")
    hws = sorted(set(_label(ds, "hardware")))
    tables = _default_tables(hws) if tables is None else dict(tables)
    bugs_present = [b for b in BUGS if b in set(_label(ds, "variant"))]
    fp_rows: list[dict[str, Any]] = []
    rec_rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    held = {h: runs_of(ds, h, split="test") for h in hws}
    same = _label(ds, "same_as_correct") if "same_as_correct" in ds.variables else None
    for name, (cal_hw, pooled) in tables.items():
        cal = runs_of(ds, list(cal_hw), split="cal")
        table = select(cal, fp_budget=fp_budget, confidence=confidence,
                       by=("op", "dtype") if pooled else ("op", "dtype", "hardware"), on_error="skip")
        thr = table.data["threshold"].values[:, 0]
        meta[name] = {"groups": [list(g) for g in table.groups], "threshold": [float(t) for t in thr],
                      "method": [str(m) for m in table.data["method"].values[:, 0]],
                      "calibration_runs": int(cal.sizes["run"])}
        for h in hws:
            test = held[h]
            op, dt = str(test["op"].values[0]), str(test["dtype"].values[0])
            for pol in _POLICIES:
                row: dict[str, Any] = {"table": name, "checked_on": h, "policy": pol, "group": "",
                                       "n": int(test.sizes["run"]), "k": 0, "note": ""}
                try:
                    grp = table.entry(op, dt, h, hardware_policy=pol).hardware
                except KeyError as exc:
                    row.update(status="refused" if "hardware_policy" in str(exc) else "no threshold",
                               note=str(exc).strip("'\"")[:300])
                    fp_rows.append(row)
                    continue
                row["group"] = grp
                try:
                    passed = check_runs(test, table, hardware_policy=pol)
                except (KeyError, ValueError) as exc:
                    row.update(status="no threshold", note=str(exc)[:300])
                    fp_rows.append(row)
                    continue
                k, n = int((~passed).sum()), int(passed.size)
                lo, hi = clopper_pearson(k, n, float(confidence))
                row.update(k=k, rate=k / n, ci_low=float(lo), ci_high=float(hi),
                           status=_status(k, n, float(lo), fp_budget))
                fp_rows.append(row)
            rec_rows += _recall_rows(ds, name, table, h, bugs_present, same, confidence, check_runs,
                                     clopper_pearson)
    settings = {"fp_budget": float(fp_budget), "confidence": float(confidence), "tables": meta,
                "hardware": hws, "functions": "tolstat.select (tables on the 'cal' correct runs); "
                "tolstat.checks.checking.check_runs (the check's decision on held-out and buggy runs); "
                "tolstat._base.inference.clopper_pearson (exact intervals, scipy)"}
    return TransferResult(fp=_rows_dataset(fp_rows, ("table", "checked_on", "policy", "group", "status", "note"),
                                           ("n", "k"), ("rate", "ci_low", "ci_high")),
                          recall=_rows_dataset(rec_rows, ("table", "checked_on", "bug", "group"),
                                               ("n", "caught", "n_same"), ("recall", "ci_low", "ci_high")),
                          settings=settings)


def _recall_rows(ds: xr.Dataset, name: str, table: Any, h: str, bugs: Sequence[str], same: np.ndarray | None,
                 confidence: float, check_runs: Any, clopper_pearson: Any) -> list[dict[str, Any]]:
    rows = []
    hw = _label(ds, "hardware")
    var = _label(ds, "variant")
    for bug in bugs:
        idx = np.flatnonzero((hw == h) & (var == bug))
        if not idx.size:
            continue
        differs = np.ones(idx.size, dtype=bool) if same is None else same[idx] != "yes"
        row: dict[str, Any] = {"table": name, "checked_on": h, "bug": bug, "n_same": int((~differs).sum()),
                               "n": int(differs.sum()), "caught": 0, "group": ""}
        sub = ds.isel(run=idx[differs])
        if sub.sizes["run"]:
            try:
                op, dt = str(sub["op"].values[0]), str(sub["dtype"].values[0])
                row["group"] = table.entry(op, dt, h, hardware_policy="nearest").hardware
                caught = int((~check_runs(sub, table, hardware_policy="nearest")).sum())
            except (KeyError, ValueError):
                rows.append(row)
                continue
            lo, hi = clopper_pearson(caught, row["n"], float(confidence))
            row.update(caught=caught, recall=caught / row["n"], ci_low=float(lo), ci_high=float(hi))
        rows.append(row)
    return rows


def _rows_dataset(rows: Sequence[Mapping[str, Any]], strs: Sequence[str], ints: Sequence[str],
                  floats: Sequence[str]) -> xr.Dataset:
    dim = ("row",)
    out: dict[str, Any] = {}
    for v in strs:
        out[v] = (dim, np.array([str(r.get(v, "")) for r in rows], dtype=str))
    for v in ints:
        out[v] = (dim, np.array([int(r.get(v, 0)) for r in rows], dtype=np.int64))
    for v in floats:
        out[v] = (dim, np.array([float(r.get(v, math.nan)) for r in rows], dtype=np.float64))
    return xr.Dataset(out)
