"""The tolerance table: thresholds per (op, dtype, hardware), their lookup and IO.

Built by :func:`tolstat.select` (selection -> **table** -> checks); stored as versioned
JSON (:meth:`ToleranceTable.to_json`) or netCDF (:meth:`ToleranceTable.to_netcdf`) and
read back with :func:`load_table`. Each entry knows how its max-error statistic turns
into an ``(atol, rtol)`` pair (:mod:`tolstat.models.statistics`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import xarray as xr

from tolstat._base.dtypes import canonical_dtype
from tolstat._base import validate as _validate
from tolstat._base.util import ANY, atomic_write, atomic_write_text
from tolstat._version import __version__
from tolstat.models.scale import ScaleModel
from tolstat.calibration.bounds import Calibration
from tolstat.calibration.hwpolicy import MissingGroup
from tolstat.calibration.table_format import _check_group_keys, _uf, check_table_data
from tolstat.models.statistics import get as get_statistic

__all__ = ["TABLE_SCHEMA", "ToleranceEntry", "ToleranceTable", "MissingGroup", "load_table"]

TABLE_SCHEMA = 1
TAIL_KEYS = ("u", "sigma", "xi", "zeta", "gof_p")
#: the table settings the table-level checksum covers (with every group's checksum)
CHECKSUM_SETTINGS = ("fp_budget", "confidence", "form", "statistics", "budget_split")
#: how to accept an edited table on purpose (the end of every checksum error)
_ACCEPT_EDIT = ("to accept an edited table on purpose, load it with tolstat.load_table(path, verify=False) "
                "and save it again with ToleranceTable.to_json or to_netcdf, which write new checksums "
                "('tolstat show/diff --no-verify' read it without saving)")


@dataclass(frozen=True)
class ToleranceEntry:
    """What a check of one (op, dtype, hardware) needs, found by :meth:`ToleranceTable.entry`.

    Attributes
    ----------
    op, dtype, hardware : str
        The group matched (``hardware`` may be ``"*"``).
    requested_hardware : str or None
        The hardware asked for.
    fallback : str
        How the group was found (``"exact"``, ``"any hardware"``, ``"only hardware"``,
        ``"default op"``).
    n : int
        Calibration runs.
    statistics : dict
        ``{name: Calibration}`` (:class:`~tolstat.calibration.bounds.Calibration`, with ``statistic`` set); the first is the max-error statistic.
    scale : ScaleModel or None
        Noise-scale model of ``max_score``.
    fp_budget, confidence : float
        The promise of the whole check.
    certificate : dict or None
        How the group's threshold was chosen and what it promises (forms ``"auto"`` and
        ``"operator"``): ``form``, ``form_reason``, ``method``, ``guarantee``; for the
        operator form ``statistics``, ``normalisers``, ``rowwise``, ``needs_magnitude``,
        ``covariates``, ``pool``, ``flags`` (:func:`tolstat.calibration.engine.certify`).
    """

    op: str
    dtype: str
    hardware: str
    requested_hardware: str | None
    fallback: str
    n: int
    statistics: dict[str, Calibration]
    scale: ScaleModel | None
    fp_budget: float
    confidence: float
    certificate: dict[str, Any] | None = None

    @property
    def operator(self) -> bool:
        """True for an operator-form entry (checked with the combined score ``op_score``)."""
        return "op_score" in self.statistics

    @property
    def max_statistic(self) -> str:
        """Name of the max-error statistic (``max_abs``, ``max_ulp``, ``max_rel``, ``max_score``)."""
        return next(s for s in self.statistics if s != "bias")

    def allclose(self, covariates: Mapping[str, Any] | None = None) -> tuple[float, float]:
        """``(atol, rtol)`` equivalent of the max-error threshold for one check.

        ``max_abs``: ``(c, 0)``; ``max_rel``: ``(c*rel_floor, c)`` approximately (the
        exact rule is ``|d| <= c*max(|ref|, rel_floor)``); ``max_score``: ``c`` times
        the scale model's pair at ``covariates``.

        Raises
        ------
        ValueError
            ``max_ulp`` or a baseline-relative scale (no allclose form), missing
            covariates, or a NaN/inf covariate.
        TypeError
            A covariate that is not a real number.
        """
        name = self.max_statistic
        cov = _validate.covariates(covariates)  # finite numbers only: K=inf would switch it off
        return get_statistic(name).allclose_pair(self.statistics[name].threshold, self.dtype, self.scale,
                                                 cov)


def _f(v: Any) -> Any:
    """Float for JSON: repr-exact numbers, non-finite as strings."""
    v = float(v)
    if math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float as the string :func:`_f` writes (``"nan"``, ...), so
    that a group's stored JSON is the same before a save and after a load (a fit-free
    scale has no quantile: NaN)."""
    if isinstance(obj, Mapping):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return _f(obj)
    return obj


