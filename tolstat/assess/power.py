"""What a tolerance can catch: the power of a table's decision per group.

A table states its false-positive budget (how often a *correct* kernel fails); this
module says what a *wrong* kernel must do to fail. From calibration references ``e``
(float64) of a group it makes **standard wrong outputs** (:data:`WRONG_OUTPUTS`: all
zeros, the reference's mean everywhere, a sign flip, the output rolled by one element,
a row shift and a transposed block for 2-D+ outputs, ``e * (1 + s)``, ``e + s * rms(e)``,
and rounding through a coarser format), each rounded to the group's dtype as a kernel's
store would be, and runs them through the group's decision. It reports per group and
rule

* which standard wrong outputs are caught (the share of references on which they fail);
* the smallest relative scale error ``eps`` (output ``e * (1 + eps)``) and the smallest
  offset ``eps`` (output ``e + eps * rms(e)``, in units of ``rms(e)``) caught on at least
  ``coverage`` (default 90%) of the references, by bisection on a log scale within
  ``bounds`` (default ``1e-6 .. 10``; ``inf``: not caught at the upper bound);
* ``trivial_pass``: the all-zero or the constant (mean) output passes on some reference
  it is wrong for: the rule cannot tell a kernel that returns nothing from a correct one.

The same is computed for the peers' rules beside the table (torch's ``assert_close``
defaults and ``atol = rtol = 1e-2`` by default: the data-free rules of
:mod:`tolstat.assess.rules`), so a reader sees what the calibrated table buys.

**One decision.** The wrong outputs are recorded into an error dataset with
:func:`tolstat.from_pairs` (with the reference's magnitude and covariates, so that
operator-form groups get what their check needs), and decided exactly as
:func:`tolstat.check_runs` decides, which is :func:`tolstat.check` run by run: the
table's decision is :func:`tolstat.calibration.decision.entry_failed_runs` of the group's
entry; a peer's is its :class:`tolstat.assess.rules.Rule` score over 1, as in
:func:`tolstat.compare`. Nothing here re-implements a comparison.

**Why references are passed in.** An error dataset stores per run its error statistics
and a sample of elements, not the reference itself; a wrong output is a function of
the whole reference, so the references (with the magnitude and the covariates of each
run, e.g. ``K``) are an argument: :func:`power_report` takes them per group, and
:func:`corpus_references` gives those of the embedded corpus's calibration cases.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import xarray as xr

from tolstat._base.dtypes import canonical_dtype, round_to_format
from tolstat._base.util import atomic_write_text
from tolstat.assess.rules import Rule, make_rule
from tolstat.calibration.decision import entry_failed_runs
from tolstat.calibration.table import ToleranceTable
from tolstat.dataset.collection import from_pairs
from tolstat.dataset.options import CollectOptions
from tolstat.measure.metrics import ulp_distance

__all__ = [
    "WRONG_OUTPUTS",
    "COARSER",
    "DEFAULT_PEERS",
    "TABLE_RULE",
    "Reference",
    "PowerReport",
    "power_report",
    "wrong_outputs",
    "corpus_references",
    "save_references",
    "load_references",
]

#: the standard wrong outputs, in report order
WRONG_OUTPUTS = ("zeros", "mean", "sign_flip", "roll_element", "roll_row", "transpose_block", "scale",
                 "offset", "coarser")
#: the coarser format each output format is rounded through (``coarser``)
COARSER = {"float64": "float32", "float32": "bfloat16", "float16": "bfloat16", "bfloat16": "float8_e4m3fn"}
#: the peers' rules reported beside the table (names of :data:`tolstat.assess.rules.METHODS`)
DEFAULT_PEERS = ("torch-defaults", "atol=rtol=1e-2")
#: the name of the table's own rule in a report
TABLE_RULE = "tolstat"
_HARDWARE = "power-report"


@dataclass(frozen=True)
class Reference:
    """One calibration reference of a group and what a check of an output against it needs.

    Attributes
    ----------
    expected : numpy.ndarray
        The float64 reference.
    magnitude : numpy.ndarray, optional
        The op applied to the absolute inputs (operator-form groups; see :func:`tolstat.check`).
    covariates : dict
        Run covariates (e.g. ``{"K": 512}``).
    """

    expected: np.ndarray
    magnitude: np.ndarray | None = None
    covariates: Mapping[str, float] = field(default_factory=dict)


def _as_reference(item: Any, where: str) -> Reference:
    """A :class:`Reference` from one, an array, ``(expected, extras)`` or a mapping."""
    if isinstance(item, Reference):
        ref = item
    elif isinstance(item, Mapping):
        if "expected" not in item:
            raise ValueError(f"{where}: a reference mapping needs the key 'expected', got {sorted(item)}")
        ref = Reference(item["expected"], item.get("magnitude"), dict(item.get("covariates") or {}))
    elif isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[1], Mapping):
            raise ValueError(f"{where}: a reference tuple must be (expected, extras) with extras a mapping of "
                             "'magnitude' and 'covariates'")
        ref = Reference(item[0], item[1].get("magnitude"), dict(item[1].get("covariates") or {}))
    else:
        ref = Reference(item)
    e = np.asarray(ref.expected, dtype=np.float64)
    if e.size == 0 or not np.isfinite(e).all():
        raise ValueError(f"{where}: a reference must be a non-empty finite array, got shape {e.shape}")
    mag = None if ref.magnitude is None else np.asarray(ref.magnitude, dtype=np.float64)
    if mag is not None and mag.shape != e.shape:
        raise ValueError(f"{where}: magnitude shape {mag.shape} differs from the reference's {e.shape}")
    return Reference(e, mag, {str(k): float(v) for k, v in dict(ref.covariates).items()})


# --------------------------------------------------------------------------- wrong outputs
def _rms(e: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(e))))


def _transpose_block(e: np.ndarray) -> np.ndarray | None:
    s = min(e.shape[-2], e.shape[-1])
    if s < 2:
        return None
    out = e.copy()
    out[..., :s, :s] = np.swapaxes(e[..., :s, :s], -1, -2)
    return out


def _wrong64(kind: str, e: np.ndarray, size: float) -> np.ndarray | None:
    """Wrong output ``kind`` of reference ``e`` in float64, or None where it does not apply."""
    if kind == "zeros":
        return np.zeros_like(e)
    if kind == "mean":
        return np.full_like(e, float(np.mean(e)))
    if kind == "sign_flip":
        return -e
    if kind == "roll_element":
        return np.roll(e, 1, axis=-1) if e.ndim >= 1 and e.shape[-1] > 1 else None
    if kind == "roll_row":
        return np.roll(e, 1, axis=-2) if e.ndim >= 2 and e.shape[-2] > 1 else None
    if kind == "transpose_block":
        return _transpose_block(e) if e.ndim >= 2 else None
    if kind == "scale":
        return e * (1.0 + size)
    if kind == "offset":
        return e + size * _rms(e)
    raise ValueError(f"unknown wrong output {kind!r}; known: {WRONG_OUTPUTS}")


def wrong_outputs(expected: Any, dtype: Any, *, size: float = 1e-2) -> dict[str, np.ndarray]:
    """The standard wrong outputs of one reference, rounded to ``dtype`` as a kernel stores them.

    Parameters
    ----------
    expected : array_like
        The float64 reference ``e``.
    dtype : str or dtype
        The output format (any spelling :func:`tolstat._base.dtypes.canonical_dtype` takes).
    size : float, default 1e-2
        The relative error of ``scale`` (``e * (1 + size)``) and ``offset``
        (``e + size * rms(e)``).

    Returns
    -------
    dict
        ``{kind: output}`` for the kinds of :data:`WRONG_OUTPUTS` that apply to the
        shape (``roll_row`` and ``transpose_block`` need 2-D outputs; ``coarser`` a format
        in :data:`COARSER`).
    """
    dt = canonical_dtype(dtype)
    if not (isinstance(size, (int, float)) and math.isfinite(size) and size > 0):
        raise ValueError(f"size must be a positive finite number, got {size!r}")
    e = np.asarray(expected, dtype=np.float64)
    out = {}
    for kind in WRONG_OUTPUTS:
        if kind == "coarser":
            if dt in COARSER:
                out[kind] = round_to_format(round_to_format(e, COARSER[dt]).astype(np.float64), dt)
            continue
        w = _wrong64(kind, e, size)
        if w is not None:
            out[kind] = round_to_format(w, dt)
    return out


def _is_wrong(out: np.ndarray, e: np.ndarray, dtype: str) -> bool:
    """Whether ``out`` is more than one ULP from the rounded reference somewhere (the
    ``detectable`` convention of :mod:`tolstat.assess.corpus_runs`)."""
    with np.errstate(all="ignore"):
        return bool(np.any(ulp_distance(out, e, dtype) > 1.0))


# --------------------------------------------------------------------------- decisions
@dataclass
class _Group:
    """One table group, its references and how its wrong outputs are recorded."""

    key: tuple[str, str, str]
    entry: Any
    refs: list[Reference]
    options: CollectOptions
    magnitude: bool

    def dataset(self, outputs: Sequence[tuple[int, np.ndarray]]) -> xr.Dataset:
        """The error dataset of ``(reference index, output)`` pairs, as a collection records them."""
        pairs = []
        for i, a in outputs:
            r = self.refs[i]
            pairs.append((a, r.expected, r.magnitude, {"ref": str(i)}, dict(r.covariates)) if self.magnitude
                         else (a, r.expected, {"ref": str(i)}, dict(r.covariates)))
        return from_pairs(pairs, op=self.key[0], dtype=self.key[1], hardware=_HARDWARE, options=self.options)


def _group(table: ToleranceTable, key: tuple[str, str, str], refs: list[Reference]) -> _Group:
    """The group's entry and recording options; a clear error when its check cannot be run."""
    op, dt, hw = key
    ent = table.entry(op, dt, hw)
    cert = ent.certificate or {}
    where = f"table group ({op}, {dt}, {hw})"
    needs = bool(ent.operator and cert.get("needs_magnitude", True))
    if needs and any(r.magnitude is None for r in refs):
        raise ValueError(f"{where} is checked with operator statistics: every reference needs its magnitude "
                         "(the op on the absolute inputs), as tolstat.check needs it")
    need_cov = [c for c in cert.get("covariates", []) if c == "K"] + list(ent.scale.covariates if ent.scale else [])
    for c in need_cov:
        if c not in ("ref_rms", "ref_max_abs", "n_elements") and any(c not in r.covariates for r in refs):
            raise ValueError(f"{where} needs the covariate {c!r} of every reference (as tolstat.check needs it)")
    opts = CollectOptions(sample_size=256, progress=False, rowwise=bool(cert.get("rowwise", False)),
                          magnitude="ref" if ent.operator and not needs else None)
    return _Group(key, ent, refs, opts, needs)


