"""Mutants of ``tolstat.calibration.selection`` that the other tests do not kill."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tolstat
from tolstat.calibration.bounds import TailOptions


def _ds(n=200, seed=0):
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        e = rng.standard_normal(32)
        # a correct kernel that is not correctly rounded (a zero-mean perturbation first)
        pairs.append(((e * (1 + rng.uniform(-2.0**-24, 2.0**-24, 32))).astype(np.float32), e))
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


def _rowsum_ds(n=60):
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(n):
        x = rng.standard_normal((8, 32))
        a = x.astype(np.float16).sum(axis=1, dtype=np.float16).astype(np.float16)
        pairs.append((a, x.sum(axis=1), np.abs(x).sum(axis=1)))
    return tolstat.from_pairs(pairs, op="rowsum", dtype="float16", progress=False)


def test_operator_select_passes_pooling_and_on_error():
    ds = _rowsum_ds()  # 60 runs: too few for budget 0.01 (299 units) in one group
    pooled = tolstat.select(ds, fp_budget=0.01, on_error="skip")
    reason = str(pooled.data["reason"].values.ravel()[0])
    assert "its pool has 1 group(s) < min_pool" in reason and "pooling is off" not in reason
    unpooled = tolstat.select(ds, fp_budget=0.01, on_error="skip", pooling=False)
    assert str(unpooled.data["reason"].values.ravel()[0]).endswith("pooling is off")
    with pytest.raises(tolstat.NotEnoughData, match="calibration units < 299 needed"):
        tolstat.select(ds, fp_budget=0.01)


def test_calibrate_budget_floor_and_labels_in_messages():
    from tolstat._base import validate as _validate
    from tolstat.calibration.selection import calibrate

    x = np.random.default_rng(1).exponential(size=400)
    with pytest.raises(ValueError, match="budget must be a probability"):
        calibrate(x, _validate.MIN_BUDGET / 8.5, 0.95)
    with pytest.raises(ValueError, match=r"^group \(a\): 1 calibration score\(s\) are NaN"):
        calibrate(np.append(x, np.nan), 0.01, 0.95, label="(a)")
    c = calibrate(x, 0.01, 0.95, method="conformal", label="(b)")
    assert c.method == "conformal"
    with pytest.raises(tolstat.NotEnoughData, match=r"^group \(b\): "):
        calibrate(x[:50], 0.01, 0.95, method="conformal", label="(b)")


def test_select_provenance_records_the_version_and_settings():
    ds = _ds(n=300)  # one dataset: its provenance carries a creation time
    t = tolstat.select(ds, fp_budget=0.05, form=None, seed=3)
    prov = t.meta["provenance"]
    assert prov["tolstat_version"] == tolstat.__version__ and prov["function"] == "tolstat.select"
    assert prov["settings"]["seed"] == 3 and prov["n_runs"] == 300
    assert prov["settings"]["statistic"] == ["max_abs"]
    assert prov["errors_provenance"] == json.loads(ds.attrs["provenance"]) and prov["errors_provenance"]


def test_two_statistics_split_the_budget_by_the_union_bound_only():
    ds = _ds(n=300)
    t = tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"])
    assert {k: v.budget for k, v in t.entry("add", "float32").statistics.items()} == {"max_abs": 0.025, "bias": 0.025}
    assert t.meta["provenance"]["settings"]["statistic"] == ["max_abs", "bias"]
    # the statistics of one run are not independent: a Sidak split is refused
    with pytest.raises(ValueError, match="'sidak' is not a union bound"):
        tolstat.select(ds, fp_budget=0.05, form=None, statistic=["max_abs", "bias"], budget_split="sidak")


def test_operator_select_uses_the_seed_to_split_fit_and_calibration_units():
    ds = _rowsum_ds(n=150)  # budget 0.05: 59 calibration units are enough
    c = [tolstat.select(ds, fp_budget=0.05, seed=s).entry("rowsum", "float16").certificate for s in (0, 1)]
    assert c[0]["n_fit"] == c[1]["n_fit"] and c[0]["n_cal"] == c[1]["n_cal"]
    assert c[0]["normalisers"] != c[1]["normalisers"]  # other units fitted the normalisers
    again = tolstat.select(ds, fp_budget=0.05, seed=1).entry("rowsum", "float16").certificate
    assert again["normalisers"] == c[1]["normalisers"]  # and the same seed gives the same split
