"""tolstat's own methods in :mod:`tolstat.assess.evaluation`: the one list of the tolstat rules compared there."""

from __future__ import annotations

from tolstat.assess.rules import Rule, SelectRule

__all__ = ["tolstat_methods"]


def tolstat_methods() -> list[Rule]:
    """The tolstat methods compared in ``tolstat evaluate``.

    Each is ``tolstat.select`` with these options; evaluate calibrates it per (op, dtype)
    at its ``fp_budget`` and ``confidence`` (:class:`tolstat.assess.rules.SelectRule`).
    """
    return [
        # the default call (form "auto"); the calibration runs are the same inputs through several
        # correct variants: each case is one unit
        SelectRule("tolstat default", form="auto", cluster="case"),
        SelectRule("tolstat max_abs", form=None),
        SelectRule("tolstat allclose", form="allclose"),
        SelectRule("tolstat size-aware", form="size_aware"),
        SelectRule("tolstat size-aware+bias", form="size_aware", statistic=("max_abs", "bias")),
    ]
