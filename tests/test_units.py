"""Independent units, defined once: declared clusters and runs that share a reference."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import tolstat
from tolstat.dataset.schema import FINGERPRINT, reference_fingerprint, run_units

HW = "sim"


def _variants(seed: int, n_inputs: int, k: int, corr: float = 0.9, declare: bool = False):
    """``n_inputs`` inputs, each through ``k`` correct variants whose noise is correlated."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n_inputs):
        ref = rng.standard_normal(16) * 2
        common = rng.standard_normal(16)
        for v in range(k):
            z = corr * common + np.sqrt(1 - corr ** 2) * rng.standard_normal(16)
            out = (ref * (1 + z * 2.0 ** -12)).astype(np.float16)
            pairs.append((out, ref, {"case": f"c{i}"}) if declare else (out, ref))
    return tolstat.from_pairs(pairs, op="mm", dtype="fp16", hardware=HW, options=tolstat.CollectOptions(progress=False))


def _fingerprint_definition(expected):
    import hashlib

    e = np.ascontiguousarray(np.asarray(expected, dtype=np.float64)) + 0.0
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(tuple(int(x) for x in e.shape)).encode())
    h.update(e.tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


@pytest.mark.parametrize("case", ["scalar", "empty", "one", "block", "blocks", "transposed", "float32", "neg_zero"])
def test_reference_fingerprint_is_blake2b_of_shape_and_float64_bytes(case):
    rng = np.random.default_rng(3)
    e = {"scalar": np.float64(-0.0), "empty": np.zeros((0, 4)), "one": np.array([1.5]),
         "block": rng.standard_normal(8192), "blocks": rng.standard_normal((3, 8192 + 17)),
         "transposed": rng.standard_normal((300, 70)).T, "float32": rng.standard_normal(20000).astype(np.float32),
         "neg_zero": np.where(rng.random(30000) < 0.5, -0.0, 1.0)}[case]
    assert reference_fingerprint(e) == _fingerprint_definition(e)


def test_reference_fingerprint_identifies_identical_references():
    a = np.arange(6.0).reshape(2, 3)
    assert reference_fingerprint(a) == reference_fingerprint(a.copy())
    assert reference_fingerprint(a) != reference_fingerprint(a.reshape(3, 2))  # the shape counts
    assert reference_fingerprint(a) != reference_fingerprint(a + 2.0 ** -40)
    assert reference_fingerprint(np.array([-0.0])) == reference_fingerprint(np.array([0.0]))


def test_runs_of_one_input_are_one_unit_declared_or_not():
    ds = _variants(0, 50, 3)
    u = run_units(ds)
    assert u.n_runs == 150 and u.n_units == 50 and u.by == "reference fingerprint"
    assert (u.ids[::3] == np.arange(0, 150, 3)).all() and (u.ids[1::3] == u.ids[::3]).all()
    declared = _variants(0, 50, 3, declare=True).drop_vars(FINGERPRINT)
    d = run_units(declared, "case")
    assert d.n_units == 50 and d.by == "cluster 'case'"
    # a declared label joins runs the fingerprint alone would not (and the two combine)
    both = _variants(0, 50, 3, declare=True)
    merged = both.assign_coords(case=("run", np.repeat([f"g{i // 2}" for i in range(50)], 3)))
    assert run_units(merged, "case").n_units == 25


@pytest.mark.parametrize("kw", [dict(), dict(form="allclose"), dict(form=None),
                                dict(form=None, statistic=("max_abs", "bias"), fp_budget=0.03)],
                         ids=["default", "allclose", "plain", "bias"])
def test_independent_runs_get_the_same_thresholds_with_or_without_fingerprints(kw):
    ds = _variants(1, 400, 1)
    assert run_units(ds).n_units == 400
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = tolstat.select(ds, **{"fp_budget": 0.01, **kw})
        b = tolstat.select(ds.drop_vars(FINGERPRINT), **{"fp_budget": 0.01, **kw})
    np.testing.assert_array_equal(a.data["threshold"].values, b.data["threshold"].values)


def test_table_records_how_runs_became_units_and_the_refusal_names_distinct_inputs():
    ds = _variants(2, 120, 3)  # 360 runs, 120 distinct inputs: too few for 1 % at 95 %
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = tolstat.select(ds, fp_budget=0.01, form=None, on_error="skip")
    c = json.loads(str(t.data["certificate_json"].values[0]))
    assert c["units"] == {"n_runs": 360, "n_units": 120, "by": "reference fingerprint"}
    assert "360 runs are 120 independent units" in c["reason"] and "distinct inputs" in c["reason"]
    with pytest.raises(tolstat.NotEnoughData, match="120 calibration units"):
        tolstat.select(ds, fp_budget=0.01, form=None)


def test_compare_never_splits_runs_of_one_input_across_folds():
    ds = _variants(3, 60, 3)
    res = tolstat.compare(ds, methods=["study"], budgets=(0.05,), folds=4, progress=False)
    fold = res.run_fold.reshape(60, 3)
    assert (fold == fold[:, :1]).all()
