"""An operator table records how its magnitudes were obtained; check refuses what contradicts it.

Through the public API: ``from_pairs`` with ``inputs`` (magnitudes derived by tolstat.ops),
with magnitude arrays (given) or ``magnitude="ref"`` -> ``select`` -> ``check``.
"""

from __future__ import annotations

import numpy as np
import pytest

import tolstat


def _mm(rng, bug=1.0):
    a = rng.standard_normal((8, 64)).astype(np.float16)
    b = rng.standard_normal((64, 8)).astype(np.float16)
    out = ((a.astype(np.float32) @ b.astype(np.float32)) * bug).astype(np.float16)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return a, b, out, a64 @ b64, np.abs(a64) @ np.abs(b64)


def _table(kind: str, n: int = 300):
    rng = np.random.default_rng(3)
    items = []
    for _ in range(n):
        a, b, out, ref, mag = _mm(rng)
        item = {"actual": out, "expected": ref}
        if kind == "ops":
            item["inputs"] = (a, b)
        elif kind == "given":
            item.update(magnitude=mag, covariates={"K": 64.0})
        items.append(item)
    opts = tolstat.CollectOptions(magnitude="ref", progress=False) if kind == "ref" else None
    ds = tolstat.from_pairs(items, op="matmul", dtype="float16", hardware="cpu", options=opts)
    return ds, tolstat.select(ds, fp_budget=0.01, form="operator")


@pytest.fixture(scope="module")
def tables():
    return {k: _table(k) for k in ("ops", "given", "ref")}


@pytest.mark.parametrize("kind", ["ops", "given", "ref"])
def test_the_table_records_how_its_magnitudes_were_obtained(tables, kind):
    ds, table = tables[kind]
    assert ds["op_max"].attrs["magnitude"] == kind
    assert table.entry("matmul", "float16", "cpu").certificate["magnitude"] == kind


def test_concat_keeps_every_convention(tables):
    both = tolstat.concat([tables["ops"][0], tables["given"][0]])
    assert both["op_max"].attrs["magnitude"] == "given+ops"


def test_a_table_of_absolute_input_magnitudes_refuses_the_ref_scale(tables):
    a, b, out, ref, mag = _mm(np.random.default_rng(9))
    for kind in ("ops", "given"):
        table = tables[kind][1]
        with pytest.raises(ValueError, match="another scale"):
            tolstat.check(out, ref, op="matmul", dtype="float16", table=table, covariates={"K": 64},
                          options=tolstat.CheckOptions(magnitude="ref"))
        # the convention it was calibrated with works, and so do inputs (the same scale)
        assert tolstat.check(out, ref, op="matmul", dtype="float16", table=table, inputs=(a, b)).passed


def test_a_ref_table_refuses_inputs_and_arrays(tables):
    a, b, out, ref, mag = _mm(np.random.default_rng(9))
    table = tables["ref"][1]
    with pytest.raises(ValueError, match="magnitude='ref'"):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=table, inputs=(a, b))
    with pytest.raises(ValueError, match="magnitude='ref'"):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=table,
                      options=tolstat.CheckOptions(magnitude=mag))
    assert tolstat.check(out, ref, op="matmul", dtype="float16", table=table,
                         options=tolstat.CheckOptions(magnitude="ref")).passed


@pytest.mark.parametrize("wrong, match", [
    ("signed", "finite and >= 0"), ("zeros", "below \\|expected\\|"), ("small", "below \\|expected\\|"),
    ("nan", "magnitude's fault"), ("negative", "finite and >= 0")])
def test_a_given_magnitude_that_cannot_be_the_op_on_absolute_inputs_is_refused(tables, wrong, match):
    a, b, out, ref, mag = _mm(np.random.default_rng(9))
    bad = {"signed": ref, "zeros": np.zeros_like(ref), "small": 0.9 * np.abs(ref), "nan": np.where(np.arange(ref.size).reshape(ref.shape) == 5,
                                                                        np.nan, mag),
           "negative": -mag}[wrong]
    with pytest.raises(ValueError, match=match):
        tolstat.check(out, ref, op="matmul", dtype="float16", table=tables["given"][1], covariates={"K": 64},
                      options=tolstat.CheckOptions(magnitude=bad))
    assert tolstat.check(out, ref, op="matmul", dtype="float16", table=tables["given"][1], covariates={"K": 64},
                         options=tolstat.CheckOptions(magnitude=mag)).passed


def test_the_convention_survives_a_json_round_trip_and_diff_sees_it(tables, tmp_path):
    from tolstat.calibration.review import diff_tables

    table = tables["given"][1]
    back = tolstat.load_table(table.to_json(tmp_path / "t.json") and tmp_path / "t.json")
    assert back.entry("matmul", "float16", "cpu").certificate["magnitude"] == "given"
    lines = diff_tables(tables["ops"][1], table).splitlines()
    assert any("magnitude" in ln and "ops" in ln and "given" in ln for ln in lines), lines
