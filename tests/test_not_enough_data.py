"""``NotEnoughData``: the one error for too few runs, and what catches it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tolstat
from tolstat import NotEnoughData
from tolstat.calibration import TailOptions, calibrate


def test_calibrate_names_runs_needed():
    x = np.random.default_rng(0).exponential(size=40)
    with pytest.raises(NotEnoughData, match="n >= 59") as ei:
        calibrate(x, 0.05, 0.95, method="order_statistic")
    assert ei.value.n == 40 and ei.value.n_needed == 59
    assert isinstance(ei.value, ValueError)
    with pytest.raises(NotEnoughData, match="never|model-based") as ei:
        calibrate(x, 0.001, 0.95)  # auto: the order statistic or a refusal, never the tail model
    assert ei.value.n_needed == math.ceil(math.log(0.05) / math.log(1 - 0.001))
    with pytest.raises(NotEnoughData, match="tail model was refused") as ei:
        calibrate(x, 0.001, 0.95, method="evt")
    assert ei.value.n_needed == math.ceil(math.log(0.05) / math.log(1 - 0.001))
    with pytest.raises(NotEnoughData, match="split-conformal") as ei:
        calibrate(x, 0.01, method="conformal")
    assert ei.value.n_needed == 99


def test_bad_data_is_not_not_enough_data():
    with pytest.raises(ValueError, match="NaN") as ei:
        calibrate([1.0, np.nan] * 100, 0.01)
    assert not isinstance(ei.value, NotEnoughData)


def test_tail_options_validate():
    with pytest.raises(ValueError, match="TailOptions.bound must be"):
        TailOptions(bound="nope")
    with pytest.raises(ValueError, match="min_tail_runs must be a positive integer"):
        TailOptions(min_tail_runs=0)
    with pytest.raises(ValueError, match="tail_fraction"):
        TailOptions(tail_fraction=1.5)
    with pytest.raises(TypeError, match="tail must be a TailOptions"):
        calibrate(np.ones(100), 0.1, tail={"bound": "bootstrap"})


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    rng = np.random.default_rng(1)
    pairs = []
    for _ in range(30):
        x = rng.standard_normal(32)
        ref = x.astype(np.float16).astype(np.float64) * 3
        # not correctly rounded (a zero-mean perturbation before rounding): 30 runs, no exact group
        pairs.append(((ref * (1 + rng.uniform(-2.0**-11, 2.0**-11, 32))).astype(np.float16), ref))
    return tolstat.from_pairs(pairs, op="mul3", dtype="float16", hardware="cpu")


def test_skip_catches_only_not_enough_data(small):
    t = tolstat.select(small, form=None, fp_budget=0.01, on_error="skip")
    assert t.data["method"].values[0, 0] == "refused"
    with pytest.raises(NotEnoughData, match=r"group \(mul3, float16, cpu\)"):
        tolstat.select(small, form=None, fp_budget=0.01)
    # a missing covariate is a configuration error: raised even with on_error="skip"
    with pytest.raises(ValueError, match="'nope'"):
        tolstat.select(small, fp_budget=0.5, form="normalised", on_error="skip",
                       options=tolstat.SelectOptions(scale=tolstat.models.ScaleOptions(power=("nope",))))


def test_provenance_records_the_options(small):
    t = tolstat.select(small, fp_budget=0.2, form="allclose",
                       options=tolstat.SelectOptions(tail=TailOptions(min_tail_runs=20),
                                                     scale=tolstat.models.ScaleOptions(quantile=0.9)))
    s = t.meta["provenance"]["settings"]
    assert s["tail"]["min_tail_runs"] == 20 and s["scale"]["quantile"] == 0.9 and s["tail"]["bound"] == "conservative"
    assert s["scale"]["power"] == [] and s["seed"] == 0
    assert TailOptions(**s["tail"]) == TailOptions(min_tail_runs=20)
    assert tolstat.models.ScaleOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in s["scale"].items()}) \
        == tolstat.models.ScaleOptions(quantile=0.9)


def test_auto_refusal_names_the_model_based_method_and_the_pooling_default():
    x = np.random.default_rng(0).exponential(size=40)
    want = ("the order statistic needs n >= 2995 runs for budget 0.001 at confidence 0.95 "
            "(n >= ln(1-confidence)/ln(1-budget)); have n = 40")
    with pytest.raises(NotEnoughData) as ei:
        calibrate(x, 0.001, 0.95)  # method="auto"
    assert str(ei.value) == want + ("; method='evt' (SelectOptions(method='evt') in select) gives a model-based "
                                    "bound (no finite-sample guarantee), or use the default form='auto' of select, "
                                    "which pools exchangeable groups")
    with pytest.raises(NotEnoughData) as ei:
        calibrate(x, 0.001, 0.95, method="order_statistic")  # asked for: no alternative offered
    assert str(ei.value) == want
