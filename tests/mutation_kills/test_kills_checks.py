"""Mutants of ``tolstat.checks`` that the other tests do not kill."""

from __future__ import annotations

import numpy as np
import pytest

from tolstat.checks import assert_close

from table_helpers import group as _group, table as _table  # noqa: E402


def test_assert_close_hides_its_own_frame_from_pytest_tracebacks():
    t = _table([_group("add", "float32", "*", 0.5)])
    with pytest.raises(AssertionError, match="max_abs") as ei:
        assert_close(np.array([2.0], np.float32), np.array([1.0]), op="add", dtype="float32", table=t)
    names = [entry.name for entry in ei.traceback]
    assert "assert_close" in names  # the frame exists in the raw traceback
    shown = [entry.name for entry in ei.traceback.filter(ei)]
    assert "assert_close" not in shown  # ... and pytest hides it (__tracebackhide__ = True)
