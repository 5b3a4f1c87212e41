"""The fast check path's own values (``_fastcheck.fast_check``) against the definitions.

A fast *failure* is re-checked on the general path, so a fast path that computes a
statistic wrongly would only show as a failing fast pass; these tests compare the
values themselves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tolstat
from tolstat.models import statistics as _stats
from tolstat.checks.fast import fast_check

from table_helpers import group as _group, stat as _stat, table as _table  # noqa: E402


def test_fast_bias_and_max_rel_values_are_the_definitions():
    e = np.array([0.0, 1.0, -2.0, 0.5, 3.0])
    a = np.array([np.float16(6e-8), 1.0, -2.001, 0.5, 3.002], dtype=np.float16)  # e[0] = 0: rel floor
    t = _table([_group("op", "float16", "*", 1e9, statistic="max_rel", extra={"bias": _stat(1e9)})],
               statistic="max_rel", extra=("bias",))
    ent = t.entry("op", "float16")
    fast = fast_check(a, e, ent, None)
    d = a.astype(np.float64) - e
    tiny = float(np.finfo(np.float16).tiny)
    rel = np.abs(d) / np.maximum(np.abs(e), tiny)
    assert fast["statistics"]["max_rel"] == pytest.approx(rel.max(), rel=1e-15)
    assert fast["statistics"]["bias"] == pytest.approx(math.sqrt(d.size) * abs(d.mean()) / np.abs(d).mean(), rel=1e-12)
    assert fast["passed"]


def test_fast_path_rejects_non_float_arrays_naming_them():
    t = _table([_group("op", "float32", "*", 1.0)])
    ent = t.entry("op", "float32")
    with pytest.raises((TypeError, ValueError), match="actual"):
        fast_check(np.array([1, 2]), np.array([1.0, 2.0]), ent, None)
    with pytest.raises((TypeError, ValueError), match="expected"):
        fast_check(np.array([1.0, 2.0], np.float32), np.array([1, 2]), ent, None)


def test_entry_with_a_statistic_the_fast_path_does_not_know_takes_the_general_path(monkeypatch):
    extra = _stats.Statistic(name="kill_twice_bias", kind="run", unit="-", description="twice the bias",
                             needs=(), from_dataset=lambda ds, model=None: _stats.RunScores(np.zeros(1)),
                             from_metrics=lambda m, model, cov, dt: 2.0 * _stats.get("bias").value(m))
    monkeypatch.setitem(_stats.REGISTRY, extra.name, extra)
    t = _table([_group("op", "float32", "*", 1.0, extra={extra.name: _stat(1e9)})], extra=(extra.name,))
    ent = t.entry("op", "float32")
    a, e = np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0])
    assert fast_check(a, e, ent, None) is None
    r = tolstat.check(a, e, op="op", dtype="float32", table=t)
    assert r.passed and set(r.statistics) == {"max_abs", extra.name}


def test_fast_pass_reports_the_certificate_guarantee():
    g = _group("op", "float32", "*", 1.0)
    g["certificate"] = {"guarantee": "PAC: for this test"}
    t = _table([g])
    a, e = np.array([1.0, 2.0], np.float32), np.array([1.0, 2.0])
    fast = fast_check(a, e, t.entry("op", "float32"), None)
    assert fast["passed"] and fast["guarantee"] == "PAC: for this test"
    assert tolstat.check(a, e, op="op", dtype="float32", table=t).guarantee == "PAC: for this test"