_Decide = Callable[[xr.Dataset], "np.ndarray | None"]


def _deciders(table: ToleranceTable, group: _Group, peers: Sequence[Rule]) -> dict[str, _Decide]:
    """``{rule: failed(ds)}``: the table's decision of the group and each peer's (None: no decision)."""
    ent = group.entry
    refused = any(math.isnan(float(s.threshold)) for s in ent.statistics.values())

    def table_rule(ds: xr.Dataset) -> np.ndarray | None:
        return None if refused else np.asarray(entry_failed_runs(ds, ent), dtype=bool)

    out: dict[str, _Decide] = {TABLE_RULE: table_rule}
    for rule in peers:
        fitted = rule.fit(None, budget=table.fp_budget, confidence=table.confidence,
                          by=("op", "dtype", "hardware"))

        def peer_rule(ds: xr.Dataset, fitted: Any = fitted) -> np.ndarray | None:
            s = np.asarray(fitted.score(ds), dtype=np.float64)
            return None if np.isnan(s).any() else s > 1.0

        out[rule.name] = peer_rule
    return out


def _share(failed: np.ndarray | None) -> float:
    return math.nan if failed is None or failed.size == 0 else float(np.mean(failed))


def _standard(group: _Group, deciders: Mapping[str, _Decide], size: float
              ) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Caught share of every standard wrong output per rule, and the references it is wrong for."""
    dt = group.key[1]
    outputs: list[tuple[int, np.ndarray]] = []
    kinds: list[str] = []
    for i, r in enumerate(group.refs):
        for kind, out in wrong_outputs(r.expected, dt, size=size).items():
            if _is_wrong(out, r.expected, dt):
                outputs.append((i, out))
                kinds.append(kind)
    karr = np.array(kinds, dtype=object)
    counts = {k: int(np.sum(karr == k)) for k in WRONG_OUTPUTS}
    shares: dict[str, dict[str, float]] = {name: {k: math.nan for k in WRONG_OUTPUTS} for name in deciders}
    if not outputs:
        return shares, counts
    ds = group.dataset(outputs)
    for name, decide in deciders.items():
        failed = decide(ds)
        for k in WRONG_OUTPUTS:
            if counts[k]:
                shares[name][k] = _share(None if failed is None else failed[karr == k])
    return shares, counts


class _Sweep:
    """The error datasets of one size-parametrised wrong output (``scale``/``offset``) of
    every reference, made once per size and shared by the rules' bisections."""

    def __init__(self, group: _Group, kind: str):
        self.group, self.kind, self.cache = group, kind, {}

    def share(self, decide: _Decide, size: float) -> float:
        if size not in self.cache:
            dt = self.group.key[1]
            outs = [(i, round_to_format(_wrong64(self.kind, r.expected, size), dt))
                    for i, r in enumerate(self.group.refs)]
            self.cache[size] = self.group.dataset(outs)
        return _share(decide(self.cache[size]))


