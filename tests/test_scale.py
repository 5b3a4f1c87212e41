"""tolstat.models.scale: the noise-scale fit and its options."""

from __future__ import annotations

import numpy as np
import pytest

import tolstat
from tolstat.models.scale import ScaleOptions, fit_scale


@pytest.fixture(scope="module")
def ds():
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(40):
        x = rng.standard_normal(256)
        pairs.append(((x.astype(np.float16) * np.float16(3)).astype(np.float16), x.astype(np.float16).astype(np.float64) * 3))
    return tolstat.from_pairs(pairs, op="mul3", dtype="float16", options=tolstat.CollectOptions(progress=False))


@pytest.mark.parametrize("form", ["allclose", "size_aware"])
def test_options_fit_is_fit_scale_with_those_options(ds, form):
    opts = ScaleOptions(quantile=0.9, max_points=500)
    a, b = opts.fit(ds, form, seed=3), fit_scale(ds, form, opts, seed=3)
    assert a.to_dict() == b.to_dict()
    assert fit_scale(ds, form).to_dict() == ScaleOptions().fit(ds, form).to_dict()


def test_fit_scale_takes_its_settings_only_as_scale_options(ds):
    with pytest.raises(TypeError, match=r"^options must be a ScaleOptions, got dict"):
        fit_scale(ds, "allclose", {"quantile": 0.9})
    with pytest.raises(TypeError, match="unexpected keyword argument 'quantile'"):
        fit_scale(ds, "allclose", quantile=0.9)


@pytest.mark.parametrize("kw, msg", [
    (dict(solver="cvx"), r"^ScaleOptions\.solver must be 'statsmodels' or 'lp', got 'cvx'"),
    (dict(max_points=3), r"^ScaleOptions\.max_points must be an integer >= 10, got 3"),
    (dict(floor=-1.0), r"^ScaleOptions\.floor must be finite and >= 0, got -1\.0"),
    (dict(floor=float("nan")), r"^ScaleOptions\.floor must be finite and >= 0, got nan"),
])
def test_scale_options_validate_their_fields(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ScaleOptions(**kw)