def _digest(obj: Any) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of ``obj`` (sorted keys, no spaces)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def _variable_ids(d: xr.Dataset) -> tuple[int, ...]:
    """Identity of the dataset's variables: changes when one is replaced (``d[name] = ...``)."""
    return tuple(map(id, d.variables.values()))


@dataclass
class _Columns:
    """The table's variables as numpy arrays and its group index, built once per dataset.

    Lookups and exports read these instead of indexing the ``xarray.Dataset`` per value
    (each ``Dataset[name]`` builds a DataArray), so that they are linear in the groups.
    """

    data: xr.Dataset
    variables: tuple[int, ...]
    groups: list[tuple[str, str, str]]
    statistics: list[str]
    index: dict[tuple[str, str, str], int]
    by_op_dtype: dict[tuple[str, str], list[tuple[str, str, str]]]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, d: xr.Dataset) -> "_Columns":
        groups = list(zip(map(str, d["op"].values), map(str, d["dtype"].values), map(str, d["hardware"].values)))
        by: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        for k in groups:
            by.setdefault(k[:2], []).append(k)
        arrays = {str(v): np.asarray(d[v].values) for v in d.data_vars}
        return cls(data=d, variables=_variable_ids(d), groups=groups,
                   statistics=[str(x) for x in d["statistic"].values],
                   index={k: i for i, k in enumerate(groups)}, by_op_dtype=by, arrays=arrays)

    def text(self, name: str, i: int) -> str:
        """A per-group string variable (``""`` when the table has no such variable)."""
        a = self.arrays.get(name)
        return "" if a is None else str(a[i])


