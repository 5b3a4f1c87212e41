"""The evaluation's calibration dataset, built with one copy of the samples, equals the
concatenation of its parts (the definition)."""

from __future__ import annotations

import numpy as np
import xarray as xr

import tolstat
from tolstat import corpus
from tolstat.evaluate import EvalConfig, _pairs_for, _SampleSink, calibration_dataset


def _by_concat(cfg: EvalConfig) -> xr.Dataset:
    parts = []
    for op in cfg.ops:
        for dt in cfg.dtypes:
            pairs = list(_pairs_for(op, dt, cfg.n_cal, cfg.seed, cfg.quick))
            parts.append(tolstat.from_pairs(pairs, op=op, dtype=dt, hardware="cpu:tolstat-corpus",
                                            seed=cfg.seed, sample_size=512, progress=False,
                                            rowwise=op in corpus.ROWWISE))
    names: list[str] = []
    for p in parts:
        names += [c for c in p.attrs["covariates"].split(",") if c not in names]
    trimmed = []
    for p in parts:
        have = p.attrs["covariates"].split(",")
        q = p.assign({c: ("run", np.full(p.sizes["run"], np.nan)) for c in names if c not in have})
        q.attrs["covariates"] = ",".join(names)
        trimmed.append(q)
    return tolstat.concat(trimmed)


def _strip(ds: xr.Dataset) -> xr.Dataset:
    ds = ds.copy()
    prov = ds.attrs.pop("provenance")
    return ds, [{k: v for k, v in p.items() if k != "created"} for p in __import__("json").loads(prov)]


def test_calibration_dataset_equals_concat_of_parts():
    # ops with different covariates, row-wise and invariant statistics, small outputs (padding)
    cfg = EvalConfig.preset("tiny", ops=["softmax", "matmul", "cumsum"], n_cal=6)
    new, pn = _strip(calibration_dataset(cfg, progress=False))
    old, po = _strip(_by_concat(cfg))
    assert list(new.data_vars) == list(old.data_vars)
    xr.testing.assert_identical(new, old)
    assert pn == po
    assert tolstat.validate(new) is not None


def test_sample_sink_grows_beyond_its_plan():
    cfg = EvalConfig.preset("tiny", ops=["cumsum"], n_cal=4)
    ref = _by_concat(cfg)
    sink = _SampleSink(total=3, size=2)  # smaller than the data: must grow, not fail
    part = ref.copy()
    out = sink.join([sink.take(part)])
    np.testing.assert_array_equal(out["sample_abs"].values, ref["sample_abs"].values)
