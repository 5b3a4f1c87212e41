"""Calibration: from an error dataset to a tolerance table.

The decision (:mod:`~tolstat.calibration.decision`: the number a check compares with its
threshold), the certified engine (:mod:`~tolstat.calibration.engine`; its units and score
in :mod:`~tolstat.calibration.units`, the pooling of small groups in
:mod:`~tolstat.calibration.pooling`, the certificates in
:mod:`~tolstat.calibration.certificate`), the score forms fed to it
(:mod:`~tolstat.calibration.forms`), the bounds of the tail-model methods
(:mod:`~tolstat.calibration.bounds`), :func:`~tolstat.calibration.selection.select` and
re-budgeting (:mod:`~tolstat.calibration.selection`; its settings in
:mod:`~tolstat.calibration.options`), the table
(:mod:`~tolstat.calibration.table`), its review layout and the hardware policy.
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("selection", "options", "table", "decision", "engine", "units", "certificate", "pooling", "forms", "bounds", "table_format", "hwpolicy", "review", "tiny_budget"))
