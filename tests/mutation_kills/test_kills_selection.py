"""Mutants of ``tolstat.selection`` that the other tests do not kill."""

from __future__ import annotations

import numpy as np

import tolstat
from tolstat.bounds import TailOptions


def _ds(n=200, seed=0):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        e = rng.standard_normal(32)
        pairs.append((e.astype(np.float32), e))
    return tolstat.from_pairs(pairs, op="add", dtype="float32", progress=False)


def test_select_passes_its_tail_options_to_each_group():
    ds = _ds()
    # budget 1e-3 at n = 200 needs the tail model (an order statistic needs n >= 2995)
    default = tolstat.select(ds, fp_budget=1e-3, form=None, method="evt")
    e = default.entry("add", "float32").statistics["max_abs"]
    assert e.method == "evt" and np.isfinite(e.threshold)
    strict = tolstat.select(ds, fp_budget=1e-3, form=None, method="evt", tail=TailOptions(min_tail_runs=500),
                            on_error="skip")
    reason = str(strict.data["reason"].values.ravel()[0])
    assert "500" in reason and not np.isfinite(float(strict.data["threshold"].values.ravel()[0]))