class ToleranceTable:
    """Calibrated thresholds per (op, dtype, hardware), backed by an ``xarray.Dataset``.

    Build with :func:`select`; read with :func:`load_table`. ``table.data`` is the
    dataset: dims ``group`` (coords ``op``, ``dtype``, ``hardware``), ``statistic`` and
    ``rank``; variables ``threshold``, ``estimate``, ``budget``, ``stat_confidence``,
    ``method``, ``reason``, ``tail_u/sigma/xi/zeta/gof_p``, ``top_scores`` (largest
    calibration scores), ``n``, ``scale_atol``, ``scale_rtol``, ``scale_json`` (the full
    scale model); attrs ``fp_budget``, ``confidence``, ``form``, ``statistics``,
    ``budget_split``, ``provenance``, ``tolstat_table`` (schema version).

    Lookup (:meth:`entry`) falls back, in this declared order: exact hardware ->
    hardware ``"*"`` (a table calibrated over all hardware) -> the only hardware of that
    (op, dtype) when no hardware was asked for -> op ``"*"`` (a declared default for
    the dtype) with the same hardware rules. Anything else is a ``KeyError`` listing the
    groups available.
    """

    def __init__(self, data: xr.Dataset, *, source: str | None = None):
        if not isinstance(data, xr.Dataset):
            raise TypeError(f"ToleranceTable needs an xarray.Dataset, got {type(data).__name__}")
        schema = data.attrs.get("tolstat_table", None)
        try:
            ok = int(schema) == TABLE_SCHEMA
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"not a tolstat tolerance table (schema {schema!r}, "
                             f"expected {TABLE_SCHEMA})")
        check_table_data(data, source)
        self.data = data
        self._cols_cache: _Columns | None = None

    def _cols(self) -> _Columns:
        """The column view of ``self.data`` (rebuilt when ``data`` is replaced)."""
        c = self._cols_cache
        if c is None or c.data is not self.data or c.variables != _variable_ids(self.data):
            c = self._cols_cache = _Columns.of(self.data)
        return c

    # ---- construction
    @classmethod
    def from_groups(cls, groups: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> "ToleranceTable":
        """Build from group dicts (the JSON layout) and table metadata."""
        try:
            return cls._from_groups(groups, meta)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"malformed tolerance table: {what} (see docs/selection.md for the layout)") from exc

    @classmethod
    def _from_groups(cls, groups: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> "ToleranceTable":
        if not isinstance(groups, Sequence) or isinstance(groups, str) or not groups:
            raise ValueError("a tolerance table needs a non-empty list of groups")
        statistics = meta["statistics"]
        if isinstance(statistics, str) or not isinstance(statistics, Sequence) or not statistics:
            raise ValueError(f"table 'statistics' must be a non-empty list of names, got {statistics!r}")
        statistics = [str(x) for x in statistics]
        _check_group_keys(groups, statistics)
        G, S = len(groups), len(statistics)
        K = max(1, max(len(g["statistics"][s].get("top_scores", [])) for g in groups for s in statistics))
        f64 = lambda: np.full((G, S), np.nan)  # noqa: E731
        thr, est, bud, conf = f64(), f64(), f64(), f64()
        tails = {k: f64() for k in TAIL_KEYS}
        meth = np.empty((G, S), dtype=object)
        reas = np.empty((G, S), dtype=object)
        top = np.full((G, S, K), np.nan)
        for i, g in enumerate(groups):
            for j, s in enumerate(statistics):
                e = g["statistics"][s]
                thr[i, j] = _uf(e["threshold"])
                est[i, j] = _uf(e["estimate"])
                bud[i, j] = _uf(e["budget"])
                conf[i, j] = _uf(e["confidence"])
                meth[i, j] = str(e["method"])
                reas[i, j] = str(e["reason"])
                for k in tails:
                    tails[k][i, j] = _uf(e.get("tail", {}).get(k, "nan"))
                ts = [_uf(v) for v in e.get("top_scores", [])]
                top[i, j, : len(ts)] = ts
        scales = [g.get("scale") for g in groups]
        gdim = ("group",)
        ds = xr.Dataset(
            {
                "n": (gdim, np.array([int(g["n"]) for g in groups], dtype=np.int64)),
                "n_inexact": (gdim, np.array([int(g.get("n_inexact", 0)) for g in groups], dtype=np.int64)),
                "threshold": (("group", "statistic"), thr),
                "estimate": (("group", "statistic"), est),
                "budget": (("group", "statistic"), bud),
                "stat_confidence": (("group", "statistic"), conf),
                "method": (("group", "statistic"), meth.astype(str)),
                "reason": (("group", "statistic"), reas.astype(str)),
                **{f"tail_{k}": (("group", "statistic"), v) for k, v in tails.items()},
                "top_scores": (("group", "statistic", "rank"), top),
                "scale_atol": (gdim, np.array([_uf(s.get("atol", 0.0)) if s else np.nan for s in scales])),
                "scale_rtol": (gdim, np.array([_uf(s.get("rtol", 0.0)) if s else np.nan for s in scales])),
                "scale_json": (gdim, np.array([json.dumps(_json_safe(s), sort_keys=True) if s else "" for s in scales],
                                              dtype=str)),
                "certificate_json": (gdim, np.array([json.dumps(g["certificate"], sort_keys=True)
                                                     if g.get("certificate") else "" for g in groups], dtype=str)),
            },
            coords={
                "op": (gdim, np.array([str(g["op"]) for g in groups], dtype=str)),
                "dtype": (gdim, np.array([str(g["dtype"]) for g in groups], dtype=str)),
                "hardware": (gdim, np.array([str(g["hardware"]) for g in groups], dtype=str)),
                "statistic": ("statistic", np.array(statistics, dtype=str)),
            },
            attrs={
                "tolstat_table": TABLE_SCHEMA,
                "tolstat_version": str(meta.get("tolstat_version", __version__)),
                "fp_budget": float(_uf(meta["fp_budget"])),
                "confidence": float(_uf(meta["confidence"])),
                "form": str(meta.get("form") or ""),
                "statistics": ",".join(statistics),
                "budget_split": str(meta.get("budget_split", "bonferroni")),
                "provenance": json.dumps(meta.get("provenance", {}), sort_keys=True),
            },
        )
        keys = list(zip(ds["op"].values.tolist(), ds["dtype"].values.tolist(), ds["hardware"].values.tolist()))
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate (op, dtype, hardware) groups in a tolerance table")
        return cls(ds)

    def _group_dicts(self) -> list[dict[str, Any]]:
        c = self._cols()
        a = c.arrays
        thr, est, bud, conf = a["threshold"], a["estimate"], a["budget"], a["stat_confidence"]
        meth, reas, tops = a["method"], a["reason"], a["top_scores"]
        tails = {k: a[f"tail_{k}"] for k in TAIL_KEYS}
        out = []
        for i, (op, dt, hw) in enumerate(c.groups):
            st = {}
            for j, s in enumerate(c.statistics):
                top = tops[i, j]
                st[s] = {
                    "threshold": _f(thr[i, j]),
                    "estimate": _f(est[i, j]),
                    "budget": _f(bud[i, j]),
                    "confidence": _f(conf[i, j]),
                    "method": str(meth[i, j]),
                    "reason": str(reas[i, j]),
                    "tail": {k: _f(v[i, j]) for k, v in tails.items()},
                    "top_scores": [_f(v) for v in top[~np.isnan(top)]],
                }
            sj, cj = c.text("scale_json", i), c.text("certificate_json", i)
            out.append({
                "op": op,
                "dtype": dt,
                "hardware": hw,
                "n": int(a["n"][i]),
                "n_inexact": int(a["n_inexact"][i]) if "n_inexact" in a else 0,
                "scale": json.loads(sj) if sj else None,
                **({"certificate": json.loads(cj)} if cj else {}),
                "statistics": st,
            })
        return out

    def checksums(self) -> dict[str, Any]:
        """The integrity checksums :meth:`to_json` and :meth:`to_netcdf` write.

        Returns
        -------
        dict
            ``{"groups": [...], "table": ...}``: per group (in table order) the
            ``"sha256:<hex>"`` of the canonical JSON (sorted keys, no spaces) of every
            stored field of the group (thresholds, budgets, methods, scores, the scale
            model, the certificate, ...; not the derived ``user_units``), and for the table
            the digest of its settings (:data:`CHECKSUM_SETTINGS`) and the sorted
            ``(group, checksum)`` list, so that an added or removed group is seen.
            :func:`load_table` recomputes them and refuses a table whose stored fields
            were edited.
        """
        gd = self._group_dicts()
        sums = [_digest(g) for g in gd]
        meta = self.meta
        listing = sorted([g["op"], g["dtype"], g["hardware"], h] for g, h in zip(gd, sums))
        return {"groups": sums, "table": _digest({"settings": {k: meta[k] for k in CHECKSUM_SETTINGS},
                                                  "groups": listing})}

    @property
    def meta(self) -> dict[str, Any]:
        """Table-level settings (budget, confidence, form, statistics, provenance)."""
        a = self.data.attrs
        return {
            "tolstat_table": TABLE_SCHEMA,
            "tolstat_version": str(a.get("tolstat_version", "")),
            "fp_budget": _f(a["fp_budget"]),
            "confidence": _f(a["confidence"]),
            "form": str(a.get("form", "")) or None,
            "statistics": [x for x in str(a["statistics"]).split(",") if x],
            "budget_split": str(a.get("budget_split", "")),
            "provenance": json.loads(str(a.get("provenance", "{}"))),
        }

    @property
    def fp_budget(self) -> float:
        """False-positive budget of one check."""
        return float(self.data.attrs["fp_budget"])

    @property
    def confidence(self) -> float:
        """Confidence of the promise."""
        return float(self.data.attrs["confidence"])

    @property
    def statistics(self) -> list[str]:
        """Statistic names, max-error statistic first."""
        return list(self._cols().statistics)

    @property
    def groups(self) -> list[tuple[str, str, str]]:
        """The (op, dtype, hardware) groups of the table."""
        return list(self._cols().groups)

    def __len__(self) -> int:
        return self.data.sizes["group"]

    def __repr__(self) -> str:
        lines = [f"<ToleranceTable: {len(self)} groups, fp_budget={self.fp_budget:g}, "
                 f"confidence={self.confidence:g}, form={self.meta['form']}, statistics={self.statistics}>"]
        c = self._cols()
        for i, (op, dt, hw) in enumerate(c.groups[:20]):
            thr = ", ".join(f"{s}={c.arrays['threshold'][i, j]:.4g} ({c.arrays['method'][i, j]})"
                            for j, s in enumerate(c.statistics))
            lines.append(f"  {op} / {dt} / {hw}: n={int(c.arrays['n'][i])}: {thr}")
        if len(self) > 20:
            lines.append(f"  ... {len(self) - 20} more")
        return "\n".join(lines)

    def pool_members(self, pool: Any) -> list[tuple[str, str, str]]:
        """The groups whose scores a pooled group borrowed.

        Parameters
        ----------
        pool : str or mapping
            A pool id (``"pool:<hex>"``) or a certificate's ``pool`` field
            (``entry.certificate["pool"]``: ``{"id", "size"}``, or the list of member
            labels of tables written before pools were referenced).

        Returns
        -------
        list of (op, dtype, hardware)
            The member groups of this table, in table order: those whose certificate
            lists the pool under ``member_of`` (each pool is recorded once per member,
            so the table is linear in its groups).
        """
        if isinstance(pool, list):  # an old table's inline list of labels "(op, dtype, hardware)"
            wanted = set(map(str, pool))
            return [k for k in self._cols().groups if "(" + ", ".join(k) + ")" in wanted]
        pid = pool.get("id") if isinstance(pool, Mapping) else pool
        if not (isinstance(pid, str) and pid.startswith("pool:")):
            raise ValueError(f"pool must be a pool id 'pool:<hex>' or a certificate's pool field, got {pool!r}")
        c = self._cols()
        out = []
        for i, k in enumerate(c.groups):
            cj = c.text("certificate_json", i)
            if cj and pid in cj and pid in json.loads(cj).get("member_of", []):
                out.append(k)
        return out

    # ---- lookup
    def _find(self, op: str, dtype: str, hardware: str | None) -> tuple[int, str] | None:
        c = self._cols()
        idx = c.index
        for o, tag in ((op, ""), (ANY, "default op, ")):
            if hardware is not None and (o, dtype, hardware) in idx:
                return idx[(o, dtype, hardware)], tag + "exact"
            if (o, dtype, ANY) in idx:
                return idx[(o, dtype, ANY)], tag + "any hardware"
            if hardware is None:
                hws = c.by_op_dtype.get((o, dtype), [])
                if len(hws) == 1:
                    return idx[hws[0]], tag + "only hardware"
                if len(hws) > 1:
                    raise KeyError(
                        f"(op={op!r}, dtype={dtype!r}) is calibrated on several hardware "
                        f"{sorted(k[2] for k in hws)}; pass hardware=... (or calibrate with "
                        "by=('op', 'dtype') for a '*' entry)"
                    )
        return None

    def entry(self, op: str, dtype: Any, hardware: str | None = None, *,
              hardware_policy: str | None = None) -> ToleranceEntry:
        """The thresholds for (op, dtype, hardware), with the declared fallbacks.

        Parameters
        ----------
        op, dtype : str
            The group (any dtype spelling).
        hardware : str, optional
            Hardware label. With a ``hardware_policy`` and no ``hardware``, this
            machine's label (:func:`tolstat.dataset.hardware_fingerprint`).
        hardware_policy : {None, "exact", "pooled", "nearest", "error"}
            What to do when ``hardware`` is not calibrated (:mod:`tolstat.calibration.hwpolicy`);
            ``None`` keeps the fallbacks of the class docstring.

        Raises
        ------
        KeyError
            No group matches; the message lists the groups available (with a policy:
            this machine's hardware and the table's).
        """
        dt = canonical_dtype(dtype)
        if hardware_policy is not None:  # explicit hardware policy (tolstat.calibration.hwpolicy)
            from tolstat.calibration import hwpolicy

            hw = str(hardware) if hardware is not None else hwpolicy.machine_hardware()
            c = self._cols()
            hit = hwpolicy.resolve_group(c.groups, c.arrays["threshold"][:, 0], str(op), dt, hw, hardware_policy,
                                         index=c.index, by_op_dtype=c.by_op_dtype)
            hardware = hw
        else:
            hit = self._find(str(op), dt, None if hardware is None else str(hardware))
        if hit is None:
            avail = ", ".join(f"({o}, {d}, {h})" for o, d, h in self.groups)
            raise MissingGroup(
                f"no tolerance for op={op!r}, dtype={dt!r}, hardware={hardware!r} (fallbacks tried: exact "
                f"hardware, hardware '*', op '*'); available groups: {avail}"
            )
        i, how = hit
        c = self._cols()
        a = c.arrays
        cj = c.text("certificate_json", i)
        cert = json.loads(cj) if cj else None
        stats: dict[str, Calibration] = {}
        for j, s in enumerate(c.statistics):
            thr = float(a["threshold"][i, j])
            if math.isnan(thr):
                raise KeyError(f"group ({op}, {dt}, {c.groups[i][2]}) has no {s} threshold: "
                               f"{a['reason'][i, j]}")
            top = a["top_scores"][i, j]
            stats[s] = Calibration(
                statistic=s, threshold=thr, estimate=float(a["estimate"][i, j]),
                budget=float(a["budget"][i, j]), confidence=float(a["stat_confidence"][i, j]),
                method=str(a["method"][i, j]), reason=str(a["reason"][i, j]),
                # the calibration scores the threshold was certified on (units, not runs)
                n=int((cert or {}).get("n_scores") or a["n"][i]),
                tail={k: float(a[f"tail_{k}"][i, j]) for k in TAIL_KEYS},
                top=top[~np.isnan(top)],
            )
        sj = c.text("scale_json", i)
        return ToleranceEntry(
            op=c.groups[i][0], dtype=dt, hardware=c.groups[i][2],
            requested_hardware=hardware, fallback=how, n=int(a["n"][i]), statistics=stats,
            scale=ScaleModel.from_dict(json.loads(sj)) if sj else None,
            fp_budget=self.fp_budget, confidence=self.confidence, certificate=cert,
        )


    # ---- export
    def to_dict(self) -> dict[str, Any]:
        """The JSON layout: ``{"tolstat_table": 1, ..., "groups": [...]}``."""
        out = self.meta
        out["groups"] = self._group_dicts()
        return out

    def to_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write (and return) the table as stable, human-readable, versioned JSON.

        Floats are written with ``repr`` (shortest exact round trip); ``inf``/``nan``
        as the strings ``"inf"``/``"nan"``. Keys are sorted, so equal tables give equal
        files. Each group and the table carry a ``"checksum"`` (:meth:`checksums`), which
        :func:`load_table` verifies.
        """
        from tolstat.calibration.review import table_json

        text = table_json(self)
        if path is not None:
            atomic_write_text(path, text)
        return text

    def to_netcdf(self, path: str | os.PathLike[str]) -> Path:
        """Write the table's dataset to netCDF-4 (h5netcdf), atomically.

        The file also holds the :meth:`checksums`: a per-group variable ``checksum`` and
        the attribute ``checksum`` (:func:`load_table` verifies and removes them).
        """
        sums = self.checksums()
        ds = self.data.assign(checksum=("group", np.array(sums["groups"], dtype=str)))
        ds.attrs["checksum"] = sums["table"]
        return atomic_write(path, lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))


    def to_assert_close_kwargs(
        self,
        hardware: str | None = None,
        covariates: Mapping[str, Any] | None = None,
        *,
        skip_unsupported: bool = True,
        hardware_policy: str | None = None,
    ) -> dict[tuple[str, str], dict[str, float]]:
        """``{(op, dtype): {"atol": ..., "rtol": ...}}`` for ``torch.testing.assert_close``.

        This is the form of PyTorch's ``toleranceOverride({dtype: tol(atol, rtol)})``.
        Only the max-error statistic is translated (a bias statistic has no allclose
        form; use :func:`tolstat.check` for it).

        Parameters
        ----------
        hardware : str, optional
            Which hardware's groups (with the usual fallbacks).
        covariates : mapping, optional
            Run covariates of a size-aware / normalised scale (e.g. ``{"K": 512}``;
            ``ref_rms`` for a linear ``ref_rms`` term).
        skip_unsupported : bool, default True
            Leave out groups without an allclose form (``max_ulp``, baseline-relative,
            missing covariates) instead of raising.
        """
        out: dict[tuple[str, str], dict[str, float]] = {}
        for op, dt in dict.fromkeys((o, d) for o, d, _ in self.groups):
            try:
                atol, rtol = self.entry(op, dt, hardware, hardware_policy=hardware_policy).allclose(covariates)
            except (ValueError, KeyError):
                if skip_unsupported:
                    continue
                raise
            out[(op, dt)] = {"atol": atol, "rtol": rtol}
        return out


def load_table(path: str | os.PathLike[str], *, verify: bool = True) -> ToleranceTable:
    """Read a table written by :meth:`ToleranceTable.to_json` or :meth:`~ToleranceTable.to_netcdf`.

    Every value is validated (:func:`~tolstat.calibration.table_format.check_table_data`): a table that could switch a
    check off (an infinite or negative threshold, a budget out of range, an unknown
    statistic, a certificate without normalisers or with normalisers that are not finite
    and positive or not the group's statistics, a scale model of an unknown form or with
    negative coefficients, ...) is refused. With ``verify`` the checksums the writer
    stored (:meth:`ToleranceTable.checksums`) are recomputed: a table whose stored fields
    were edited after it was saved (normalisers multiplied by 1e6 are finite and positive,
    but not what was calibrated) is refused, naming the groups. Tables saved before
    checksums were written (no checksum at all) load as before.

    Parameters
    ----------
    path : str or path-like
        ``.json`` or ``.nc`` (``.nc4``, ``.h5``, ``.netcdf``).
    verify : bool, default True
        Verify the checksums. ``False`` accepts an edited table on purpose (its values are
        still validated); saving it again writes new checksums.

    Raises
    ------
    FileNotFoundError
        No such file.
    TypeError
        ``verify`` is not a bool.
    ValueError
        A directory, an unknown extension, unreadable/truncated/corrupt content, not a
        tolstat table, an unsupported schema version, an invalid value, or (``verify``)
        a checksum that does not match; the message names the file and the problem.
    """
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be True or False, got {verify!r}")
    p = Path(path)
    src = os.fspath(p)
    if not p.exists():
        raise FileNotFoundError(f"no tolerance table at {src!r}")
    if p.is_dir():
        raise ValueError(f"{src!r} is a directory, not a tolerance table file (.json or .nc)")
    suffix = p.suffix.lower()
    if suffix == ".json":
        table, stored = _load_json(p, src)
    elif suffix not in (".nc", ".nc4", ".h5", ".netcdf"):
        raise ValueError(f"{src!r}: a tolerance table ends in .json or .nc, got {p.suffix!r}")
    else:
        table, stored = _load_netcdf(p, src)
    if verify:
        _verify_checksums(table, *stored, src)
    return table


def _load_netcdf(p: Path, src: str) -> tuple[ToleranceTable, tuple[Any, list[Any]]]:
    try:
        ds = xr.open_dataset(p, engine="h5netcdf").load()
        ds.close()
    except Exception as exc:  # h5py/h5netcdf raise OSError, ValueError, KeyError...
        raise ValueError(f"cannot read {src!r} as a netCDF tolerance table (truncated or corrupt?): "
                         f"{type(exc).__name__}: {exc}") from exc
    for v in ("op", "dtype", "hardware", "statistic", "method", "reason", "scale_json", "certificate_json",
              "checksum"):
        if v in ds.variables and ds[v].dtype.kind == "O":
            ds[v] = ds[v].astype(str)
    table_sum = ds.attrs.pop("checksum", None)
    sums: list[Any] = [None] * ds.sizes.get("group", 0)
    if "checksum" in ds.variables:
        sums = [str(x) for x in ds["checksum"].values]
        ds = ds.drop_vars("checksum")
    return ToleranceTable(ds, source=src), (table_sum, sums)


def _load_json(p: Path, src: str) -> tuple[ToleranceTable, tuple[Any, list[Any]]]:
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{src!r} is not valid JSON (truncated?): {exc}") from exc
    except RecursionError:
        raise ValueError(f"{src!r} is nested too deeply to be a tolerance table") from None
    if not isinstance(d, dict) or "tolstat_table" not in d:
        raise ValueError(f"{src!r} is not a tolstat tolerance table (no 'tolstat_table' key)")
    if d["tolstat_table"] != TABLE_SCHEMA:
        raise ValueError(f"{src!r}: table schema {d['tolstat_table']!r} is not supported "
                         f"(this tolstat reads {TABLE_SCHEMA})")
    for k in ("groups", "fp_budget", "confidence", "statistics"):
        if k not in d:
            raise ValueError(f"{src!r}: missing key {k!r}")
    if isinstance(d.get("volatile"), dict):  # reviewable layout (tolstat.calibration.review): keep it
        prov = d.get("provenance", {})
        d["provenance"] = {**(prov if isinstance(prov, dict) else {}), "volatile": d["volatile"]}
    try:
        table = ToleranceTable.from_groups(d["groups"], d)
    except ValueError as exc:
        raise ValueError(f"{src!r}: {exc}") from exc
    return table, (d.get("checksum"), [g.get("checksum") for g in d["groups"]])


def _verify_checksums(table: ToleranceTable, table_sum: Any, group_sums: list[Any], src: str) -> None:
    """Refuse a table whose stored fields do not match the checksums its writer stored."""
    if table_sum is None and all(h is None for h in group_sums):
        return  # written before checksums: nothing to verify (docs/errors.md)
    where = f"tolerance table {src!r}"
    keys = table._cols().groups

    def name(i: int) -> str:
        return f"group {keys[i]}"

    for i, h in enumerate(group_sums):
        if h is None:
            raise ValueError(f"{where}: {name(i)} has no checksum, though the table has checksums (a group added "
                             f"or changed by hand?); {_ACCEPT_EDIT}")
        if not (isinstance(h, str) and h.startswith("sha256:")):
            raise ValueError(f"{where}: {name(i)}: checksum must be a string 'sha256:<hex>', got {h!r}")
    if not (isinstance(table_sum, str) and table_sum.startswith("sha256:")):
        raise ValueError(f"{where}: the table checksum must be a string 'sha256:<hex>', got {table_sum!r} (the "
                         f"groups have checksums); {_ACCEPT_EDIT}")
    now = table.checksums()
    edited = [i for i, (h, n) in enumerate(zip(group_sums, now["groups"])) if h != n]
    if edited:
        listed = ", ".join(str(keys[i]) for i in edited[:5]) + (f" and {len(edited) - 5} more" if len(edited) > 5
                                                                 else "")
        what = f"group {listed} was" if len(edited) == 1 else f"groups {listed} were"
        raise ValueError(f"{where}: {what} edited after it was saved: the stored fields (thresholds, budgets, scale "
                         f"model, certificate, ...) do not match the checksum written with them; {_ACCEPT_EDIT}")
    if table_sum != now["table"]:
        raise ValueError(f"{where}: the table settings or its list of groups were edited after it was saved "
                         f"({', '.join(CHECKSUM_SETTINGS)}, or a group added or removed): they do not match the "
                         f"table checksum; {_ACCEPT_EDIT}")
