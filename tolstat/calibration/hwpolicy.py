"""Hardware policy: which table group a check on *this* machine uses.

A tolerance table holds groups per (op, dtype, hardware); ``hardware`` is either a
machine label (``"cpu:<model>"``, ``"cuda:<GPU name>"``, any string) or ``"*"`` for a
group calibrated over all hardware (``select(..., by=("op", "dtype"))``). The policy
says what happens when the machine running the check is not calibrated itself. In
every policy an exact hardware match comes first.

``"error"`` (the default of the pytest plugin and the CLI)
    exact hardware, else the ``"*"`` group, else an error naming this machine and the
    table's hardware.
``"exact"``
    exact hardware only; ``"*"`` groups are not used (a table that must have been
    calibrated on this very machine).
``"pooled"``
    exact hardware, else ``"*"``, else the group of the table's hardware with the
    largest max-error threshold for that (op, dtype) (the loosest calibrated machine).
    The false-positive promise was measured on that machine only: on a new machine it
    is an assumption, reported in the check's ``fallback``.
``"nearest"``
    exact hardware, else ``"*"``, else the calibrated hardware whose label is most
    similar to this machine's (same device kind, ``cpu:``/``cuda:``, first; then
    :class:`difflib.SequenceMatcher` ratio; ties by label). Same caveat as ``pooled``.

Op ``"*"`` groups (a declared default for a dtype) are tried after the op's own
groups, with the same rules. Without a policy (``hardware_policy=None``)
:meth:`tolstat.ToleranceTable.entry` keeps its older rules (documented there).
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Mapping, Sequence


__all__ = ["HARDWARE_POLICIES", "DEFAULT_POLICY", "MissingGroup", "check_policy", "resolve_group",
           "machine_hardware", "hardware_mismatch"]

HARDWARE_POLICIES = ("exact", "pooled", "nearest", "error")
DEFAULT_POLICY = "error"
ANY = "*"


class MissingGroup(KeyError):
    """No group of a table matches ``(op, dtype, hardware)``, even with the fallbacks
    (:meth:`tolstat.ToleranceTable.entry`; under a hardware policy: no group of that
    ``(op, dtype)`` on any hardware); a ``KeyError``. A group the table has but refused at
    calibration, or hardware a policy refuses, raises a plain ``KeyError`` instead."""


def check_policy(policy: Any, *, name: str = "hardware_policy") -> str:
    """Validate a policy name and return it.

    Raises
    ------
    ValueError
        Not one of :data:`HARDWARE_POLICIES`.
    """
    if policy not in HARDWARE_POLICIES:
        raise ValueError(f"{name} must be one of {HARDWARE_POLICIES}, got {policy!r}")
    return str(policy)


def machine_hardware() -> str:
    """This machine's hardware label (:func:`tolstat.dataset.hardware_fingerprint`)."""
    from tolstat.dataset.runs import hardware_fingerprint

    return hardware_fingerprint().label


def _num(v: Any) -> float:
    f = float(v)
    return -math.inf if math.isnan(f) else f  # a refused (NaN) group is never the loosest


def _kind(label: str) -> str:
    return label.split(":", 1)[0] if ":" in label else ""


def _nearest(hardware: str, candidates: Sequence[str]) -> str:
    def key(c: str) -> tuple[int, float, str]:
        same = int(_kind(c) == _kind(hardware))
        return (-same, -difflib.SequenceMatcher(None, hardware, c).ratio(), c)

    return min(candidates, key=key)


def resolve_group(groups: Sequence[tuple[str, str, str]], thresholds: Sequence[float], op: str, dtype: str,
                  hardware: str, policy: str, *, index: Mapping[tuple[str, str, str], int] | None = None,
                  by_op_dtype: Mapping[tuple[str, str], Sequence[tuple[str, str, str]]] | None = None,
                  ) -> tuple[int, str]:
    """Index of the group a check of (op, dtype) on ``hardware`` uses, and how it was found.

    Parameters
    ----------
    groups : sequence of (op, dtype, hardware)
        The table's groups.
    thresholds : sequence of float
        Max-error threshold of each group (used by ``pooled``).
    op, dtype, hardware : str
        What is checked, and where (``dtype`` canonical).
    policy : str
        One of :data:`HARDWARE_POLICIES`.
    index, by_op_dtype : mapping, optional
        The groups' positions and the groups of each (op, dtype), when the caller keeps
        them (a table does): a lookup then costs the groups of one (op, dtype), not a
        pass over all groups.

    Returns
    -------
    (int, str)
        Group index and a description (``"exact"``, ``"any hardware"``,
        ``"pooled: loosest calibrated hardware ..."``, ``"nearest hardware ..."``,
        prefixed ``"default op, "`` for an op ``"*"`` group).

    Raises
    ------
    KeyError
        No group under this policy; the message names this machine's hardware and the
        hardware the table was calibrated on.
    """
    check_policy(policy)
    idx = {k: i for i, k in enumerate(groups)} if index is None else index
    if by_op_dtype is None:
        by: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
        for k in groups:
            by.setdefault((k[0], k[1]), []).append(k)
        by_op_dtype = by
    for o, tag in ((op, ""), (ANY, "default op, ")):
        if (o, dtype, hardware) in idx:
            return idx[(o, dtype, hardware)], tag + "exact"
        if policy == "exact":
            continue
        if (o, dtype, ANY) in idx:
            return idx[(o, dtype, ANY)], tag + "any hardware"
        cands = [k[2] for k in by_op_dtype.get((o, dtype), ()) if k[2] != ANY]
        if not cands or policy == "error":
            continue
        if policy == "pooled":
            best = max(cands, key=lambda h: (_num(thresholds[idx[(o, dtype, h)]]), h))
            return idx[(o, dtype, best)], (f"{tag}pooled: loosest calibrated hardware {best!r} of "
                                           f"{len(cands)} (this machine {hardware!r} is not calibrated)")
        best = _nearest(hardware, cands)
        return idx[(o, dtype, best)], (f"{tag}nearest hardware {best!r} (this machine {hardware!r} is "
                                       "not calibrated)")
    hws = sorted({k[2] for k in groups if k[1] == dtype and k[0] in (op, ANY)})
    raise (KeyError if hws else MissingGroup)(
        f"no tolerance for op={op!r}, dtype={dtype!r} on this machine's hardware {hardware!r} under "
        f"hardware_policy={policy!r}: the table has this (op, dtype) for hardware {hws or 'none'}"
        + (" (all hardware in the table: " + ", ".join(sorted({k[2] for k in groups})) + ")" if not hws else "")
        + "; calibrate on this machine, calibrate a pooled '*' entry (by=('op', 'dtype')), or choose "
        "hardware_policy='nearest' or 'pooled' to accept another machine's thresholds"
    )


def hardware_mismatch(table_hardware: Sequence[str], hardware: str, policy: str) -> str | None:
    """Why no group of a table can apply to ``hardware`` under ``policy`` (None if some can).

    A table-level check for a test session's start: with ``exact`` the machine must be
    in the table; with ``error`` it must be there or the table must have a ``"*"``
    group. ``pooled`` and ``nearest`` accept any machine.
    """
    check_policy(policy)
    hws = sorted(set(table_hardware))
    if hardware in hws or policy in ("pooled", "nearest"):
        return None
    if policy == "error" and ANY in hws:
        return None
    return (f"this machine's hardware {hardware!r} is not in the tolerance table (calibrated on "
            f"{hws}) and hardware_policy={policy!r} does not allow another machine's thresholds")
