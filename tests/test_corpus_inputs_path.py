"""The embedded corpus through ``inputs=``: the same per-run statistics as the magnitude path
``tolstat evaluate`` takes, so its figures hold for a user who passes the op's arguments."""

from __future__ import annotations

import numpy as np
import pytest

from tolstat import corpus
from tolstat.corpus._base import np_dtype
from tolstat.corpus._magnitude import _CALLS
from tolstat.dataset.collection import from_pairs
from tolstat.dataset.options import CollectOptions


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(corpus.OPS))
def test_inputs_path_stores_the_statistics_of_the_magnitude_path(op, dtype):
    name, call = _CALLS[op]
    via_mag, via_inputs = [], []
    for case in corpus.iter_cases(op, dtype, n=3, seed=5, quick=True):
        ref = corpus.run_reference(case, dtype)
        mag = corpus.run_magnitude(case, dtype)
        args, kwargs = call(**case._cast(np_dtype(dtype)), **case.params)
        for kern in corpus.OPS[op].variants.values():
            out = corpus.run_kernel(kern, case, dtype)
            via_mag.append((out, ref, mag, {}, dict(case.covariates)))
            via_inputs.append({"actual": out, "expected": ref, "inputs": args, "params": kwargs,
                               "covariates": dict(case.covariates)})
    a = from_pairs(via_mag, op=op, dtype=dtype, hardware="cpu",
                   options=CollectOptions(rowwise=op in corpus.ROWWISE, progress=False))
    b = from_pairs(via_inputs, op=name, dtype=dtype, hardware="cpu", options=CollectOptions(progress=False))
    assert a.sizes["run"] == b.sizes["run"] == len(via_mag)
    stats = [v for v in a.data_vars if a[v].dims == ("run",) and a[v].dtype.kind == "f"]
    assert any(v.startswith("op_") for v in stats), stats
    assert sorted(stats) == sorted(v for v in b.data_vars if b[v].dims == ("run",) and b[v].dtype.kind == "f")
    for v in stats:
        np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=v)
    assert a.attrs.get("rowwise") == b.attrs.get("rowwise")
