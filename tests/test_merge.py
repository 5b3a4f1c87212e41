"""Merging calibration data with CI records: labels, covariates, repeated records."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tolstat
from tolstat.dataset.merge import LABEL_FILL, merge_records, run_hashes, runs_with


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def _cal(runs=60, seed=0):
    def make(rng):
        k = int(rng.choice([32, 64]))
        return tolstat.Inputs(args=(rng.standard_normal(k),), labels={"dist": "normal"}, covariates={"K": k})

    return tolstat.collect(_kernel, _ref, make, op="mul3", dtype="float16", runs=runs, hardware="cpu",
                           options=tolstat.CollectOptions(progress=False), seed=seed)


def _records(n=5, seed=1):
    """Like the plugin's records: a 'test' label, a different covariate, seed -1."""
    pairs = []
    for i in range(n):
        x = np.random.default_rng([seed, i]).standard_normal(48)
        pairs.append((_kernel(x), _ref(x), {"test": f"tests/test_k.py::test_mul[{i}]"}, {"scale": 1.0}))
    return tolstat.from_pairs(pairs, op="mul3", dtype="float16", hardware="cpu")


def test_concat_refuses_but_merge_reconciles():
    cal, rec = _cal(), _records()
    with pytest.raises(ValueError, match="labels"):
        tolstat.concat([cal, rec])
    ds = merge_records([cal, rec])
    tolstat.dataset.validate(ds)
    assert ds.sizes["run"] == 65
    assert set(ds.attrs["labels"].split(",")) == {"dist", "test"}
    assert list(ds["test"].values[:60]) == [LABEL_FILL] * 60 and ds["test"].values[60].startswith("tests/")
    assert list(ds["dist"].values[60:]) == [LABEL_FILL] * 5
    assert np.isnan(ds["K"].values[60:]).all() and np.isfinite(ds["K"].values[:60]).all()
    assert np.isnan(ds["scale"].values[:60]).all()
    assert json.loads(ds.attrs["provenance"])[-1]["duplicates_dropped"] == 0


def test_repeated_records_are_not_new_runs():
    cal, rec = _cal(), _records()
    again = _records()  # the same CI suite run again (fixed seeds)
    other = _records(seed=2)
    assert (run_hashes(rec) == run_hashes(again)).all()
    assert not set(run_hashes(rec)) & set(run_hashes(other))
    ds = merge_records([cal, rec, again, other])
    assert ds.sizes["run"] == 60 + 5 + 5
    assert json.loads(ds.attrs["provenance"])[-1] == {"created_by": "tolstat.dataset.merge_records", "runs_in": 75,
                                                       "duplicates_dropped": 5, "label_fill": ""}
    assert merge_records([cal, rec, again], dedupe=False).sizes["run"] == 70
    # distinct calibration runs (different inputs) never collapse, even with equal run statistics
    assert np.unique(run_hashes(cal)).size == 60


def test_covariate_rule_for_forms():
    cal, rec = _cal(runs=400), _records(n=40)
    ds = merge_records([cal, rec])
    # no user covariate needed: all 440 runs are used
    assert tolstat.select(ds, fp_budget=0.05, form="allclose").entry("mul3", "float16").n == 440
    # a form using K needs it on every run of the group
    by_k = tolstat.SelectOptions(scale=tolstat.models.ScaleOptions(size_covariate="K"))
    with pytest.raises(ValueError, match="covariate 'K'"):
        tolstat.select(ds, fp_budget=0.05, form="size_aware", options=by_k)
    t = tolstat.select(runs_with(ds, "K"), fp_budget=0.05, form="size_aware", options=by_k)
    assert t.entry("mul3", "float16").n == 400
    with pytest.raises(ValueError, match="not a covariate"):
        runs_with(ds, "M")


def test_merge_errors():
    with pytest.raises(ValueError, match="at least one dataset"):
        merge_records([])
    with pytest.raises(TypeError, match="label_fill must be a string"):
        merge_records([_cal(runs=5)], label_fill=0)
    cal = _cal(runs=5)
    clash = tolstat.from_pairs([(np.zeros(3, np.float16), np.zeros(3), {}, {"dist": 1.0})], op="mul3",
                               dtype="float16", hardware="cpu")
    with pytest.raises(ValueError, match=r"label in one dataset and a covariate in another: \['dist'\]"):
        merge_records([cal, clash])


@pytest.mark.slow
def test_cli_merge(tmp_path, capsys):
    from tolstat.cli.main import main

    a, b = tmp_path / "cal.nc", tmp_path / "rec.nc"
    tolstat.save(_cal(runs=20), a)
    tolstat.save(_records(), b)
    out = tmp_path / "all.nc"
    assert main(["merge", str(a), str(b), str(b), "-o", str(out)]) == 0
    assert "(25 runs)" in capsys.readouterr().out
    assert tolstat.open_errors(out).sizes["run"] == 25
    assert main(["merge", str(a), str(b), str(b), "-o", str(out), "--keep-duplicates"]) == 0
    assert tolstat.open_errors(out).sizes["run"] == 30
