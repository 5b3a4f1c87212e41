"""Checks: one output against a tolerance table.

:func:`~tolstat.checks.checking.check`, :func:`~tolstat.checks.checking.assert_close` and
:func:`~tolstat.checks.checking.check_runs` (all through the table entry's decision), the
fast path for default tables (:mod:`~tolstat.checks.fast`), the pytest plugin
(:mod:`~tolstat.checks.pytest_plugin`) and the record parts it writes as checks pass
(:mod:`~tolstat.checks.record_parts`).
"""

from tolstat._base.lazy import namespace as _namespace

__getattr__, __dir__ = _namespace(__name__, ("checking", "options", "result", "fast", "record_parts"))