def _bisect(share: Callable[[float], float], coverage: float, bounds: tuple[float, float],
            resolution: float) -> float:
    """Smallest size in ``bounds`` whose caught share is at least ``coverage``, by bisection
    on a log scale to a ratio ``resolution`` (the size returned is caught); ``inf`` when the
    upper bound is not caught, the lower bound when it is caught already, NaN without a decision."""
    lo, hi = bounds
    s_hi = share(hi)
    if math.isnan(s_hi):
        return math.nan
    if s_hi < coverage:
        return math.inf
    if share(lo) >= coverage:
        return lo
    a, b = math.log(lo), math.log(hi)
    while b - a > math.log(resolution):
        m = 0.5 * (a + b)
        if share(math.exp(m)) >= coverage:
            b = m
        else:
            a = m
    return math.exp(b)


# --------------------------------------------------------------------------- report
def _fmt_size(v: float, lo: float, hi: float) -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return f"> {hi:g}"
    return f"<= {lo:g}" if v <= lo else f"{v:.2g}"


def _fmt_share(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.0f}%"


def _md(rows: Sequence[Sequence[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


@dataclass(frozen=True)
class PowerReport:
    """What each rule catches per group (:func:`power_report`).

    Attributes
    ----------
    data : xarray.Dataset
        Dims ``group`` (coords ``op``, ``dtype``, ``hardware``), ``rule`` (the table's
        rule ``"tolstat"`` first, then the peers) and ``wrong`` (:data:`WRONG_OUTPUTS`).
        Variables: ``caught`` (group, rule, wrong): share of the references on which the
        wrong output fails (NaN: it applies to no reference, or the rule has no decision);
        ``n_wrong`` (group, wrong): references the output applies to and is wrong for (more
        than one ULP from the rounded reference somewhere); ``min_scale`` and
        ``min_offset`` (group, rule): the smallest relative scale error and offset (units of
        ``rms(e)``) caught on at least ``coverage`` of the references (``inf``: not at the
        upper bound; the lower bound: caught there already); ``trivial_pass`` (group, rule):
        the all-zero or the mean output passes on some reference; ``n_references`` (group).
        Attributes ``coverage``, ``bounds``, ``size``, ``resolution``.
    """

    data: xr.Dataset

    @property
    def groups(self) -> list[tuple[str, str, str]]:
        """The groups, as ``(op, dtype, hardware)``."""
        d = self.data
        return [(str(o), str(t), str(h)) for o, t, h in zip(d["op"].values, d["dtype"].values,
                                                             d["hardware"].values)]

    @property
    def rules(self) -> list[str]:
        """The rules: ``"tolstat"`` (the table) and the peers."""
        return [str(r) for r in self.data["rule"].values]

    def trivial(self, rule: str = TABLE_RULE) -> list[tuple[str, str, str]]:
        """The groups whose decision under ``rule`` passes an all-zero or a constant output."""
        if rule not in self.rules:
            raise ValueError(f"rule must be one of {self.rules}, got {rule!r}")
        flags = self.data["trivial_pass"].sel(rule=rule).values
        return [g for g, f in zip(self.groups, flags) if bool(f)]

    def smallest_table(self) -> str:
        """Markdown: the smallest caught scale error and offset per group, one column per rule."""
        lo, hi = self.data.attrs["bounds"]
        head = ["op", "dtype", "refs"] + [f"scale: {r}" for r in self.rules] + [f"offset: {r}" for r in self.rules]
        rows = [head]
        for i, (op, dt, _) in enumerate(self.groups):
            row = [op, dt, str(int(self.data["n_references"].values[i]))]
            for var in ("min_scale", "min_offset"):
                row += [_fmt_size(float(v), lo, hi) for v in self.data[var].values[i]]
            rows.append(row)
        return _md(rows)

    def caught_table(self) -> str:
        """Markdown: the share of references on which each standard wrong output fails, per group and rule."""
        size = self.data.attrs["size"]
        names = [f"{k} {size:g}" if k in ("scale", "offset") else k for k in WRONG_OUTPUTS]
        rows = [["op", "dtype", "rule", *names, "trivial pass"]]
        for i, (op, dt, _) in enumerate(self.groups):
            for j, rule in enumerate(self.rules):
                cells = [_fmt_share(float(v)) for v in self.data["caught"].values[i, j]]
                rows.append([op, dt, rule, *cells, "YES" if self.data["trivial_pass"].values[i, j] else ""])
        return _md(rows)

    def to_markdown(self) -> str:
        """Both tables (:meth:`smallest_table`, :meth:`caught_table`) with their settings."""
        a = self.data.attrs
        lo, hi = a["bounds"]
        return (f"Smallest error caught on at least {100 * a['coverage']:g}% of the references "
                f"(scale: output e*(1+eps); offset: e + eps*rms(e); bisection on {lo:g}..{hi:g}):\n\n"
                + self.smallest_table()
                + "\n\nShare of references on which each standard wrong output fails:\n\n" + self.caught_table())

    def summary(self) -> str:
        """A few lines: per rule, the groups that pass trivial outputs and the median smallest errors."""
        lines = []
        for j, rule in enumerate(self.rules):
            triv = self.trivial(rule)
            ms = np.asarray(self.data["min_scale"].values[:, j], dtype=np.float64)
            mo = np.asarray(self.data["min_offset"].values[:, j], dtype=np.float64)
            med = [f"{np.median(x[~np.isnan(x)]):.2g}" if (~np.isnan(x)).any() else "-" for x in (ms, mo)]
            lines.append(f"{rule}: {len(triv)} of {len(self.groups)} groups pass an all-zero or constant output"
                         + (" (" + ", ".join(f"{o}/{d}" for o, d, _ in triv) + ")" if triv else "")
                         + f"; median smallest caught scale error {med[0]}, offset {med[1]} x rms")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: settings and one record per (group, rule)."""
        d = self.data
        recs = []
        for i, (op, dt, hw) in enumerate(self.groups):
            for j, rule in enumerate(self.rules):
                recs.append({"op": op, "dtype": dt, "hardware": hw, "rule": rule,
                             "n_references": int(d["n_references"].values[i]),
                             "min_scale": _json_float(d["min_scale"].values[i, j]),
                             "min_offset": _json_float(d["min_offset"].values[i, j]),
                             "trivial_pass": bool(d["trivial_pass"].values[i, j]),
                             "caught": {k: _json_float(v) for k, v in zip(WRONG_OUTPUTS, d["caught"].values[i, j])},
                             "n_wrong": {k: int(v) for k, v in zip(WRONG_OUTPUTS, d["n_wrong"].values[i])}})
        attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.attrs.items()}
        return {"settings": attrs, "groups": recs}

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (atomically)."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1))


def _json_float(v: Any) -> Any:
    v = float(v)
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else "inf")


def _lookup(references: Mapping[Any, Sequence[Any]], key: tuple[str, str, str]) -> list[Reference]:
    """The references of a table group: those keyed ``(op, dtype, hardware)``, else ``(op, dtype)``."""
    op, dt, hw = key
    norm: dict[tuple[str, ...], Sequence[Any]] = {}
    for k, v in references.items():
        if not (isinstance(k, tuple) and len(k) in (2, 3) and all(isinstance(x, str) for x in k)):
            raise ValueError(f"references keys must be (op, dtype) or (op, dtype, hardware) tuples, got {k!r}")
        norm[(k[0], canonical_dtype(k[1]), *k[2:])] = v
    items = norm.get((op, dt, hw), norm.get((op, dt)))
    where = f"table group ({op}, {dt}, {hw})"
    if items is None or len(items) == 0:
        raise ValueError(f"{where} has no references: pass references[({op!r}, {dt!r})] (a non-empty list of "
                         "float64 references), or leave the group out with groups=")
    return [_as_reference(it, f"{where}, reference {i}") for i, it in enumerate(items)]


def _settings(coverage: float, bounds: Sequence[float], size: float, resolution: float) -> tuple[float, float]:
    if not (isinstance(coverage, (int, float)) and 0 < coverage <= 1):
        raise ValueError(f"coverage must lie in (0, 1], got {coverage!r}")
    lo, hi = (float(b) for b in bounds)
    if not (0 < lo < hi < math.inf):
        raise ValueError(f"bounds must be (lo, hi) with 0 < lo < hi < inf, got {tuple(bounds)!r}")
    if not (math.isfinite(size) and size > 0):
        raise ValueError(f"size must be a positive finite number, got {size!r}")
    if not (math.isfinite(resolution) and resolution > 1):
        raise ValueError(f"resolution must be a finite number > 1, got {resolution!r}")
    return lo, hi


def _peer_rules(peers: Sequence[Any]) -> list[Rule]:
    rules = [make_rule(p) for p in peers]
    for r in rules:
        if not r.data_free:
            raise ValueError(f"peer rule {r.name!r} needs calibration data; power_report compares the table with "
                             "data-free rules (fixed rtol/atol per dtype), e.g. 'torch-defaults'")
    names = [TABLE_RULE] + [r.name for r in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"rule names must be distinct, got {names}")
    return rules


def power_report(
    table: ToleranceTable,
    references: Mapping[Any, Sequence[Any]],
    *,
    peers: Sequence[str | Mapping[str, Any] | Rule] = DEFAULT_PEERS,
    groups: Sequence[tuple[str, str, str]] | None = None,
    coverage: float = 0.9,
    bounds: tuple[float, float] = (1e-6, 10.0),
    size: float = 1e-2,
    resolution: float = 1.05,
) -> PowerReport:
    """What the table's decision, and the peers', catch per group (module docstring).

    Parameters
    ----------
    table : ToleranceTable
    references : mapping
        ``{(op, dtype) or (op, dtype, hardware): [reference, ...]}``; a reference is a
        :class:`Reference`, a float64 array, ``(expected, {"magnitude": m, "covariates":
        {...}})`` or a mapping with those keys and ``expected``. Operator-form groups need
        each reference's magnitude (unless calibrated with ``magnitude="ref"``) and ``K``.
        :func:`corpus_references` gives the corpus's.
    peers : sequence, default ("torch-defaults", "atol=rtol=1e-2")
        Data-free rules beside the table: names of :data:`tolstat.assess.rules.METHODS`,
        dicts ``{"atol": a, "rtol": r}`` or :class:`tolstat.assess.rules.Rule` objects.
    groups : sequence of (op, dtype, hardware), optional
        The table groups to report (default: all of them).
    coverage : float, default 0.9
        Share of the references on which a smallest error must be caught.
    bounds : (float, float), default (1e-6, 10)
        Range of the bisection of the smallest scale error and offset.
    size : float, default 1e-2
        Relative size of the standard ``scale`` and ``offset`` wrong outputs.
    resolution : float, default 1.05
        The bisection stops when the bracket's ratio is at most this.

    Returns
    -------
    PowerReport

    Raises
    ------
    ValueError
        A group without references (named), a reference that is not a finite array, a
        missing magnitude or covariate the group's check needs, a peer that needs data,
        settings out of range.
    KeyError
        A group of ``groups`` that the table does not have.
    """
    if not isinstance(table, ToleranceTable):
        raise TypeError(f"table must be a ToleranceTable, got {type(table).__name__}")
    lo, hi = _settings(coverage, bounds, size, resolution)
    rules = _peer_rules(peers)
    keys = [tuple(map(str, g)) for g in (table.groups if groups is None else groups)]
    if not keys:
        raise ValueError("the table has no groups to report" if groups is None else "groups is empty")
    made = [_group(table, k, _lookup(references, k)) for k in keys]  # every error before any work
    rows = [_group_power(table, g, rules, (coverage, lo, hi, size, resolution)) for g in made]
    return PowerReport(_report_dataset(keys, [TABLE_RULE] + [r.name for r in rules], rows,
                                       dict(coverage=float(coverage), bounds=(lo, hi), size=float(size),
                                            resolution=float(resolution))))


def _group_power(table: ToleranceTable, group: _Group, rules: Sequence[Rule], st: tuple) -> dict[str, Any]:
    """One group's figures: caught shares, counts, smallest errors and the trivial-pass flag."""
    coverage, lo, hi, size, resolution = st
    deciders = _deciders(table, group, rules)
    shares, counts = _standard(group, deciders, size)
    sweeps = {k: _Sweep(group, k) for k in ("scale", "offset")}
    smallest = {k: [_bisect(lambda s, d=d, sw=sw: sw.share(d, s), coverage, (lo, hi), resolution)
                    for d in deciders.values()] for k, sw in sweeps.items()}
    trivial = [any(counts[k] and shares[n][k] < 1.0 for k in ("zeros", "mean")) for n in deciders]
    return {"caught": [[shares[n][k] for k in WRONG_OUTPUTS] for n in deciders],
            "n_wrong": [counts[k] for k in WRONG_OUTPUTS], "min_scale": smallest["scale"],
            "min_offset": smallest["offset"], "trivial_pass": trivial, "n_references": len(group.refs)}


def _report_dataset(keys: Sequence[tuple[str, ...]], rules: Sequence[str], rows: Sequence[Mapping[str, Any]],
                    attrs: Mapping[str, Any]) -> xr.Dataset:
    def col(name: str, dtype: Any = np.float64) -> np.ndarray:
        return np.array([r[name] for r in rows], dtype=dtype)

    gdims, grdims = ("group",), ("group", "rule")
    return xr.Dataset(
        {"caught": (("group", "rule", "wrong"), col("caught")), "n_wrong": (("group", "wrong"), col("n_wrong", int)),
         "min_scale": (grdims, col("min_scale")), "min_offset": (grdims, col("min_offset")),
         "trivial_pass": (grdims, col("trivial_pass", bool)), "n_references": (gdims, col("n_references", int))},
        coords={"op": (gdims, [k[0] for k in keys]), "dtype": (gdims, [k[1] for k in keys]),
                "hardware": (gdims, [k[2] for k in keys]), "rule": list(rules), "wrong": list(WRONG_OUTPUTS)},
        attrs=dict(attrs))


# --------------------------------------------------------------------------- references
def corpus_references(ops: Sequence[str] | None = None, dtypes: Sequence[str] = ("float16", "bfloat16"), *,
                      n: int = 36, seed: int = 0, quick: bool = True) -> dict[tuple[str, str], list[Reference]]:
    """The references of the embedded corpus's calibration cases, with their magnitudes and covariates.

    The first ``n`` cases of each (op, dtype) that :func:`tolstat.assess.corpus_runs.calibration_dataset`
    runs with the same ``seed`` and ``quick`` (the cases cycle over the op's shapes,
    distributions and input scales: ``n`` at least the grid's length visits every shape).

    Parameters
    ----------
    ops : sequence of str, optional
        Corpus ops (default: all).
    dtypes : sequence of str
    n : int, default 36
        References per (op, dtype).
    seed : int, default 0
    quick : bool, default True
        The small shapes (those of ``tolstat evaluate --quick``).

    Returns
    -------
    dict
        ``{(op, dtype): [Reference, ...]}``, as :func:`power_report` takes it.
    """
    from tolstat import corpus

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    names = list(ops) if ops is not None else sorted(corpus.OPS)
    unknown = sorted(set(names) - set(corpus.OPS))
    if unknown:
        raise ValueError(f"unknown op(s) {unknown}; known: {sorted(corpus.OPS)}")
    out: dict[tuple[str, str], list[Reference]] = {}
    for op in names:
        for dt in dtypes:
            dt = canonical_dtype(dt)
            out[(op, dt)] = [Reference(np.asarray(corpus.run_reference(c, dt), dtype=np.float64),
                                       np.asarray(corpus.run_magnitude(c, dt), dtype=np.float64),
                                       {str(k): float(v) for k, v in c.covariates.items()})
                             for c in corpus.iter_cases(op, dt, n=n, seed=seed, quick=quick)]
    return out


_SEP = "::"


def save_references(references: Mapping[tuple[str, ...], Sequence[Any]], path: str | os.PathLike[str]) -> Path:
    """Write references to an ``.npz`` file that :func:`load_references` (and ``tolstat show
    --references``) read.

    Layout: array ``OP::DTYPE::HARDWARE::I::expected`` (``HARDWARE`` empty for
    ``(op, dtype)`` keys), ``...::I::magnitude`` when the reference has one, and
    ``...::I::cov::NAME`` (0-d) per covariate.
    """
    arrays: dict[str, np.ndarray] = {}
    for key, items in references.items():
        op, dt, hw = (tuple(key) + ("",))[:3]
        for i, it in enumerate(items):
            r = _as_reference(it, f"references[{key!r}][{i}]")
            base = _SEP.join((op, canonical_dtype(dt), hw, str(i)))
            arrays[base + _SEP + "expected"] = r.expected
            if r.magnitude is not None:
                arrays[base + _SEP + "magnitude"] = r.magnitude
            for c, v in r.covariates.items():
                arrays[base + _SEP + "cov" + _SEP + c] = np.asarray(v, dtype=np.float64)
    p = Path(path)
    np.savez(p, **arrays)
    return p


def load_references(path: str | os.PathLike[str]) -> dict[tuple[str, ...], list[Reference]]:
    """Read the references written by :func:`save_references`.

    Raises
    ------
    ValueError
        An array name that is not of the layout of :func:`save_references` (named).
    """
    parts: dict[tuple[str, ...], dict[int, dict[str, Any]]] = {}
    with np.load(Path(path), allow_pickle=False) as z:
        for name in z.files:
            bits = name.split(_SEP)
            if len(bits) < 5 or not bits[3].isdigit():
                raise ValueError(f"{os.fspath(path)}: array {name!r} is not OP::DTYPE::HARDWARE::I::FIELD")
            key = tuple(bits[:2]) if not bits[2] else tuple(bits[:3])
            rec = parts.setdefault(key, {}).setdefault(int(bits[3]), {"covariates": {}})
            if bits[4] == "cov" and len(bits) == 6:
                rec["covariates"][bits[5]] = float(z[name])
            elif bits[4] in ("expected", "magnitude") and len(bits) == 5:
                rec[bits[4]] = np.asarray(z[name])
            else:
                raise ValueError(f"{os.fspath(path)}: array {name!r} has an unknown field")
    return {k: [_as_reference(v[i], f"{os.fspath(path)} {k} reference {i}") for i in sorted(v)]
            for k, v in parts.items()}
