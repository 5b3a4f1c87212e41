"""Mutants of ``tolstat.measure.metrics`` that the other tests do not kill."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tolstat.measure.metrics import error_metrics, ulp_distance

RAGGED = [[1.0], [1.0, 2.0]]  # numpy cannot make an array of it


def test_conversion_errors_name_the_argument():
    with pytest.raises(TypeError, match="expected: cannot convert list to an array"):
        error_metrics(np.array([1.0]), RAGGED)
    with pytest.raises(TypeError, match="actual: cannot convert list to an array"):
        error_metrics(RAGGED, np.array([1.0]))
    with pytest.raises(TypeError, match="actual: cannot convert list to an array"):
        ulp_distance(RAGGED, np.array([1.0]), "float32")
    with pytest.raises(TypeError, match="expected: cannot convert list to an array"):
        ulp_distance(np.array([1.0]), RAGGED, "float32")
    with pytest.raises(TypeError, match="actual has integer/bool dtype"):
        error_metrics(np.array([1, 2]), np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="expected has integer/bool dtype"):
        error_metrics(np.array([1.0, 2.0]), np.array([1, 2]))
    with pytest.raises(TypeError, match="actual has integer/bool dtype"):
        ulp_distance(np.array([1, 2]), np.array([1.0, 2.0]), "float32")
    with pytest.raises(TypeError, match="expected has integer/bool dtype"):
        ulp_distance(np.array([1.0, 2.0]), np.array([1, 2]), "float32")


@pytest.mark.parametrize("dt", ["bfloat16", "float8_e5m2"])
def test_infinite_references_in_ml_dtypes_formats(dt):
    np_dt = getattr(ml_dtypes, dt)
    a = np.array([np.inf, -np.inf, 1.0, 1.25], dtype=np_dt)
    e = np.array([np.inf, -np.inf, 1.0, 1.0])
    d = ulp_distance(a, e, dt)
    assert d[:3].tolist() == [0.0, 0.0, 0.0] and d[3] > 0
    m = error_metrics(a, e, dtype=dt)
    assert m.ulp[:3].tolist() == [0.0, 0.0, 0.0] and m.n_nonfinite == 0
