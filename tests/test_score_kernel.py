"""The ``max_score`` of a dataset's runs by the numba pass equals the blockwise numpy
definition (``ScaleModel.scale`` and a masked maximum), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import tolstat
from tolstat.calibration.decision import run_values
from tolstat.models import ScaleModel
from tolstat.models.statistics import get

# the edge values (an infinite reference, 1e300 cast to float32) warn in numpy's path
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


class _Blockwise:
    """A scale model seen only through the ``ScaleLike`` protocol (no ``affine`` terms):
    its runs are scored by the blockwise numpy path."""

    def __init__(self, model: ScaleModel):
        self.model = model

    @property
    def covariates(self):
        return self.model.covariates

    def scale(self, ref_abs, cov=None, dtype=None):
        return self.model.scale(ref_abs, cov, dtype)


@pytest.fixture(scope="module")
def ds():
    rng = np.random.default_rng(11)
    pairs = []
    for i in range(300):
        k = int(rng.choice([8, 32, 128]))
        x = rng.standard_normal((4, k)) * 10.0 ** rng.uniform(-3, 3)
        w = rng.standard_normal((k, 6))
        ref = x @ w
        out = (x.astype(np.float16) @ w.astype(np.float16)).astype(np.float16)
        if i % 50 == 7:
            out = ref.astype(np.float16)  # correctly rounded: every error a half ULP or less
        if i % 50 == 9:
            ref = np.zeros_like(ref)
            out = np.zeros((4, 6), dtype=np.float16)  # all errors exactly 0
        pairs.append((out, ref, {}, {"K": float(k)}))
    d = tolstat.from_pairs(pairs, op="mm", dtype="float16", options=tolstat.CollectOptions(progress=False))
    # edge values the numpy path must agree on: a NaN and an infinite error, an infinite
    # reference, a run whose sample holds nothing, a padded slot holding garbage
    a, r, ns = d["sample_abs"].values.copy(), d["sample_ref"].values.copy(), d["n_sample"].values.copy()
    a[3, 0], a[4, 1], r[5, 0], ns[6] = np.nan, np.inf, np.inf, 0
    a[8, -1], ns[8] = 1e300, a.shape[1] - 1
    nf = np.minimum(d["n_fit"].values, ns)
    edged = d.assign(sample_abs=(d["sample_abs"].dims, a), sample_ref=(d["sample_ref"].dims, r),
                     n_sample=("run", ns), n_fit=("run", nf))
    edged.attrs["fitted_on"] = d  # the scale fits read the unedited runs
    return edged


def _models(ds):
    clean = ds.attrs["fitted_on"]
    fitted = [tolstat.select(clean, fp_budget=0.05, form=f).entry("mm", "float16").scale
              for f in ("allclose", "size_aware")]
    return fitted + [
        ScaleModel.fit_free("float16"),
        ScaleModel("normalised", atol=1e-4, rtol=3e-3, unit=0.5, linear={"ref_rms": 0.25, "ref_max_abs": 1e-6},
                   power={"K": (0.5, 32.0)}),
        ScaleModel("allclose", atol=0.0, rtol=0.0),  # every scale at the floor
    ]


@pytest.mark.parametrize("which", range(5))
def test_max_score_of_the_numba_pass_is_the_numpy_definition_bit_for_bit(ds, which):
    model = _models(ds)[which]
    fast = get("max_score").run_scores(ds, model).scores
    slow = get("max_score").run_scores(ds, _Blockwise(model)).scores
    np.testing.assert_array_equal(fast, slow)
    assert np.unique(fast[np.isfinite(fast)]).size > 20  # the runs' own scores
    rows = np.random.default_rng(which).permutation(ds.sizes["run"])[:120]
    np.testing.assert_array_equal(run_values(ds, "max_score", model, rows=rows),
                                  run_values(ds, "max_score", _Blockwise(model), rows=rows))


def test_max_score_of_a_nan_error_is_nan_and_of_an_empty_sample_is_zero(ds):
    model = _models(ds)[0]
    raw = get("max_score").run_scores(ds, model).scores
    assert np.isnan(raw[3]) and np.isinf(raw[4]) and raw[6] == 0.0
    assert raw[8] < 1e300  # the padded slot is not read


def test_a_baseline_scale_and_float32_samples_take_the_numpy_path(ds):
    base = ScaleModel("baseline", baseline="ref_rms", floor=1.0)
    assert base.affine({"ref_rms": np.ones(3)}) is None
    small = ds.assign(sample_abs=ds["sample_abs"].astype(np.float32), sample_ref=ds["sample_ref"].astype(np.float32))
    model = _models(ds)[0]
    np.testing.assert_array_equal(get("max_score").run_scores(small, model).scores,
                                  get("max_score").run_scores(small, _Blockwise(model)).scores)
