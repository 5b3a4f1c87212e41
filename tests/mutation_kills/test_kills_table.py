"""Mutants of ``tolstat.calibration.table`` that the other tests do not kill."""

from __future__ import annotations

import json

import tolstat

from table_helpers import group as _group, table as _table  # noqa: E402


def test_n_inexact_survives_a_json_round_trip(tmp_path):
    g = _group("op", "float32", "*", 1.0)
    g["n_inexact"] = 3
    t = _table([g, _group("op2", "float32", "*", 2.0)])
    t.to_json(tmp_path / "t.json")
    d = json.loads((tmp_path / "t.json").read_text())
    assert [x["n_inexact"] for x in d["groups"]] == [3, 0]
    back = tolstat.load_table(tmp_path / "t.json")
    assert back.data["n_inexact"].values.tolist() == [3, 0]


import pytest  # noqa: E402

from tolstat.measure.metrics import as_array  # noqa: E402


def _scaled(scale):
    g = _group("op", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = scale
    return _table([g], statistic="max_score")


def test_entry_allclose_of_a_scale_model_uses_the_covariates():
    t = _scaled({"form": "allclose", "atol": 0.5, "rtol": 0.25, "unit": 1e-3, "linear": {"K": 0.125},
                 "power": {"N": [0.5, 4.0]}})
    at, rt = t.entry("op", "float32").allclose({"K": 8.0, "N": 16.0})
    mult = (16.0 / 4.0) ** 0.5  # power covariate: (N / reference) ** exponent
    assert at == pytest.approx(2.0 * 1e-3 * (0.5 + 0.125 * 8.0) * mult, rel=1e-14)
    assert rt == pytest.approx(2.0 * 1e-3 * 0.25 * mult, rel=1e-14)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("unit", -1.0, "scale unit must be >= 0, got -1.0"),
    ("floor", -0.5, "scale floor must be >= 0, got -0.5"),
    ("atol", -0.5, "scale atol must be >= 0, got -0.5"),
])
def test_negative_scale_coefficients_are_rejected(key, value, match):
    with pytest.raises(ValueError, match=match):
        _scaled({"form": "allclose", "atol": 0.5, "rtol": 0.25, key: value})


@pytest.mark.parametrize("bad", [[0.5], [0.5, 1.0, 2.0], 0.5])
def test_scale_power_entries_must_be_exponent_and_reference(bad):
    with pytest.raises(ValueError, match=r"scale power\['N'\] must be \[exponent, reference\]"):
        _scaled({"form": "allclose", "atol": 0.5, "power": {"N": bad}})


def test_as_array_default_name_in_its_error():
    with pytest.raises(TypeError, match="^array: cannot convert list to an array"):
        as_array([[1.0], [1.0, 2.0]])


def test_a_group_without_a_listed_statistic_is_rejected():
    g = _group("op", "float32", "*", 1.0)  # has max_abs only
    with pytest.raises(ValueError, match=r"table group 0 \(op, float32, \*\) has no entry for statistic 'bias'"):
        _table([g], extra=("bias",))


def test_tail_parameters_are_kept_per_statistic():
    tail = {"u": 1.0, "sigma": 2.0, "xi": 0.125, "zeta": 0.05, "gof_p": 0.5}
    t = _table([_group("op", "float32", "*", 3.0, tail=tail)])
    got = t.entry("op", "float32").statistics["max_abs"].tail
    assert {k: got[k] for k in tail} == tail


def test_table_dataset_layout_is_the_documented_one():
    t = _table([_group("op", "float32", "*", 3.0, top=(3.0, 2.0)), _group("op2", "float16", "*", 1.0)])
    assert dict(t.data.sizes)["group"] == 2 and "statistic" in t.data.dims and "rank" in t.data.dims
    assert t.data["threshold"].dims == ("group", "statistic")
    assert t.data["top_scores"].dims == ("group", "statistic", "rank")
    assert t.data["op"].dims == ("group",) and t.data["n"].dims == ("group",)


def test_invalid_table_data_names_the_source_and_the_field():
    t = _table([_group("op", "float32", "*", 1.0)])
    bad = t.data.copy()
    bad.attrs["confidence"] = 2.0
    with pytest.raises(ValueError, match=r"^invalid tolerance table 'x\.nc': confidence must lie strictly between"):
        tolstat.ToleranceTable(bad, source="x.nc")
    with pytest.raises(ValueError, match=r"^invalid tolerance table: confidence must lie"):
        tolstat.ToleranceTable(bad)
    ctl = t.data.assign_coords(op=("group", ["a\tb"]))
    with pytest.raises(ValueError, match=r"op 'a\\tb' contains the control character"):
        tolstat.ToleranceTable(ctl)


def test_table_metadata_defaults_and_sorted_json():
    g = _group("op", "float32", "*", 1.0, statistic="max_score")
    g["scale"] = {"rtol": 0.25, "form": "allclose", "atol": 0.5}  # keys not in order
    meta = {"fp_budget": 0.01, "confidence": 0.95, "statistics": ["max_score"], "budget_split": "sidak",
            "provenance": {"z": 1, "a": 2}}
    t = tolstat.ToleranceTable.from_groups([g], meta)
    assert t.data.attrs["tolstat_version"] == tolstat.__version__
    assert t.meta["budget_split"] == "sidak"
    assert str(t.data["scale_json"].values[0]) == json.dumps(g["scale"], sort_keys=True)
    assert t.data.attrs["provenance"] == json.dumps(meta["provenance"], sort_keys=True)
