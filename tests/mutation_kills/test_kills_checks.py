"""Mutants of ``tolstat.checks.checking`` that the other tests do not kill."""

from __future__ import annotations

import numpy as np
import pytest

from tolstat.checks.checking import assert_close

from table_helpers import group as _group, table as _table  # noqa: E402


def _frames_of_assert_close(entries):
    # the library frame (its code name is ``assert_close``, or a renamed copy of it under a
    # mutation-testing trampoline); not this test's own frame
    return [e.name for e in entries if "assert_close" in e.name and not e.name.startswith("test_")]


def test_failing_assert_close_hides_its_own_frame_from_pytest_tracebacks():
    t = _table([_group("add", "float32", "*", 0.5)])
    with pytest.raises(AssertionError, match="max_abs") as ei:
        assert_close(np.array([2.0], np.float32), np.array([1.0]), op="add", dtype="float32", table=t)
    assert _frames_of_assert_close(ei.traceback)  # the frame exists in the raw traceback
    # ... and pytest hides it (``__tracebackhide__ = True``): the report starts at the caller
    assert _frames_of_assert_close(ei.traceback.filter(ei)) == []
