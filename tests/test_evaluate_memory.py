"""The evaluation's datasets, built with one copy of the element samples, equal the
concatenation of their parts (the definition)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.assess.corpus_runs import (_from_corpus_pairs, _heldout_pairs, _pairs_for, _SampleSink, _union_covariates,
                                        calibration_dataset, heldout_datasets)
from tolstat.assess.evaluation import EvalConfig


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


def _calibration_part(op: str, dt: str, cfg: EvalConfig) -> xr.Dataset:
    """One (op, dtype) of the calibration dataset, its pairs made first (each with its peer variables)."""
    peers: list = []
    pairs = list(_pairs_for(op, dt, cfg.n_cal, cfg.seed, cfg.quick, peers))
    return _from_corpus_pairs([(*p, q) for p, q in zip(pairs, peers, strict=True)], op, dt, cfg.seed)


def test_calibration_dataset_equals_concat_of_parts():
    cfg = EvalConfig.preset("tiny", ops=OPS, n_cal=6)
    parts = [_calibration_part(op, dt, cfg) for op in OPS for dt in cfg.dtypes]
    new = calibration_dataset(cfg, progress=False)
    _same(new, _union_covariates(parts))
    assert tolstat.dataset.validate(new, deep=True) is new  # raises if the concatenation is not a valid dataset


@pytest.mark.slow
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


@pytest.mark.slow
def test_streamed_scores_equal_calibrate_and_score_on_all_checks():
    # evaluate scores each held-out (op, dtype) as it is made: the same numbers as the
    # per-fold core on the concatenated held-out datasets (the definition)
    from tolstat.assess.rules import calibrate_and_score
    from tolstat.assess.evaluation import BY, _CHECK_LABELS, _fit_and_score, default_methods

    cfg = EvalConfig.preset("tiny", ops=OPS, n_test=2)
    cal = calibration_dataset(cfg, progress=False)
    rules = default_methods()
    outcomes, ctrl_labels, bug_labels = _fit_and_score(rules, cal, cfg, progress=False)
    controls, bugs = heldout_datasets(cfg, covariates=cal.attrs["covariates"].split(","), progress=False)
    assert len(outcomes) == len(rules)
    for rule, got in zip(rules, outcomes):
        ref = calibrate_and_score(rule, cal, controls, bugs, budget=cfg.fp_budget, confidence=cfg.confidence,
                                  by=BY)
        np.testing.assert_array_equal(got.ratios, ref.ratios, err_msg=rule.name)
        np.testing.assert_array_equal(got.buggy_ratios, ref.buggy_ratios, err_msg=rule.name)
        assert got.error == ref.error
        assert got.reasons == ref.reasons
        assert got.thresholds.keys() == ref.thresholds.keys()
        np.testing.assert_array_equal(list(got.thresholds.values()), list(ref.thresholds.values()))
    for label in set(_CHECK_LABELS.values()):
        np.testing.assert_array_equal(ctrl_labels[label].values, controls[label].values)
        np.testing.assert_array_equal(bug_labels[label].values, bugs[label].values)
    assert any(np.isfinite(o.ratios).all() for o in outcomes)  # something was scored
