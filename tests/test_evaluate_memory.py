"""The evaluation's datasets, built with one copy of the element samples, equal the
concatenation of their parts (the definition)."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

import tolstat
from tolstat.evaluate import (EvalConfig, _from_corpus_pairs, _heldout_pairs, _pairs_for, _SampleSink,
                              _union_covariates, calibration_dataset, heldout_datasets)


def _strip(ds: xr.Dataset):
    ds = ds.copy()
    prov = json.loads(ds.attrs.pop("provenance"))
    return ds, [{k: v for k, v in p.items() if k != "created"} for p in prov]


def _same(new: xr.Dataset, old: xr.Dataset) -> None:
    new, pn = _strip(new)
    old, po = _strip(old)
    assert list(new.data_vars) == list(old.data_vars)
    xr.testing.assert_identical(new, old)
    assert pn == po


# ops with different covariates, row-wise and invariant statistics, small outputs (padding)
OPS = ["softmax", "matmul", "cumsum"]


def test_calibration_dataset_equals_concat_of_parts():
    cfg = EvalConfig.preset("tiny", ops=OPS, n_cal=6)
    parts = [_from_corpus_pairs(list(_pairs_for(op, dt, cfg.n_cal, cfg.seed, cfg.quick)), op, dt, cfg.seed)
             for op in OPS for dt in cfg.dtypes]
    new = calibration_dataset(cfg, progress=False)
    _same(new, _union_covariates(parts))
    assert tolstat.validate(new) is not None


def test_heldout_datasets_equal_concat_of_parts():
    cfg = EvalConfig.preset("tiny", ops=OPS, n_test=2)
    ctrl, bug = [], []
    for op in OPS:
        for dt in cfg.dtypes:
            c, b = _heldout_pairs(op, dt, cfg.n_test, cfg.seed + 1, cfg.quick)
            ctrl.append(_from_corpus_pairs(c, op, dt, cfg.seed + 1))
            if b:
                bug.append(_from_corpus_pairs(b, op, dt, cfg.seed + 1))
    new_c, new_b = heldout_datasets(cfg, covariates=["K"], progress=False)
    _same(new_c, _union_covariates(ctrl, ["K"]))
    _same(new_b, _union_covariates(bug, ["K"]))


def test_sample_sink_grows_beyond_its_plan():
    cfg = EvalConfig.preset("tiny", ops=["cumsum"], n_cal=4)
    ref = calibration_dataset(cfg, progress=False)
    sink = _SampleSink(total=3, size=2)  # smaller than the data: must grow, not fail
    out = sink.join([sink.take(ref.copy())])
    np.testing.assert_array_equal(out["sample_abs"].values, ref["sample_abs"].values)
