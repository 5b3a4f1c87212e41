"""ToleranceTable (tolstat.calibration.table, table_format): layout, export, lookup, validation.

References are the documented layout and lookup rules (``docs/selection.md``, the
``ToleranceTable`` docstring) and hand-built groups whose every value is known.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import tolstat
from table_helpers import group as _group, table as _table
from tolstat.calibration.table import ToleranceTable, load_table
from tolstat.calibration.table_format import check_table_data


def test_n_inexact_survives_a_json_round_trip(tmp_path):
    g = _group("op", "float32", "*", 1.0)
    g["n_inexact"] = 3
    t = _table([g, _group("op2", "float32", "*", 2.0)])
    t.to_json(tmp_path / "t.json")
    d = json.loads((tmp_path / "t.json").read_text())
    assert [x["n_inexact"] for x in d["groups"]] == [3, 0]
    back = tolstat.load_table(tmp_path / "t.json")
    assert back.data["n_inexact"].values.tolist() == [3, 0]


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


def _bare_stat(threshold):
    """A statistic entry with only the required keys (no tail, no top_scores)."""
    return {"threshold": threshold, "estimate": threshold, "budget": 0.01, "confidence": 0.95,
            "method": "order_statistic", "reason": "r"}


def test_group_without_tail_and_top_scores_is_a_valid_table():
    g = {"op": "op", "dtype": "float32", "hardware": "*", "n": 400, "statistics": {"max_abs": _bare_stat(0.5)}}
    t = ToleranceTable.from_groups([g], {"fp_budget": 0.01, "confidence": 0.95, "statistics": ["max_abs"]})
    st = t.entry("op", "float32").statistics["max_abs"]
    assert st.threshold == 0.5 and st.top.size == 0
    assert all(np.isnan(v) for v in st.tail.values()) and sorted(st.tail) == sorted(("u", "sigma", "xi", "zeta",
                                                                                       "gof_p"))
    assert t.data.sizes["rank"] == 1  # no scores: one NaN column


def test_repr_lists_twenty_groups_and_counts_the_rest():
    t = _table([_group(f"op{i:02d}", "float32", "*", float(i)) for i in range(23)])
    lines = repr(t).splitlines()
    assert lines[0] == ("<ToleranceTable: 23 groups, fp_budget=0.01, confidence=0.95, form=None, "
                        "statistics=['max_abs']>")
    assert len(lines) == 1 + 20 + 1
    assert lines[1] == "  op00 / float32 / *: n=400: max_abs=0 (order_statistic)"
    assert lines[20] == "  op19 / float32 / *: n=400: max_abs=19 (order_statistic)"
    assert lines[-1] == "  ... 3 more"


def test_invalid_scale_json_in_table_data_is_named():
    t = _table([_group("op", "float32", "*", 1.0)])
    bad = t.data.copy()
    bad["scale_json"] = ("group", np.array(["{not json"]))
    with pytest.raises(ValueError, match=r"group \('op', 'float32', '\*'\): scale model is not valid JSON "
                                         r"\(JSONDecodeError\)"):
        ToleranceTable(bad)
    bad["scale_json"] = ("group", np.array(['["a list"]']))
    with pytest.raises(ValueError, match=r"scale model must be an object with a 'form'"):
        ToleranceTable(bad)


def test_duplicate_groups_in_table_data_are_listed():
    t = _table([_group("a", "float16", "cpu", 1.0), _group("b", "float16", "cpu", 2.0)])
    dup = t.data.assign_coords(op=("group", np.array(["a", "a"])))
    with pytest.raises(ValueError, match=r"duplicate \(op, dtype, hardware\) groups \[\('a', 'float16', 'cpu'\)\]"):
        check_table_data(dup)


def test_only_hardware_fallback_is_labelled():
    t = _table([_group("a", "float16", "gpuA", 1.0), _group("*", "float16", "gpuB", 2.0)])
    e = t.entry("a", "float16")  # no hardware asked: the only one of (a, float16)
    assert (e.hardware, e.fallback, e.requested_hardware) == ("gpuA", "only hardware", None)
    d = t.entry("b", "float16")  # op b not calibrated: the default op's only hardware
    assert (d.op, d.hardware, d.fallback) == ("*", "gpuB", "default op, only hardware")


def test_table_form_attribute_and_meta():
    g = _group("op", "float32", "*", 1.0)
    t = ToleranceTable.from_groups([g], {"fp_budget": 0.01, "confidence": 0.95, "statistics": ["max_abs"],
                                         "form": "auto"})
    assert t.data.attrs["form"] == "auto" and t.meta["form"] == "auto"
    assert _table([g]).meta["form"] is None  # no form: stored as "" and read back as None


def test_to_dict_keeps_the_scale_model_and_round_trips(tmp_path):
    g = _group("op", "float32", "*", 2.0, statistic="max_score", top=(2.0, 1.5))
    g["scale"] = {"form": "allclose", "atol": 0.5, "rtol": 0.25}
    h = _group("op2", "float32", "*", 3.0, statistic="max_score")
    h["scale"] = {"form": "allclose", "atol": 1.0, "rtol": 0.0}
    t = _table([g, h], statistic="max_score")
    d = t.to_dict()
    assert [x["scale"] for x in d["groups"]] == [g["scale"], h["scale"]]
    assert d["groups"][0]["statistics"]["max_score"]["top_scores"] == [2.0, 1.5]
    assert d["groups"][0]["hardware"] == "*" and d["groups"][0]["statistics"]["max_score"]["reason"] == "test"
    t.to_json(tmp_path / "t.json")
    back = load_table(tmp_path / "t.json")
    assert back.entry("op", "float32").allclose() == (2.0 * 0.5, 2.0 * 0.25)
    assert back.entry("op2", "float32").allclose() == (3.0, 0.0)
    assert back.to_dict()["groups"] == d["groups"]
    assert json.loads(t.to_json())["groups"][1]["scale"] == h["scale"]


def test_assert_close_kwargs_follow_the_hardware_asked_for():
    t = _table([_group("mm", "float32", "gpuA", 0.5), _group("mm", "float32", "gpuB", 0.25)])
    assert t.to_assert_close_kwargs(hardware="gpuA") == {("mm", "float32"): {"atol": 0.5, "rtol": 0.0}}
    assert t.to_assert_close_kwargs(hardware="gpuB") == {("mm", "float32"): {"atol": 0.25, "rtol": 0.0}}
    # no hardware on a table with several: no entry (skipped), or the lookup's KeyError
    assert t.to_assert_close_kwargs() == {}
    with pytest.raises(KeyError, match=r"calibrated on several hardware \['gpuA', 'gpuB'\]"):
        t.to_assert_close_kwargs(skip_unsupported=False)


def test_entry_with_a_hardware_policy_matches_the_dtype():
    t = _table([_group("mm", "float32", "gpuA", 0.5), _group("mm", "float16", "gpuA", 4.0),
                _group("mm", "float16", "gpuB", 8.0)])
    e = t.entry("mm", np.float16, "gpuC", hardware_policy="pooled")  # loosest float16 hardware
    assert (e.dtype, e.hardware, e.statistics["max_abs"].threshold) == ("float16", "gpuB", 8.0)
    assert e.fallback == "pooled: loosest calibrated hardware 'gpuB' of 2 (this machine 'gpuC' is not calibrated)"
    e = t.entry("mm", "float32", "gpuC", hardware_policy="nearest")
    assert (e.hardware, e.statistics["max_abs"].threshold, e.requested_hardware) == ("gpuA", 0.5, "gpuC")
    with pytest.raises(KeyError, match=r"hardware_policy='exact': the table has this \(op, dtype\) for hardware "
                                       r"\['gpuA', 'gpuB'\]"):
        t.entry("mm", "float16", "gpuC", hardware_policy="exact")


def test_json_layout_reads_numbers_written_as_strings(tmp_path):
    g = _group("op", "float32", "*", "inf")  # non-finite thresholds are refused
    with pytest.raises(ValueError, match=r"threshold must be a finite number >= 0, got inf"):
        _table([g])
    g = _group("op", "float32", "*", 0.5, top=("1.5", 0.5), tail={"u": "nan", "xi": "-inf"})
    st = _table([g]).entry("op", "float32").statistics["max_abs"]
    assert st.top.tolist() == [1.5, 0.5] and np.isnan(st.tail["u"]) and st.tail["xi"] == -np.inf


def test_assert_close_kwargs_skip_only_the_unsupported_groups():
    g = _group("b", "float32", "*", 0.5, statistic="max_score")
    g["scale"] = {"form": "size_aware", "atol": 0.5, "rtol": 0.25, "power": {"K": [0.5, 4.0]}}
    h = _group("c", "float32", "*", 2.0, statistic="max_score")
    h["scale"] = {"form": "allclose", "atol": 0.5, "rtol": 0.25}
    t = _table([g, h], statistic="max_score")  # b needs the covariate K, c does not
    assert t.to_assert_close_kwargs() == {("c", "float32"): {"atol": 1.0, "rtol": 0.5}}
    with pytest.raises(ValueError, match=r"the scale model needs the run covariate 'K'"):
        t.to_assert_close_kwargs(skip_unsupported=False)


def test_assert_close_kwargs_pass_the_hardware_policy():
    t = _table([_group("mm", "float32", "gpuA", 0.5), _group("mm", "float32", "gpuB", 0.25)])
    assert t.to_assert_close_kwargs("gpuC", hardware_policy="pooled") == {("mm", "float32"): {"atol": 0.5,
                                                                                            "rtol": 0.0}}
    assert t.to_assert_close_kwargs("gpuC") == {}  # no policy: gpuC is not in the table


def test_to_netcdf_round_trip(tmp_path):
    g = _group("op", "float32", "gpu", 0.5, top=(0.5, 0.25), tail={"u": 0.1, "sigma": 0.2, "xi": 0.0,
                                                                  "zeta": 0.1, "gof_p": 0.5})
    t = _table([g, _group("op", "float16", "gpu", 2.0)])
    p = tmp_path / "t.nc"
    assert t.to_netcdf(p) == p
    back = load_table(p)
    assert back.groups == t.groups and back.to_dict()["groups"] == t.to_dict()["groups"]
    assert back.entry("op", "float32", "gpu").fallback == "exact"


def test_json_round_trip_keeps_tail_parameters(tmp_path):
    tail = {"u": 0.1, "sigma": 0.2, "xi": -0.25, "zeta": 0.1, "gof_p": 0.5}
    t = _table([_group("op", "float32", "*", 0.5, tail=tail)])
    t.to_json(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["groups"][0]["statistics"]["max_abs"]["tail"] == tail
    assert load_table(tmp_path / "t.json").entry("op", "float32").statistics["max_abs"].tail == tail


def test_volatile_block_joins_a_provenance_that_is_not_an_object(tmp_path):
    d = json.loads(_table([_group("op", "float32", "*", 0.5)]).to_json())
    d["provenance"] = "written by hand"
    d["volatile"] = {"provenance.created": "2026-01-01"}
    (tmp_path / "t.json").write_text(json.dumps(d))
    assert load_table(tmp_path / "t.json").meta["provenance"] == {"volatile": {"provenance.created": "2026-01-01"}}


def test_table_data_with_zero_calibration_runs_is_refused():
    t = _table([_group("op", "float32", "*", 0.5), _group("op2", "float32", "*", 0.5)])
    bad = t.data.assign(n=("group", np.array([400, 0])))
    with pytest.raises(ValueError, match=r"'n' \(calibration runs\) must be integers >= 1, got \[400, 0\]"):
        ToleranceTable(bad)


def test_repr_of_exactly_twenty_groups_has_no_more_line():
    lines = repr(_table([_group(f"op{i:02d}", "float32", "*", 1.0) for i in range(20)])).splitlines()
    assert len(lines) == 21 and lines[-1] == "  op19 / float32 / *: n=400: max_abs=1 (order_statistic)"


def test_table_needs_a_non_empty_statistics_list():
    with pytest.raises(ValueError, match=r"table 'statistics' must be a non-empty list of names, got \[\]"):
        ToleranceTable.from_groups([_group("op", "float32", "*", 0.5)],
                                   {"fp_budget": 0.01, "confidence": 0.95, "statistics": []})


def test_json_object_without_schema_key_is_not_a_table(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"groups": []}')
    with pytest.raises(ValueError, match=r"is not a tolstat tolerance table \(no 'tolstat_table' key\)"):
        load_table(p)


def test_netcdf_string_variables_read_as_objects_become_str(tmp_path, monkeypatch):
    """Engines or xarray versions that decode variable-length strings to object arrays: the
    label, method, reason and scale variables are converted to str, so lookups compare str."""
    import xarray as xr

    import tolstat.calibration.table as tbl

    t = _table([_group("matmul", "float16", "cpu", 0.5), _group("add", "bfloat16", "*", 0.25)])
    p = t.to_netcdf(tmp_path / "t.nc")
    real_open = xr.open_dataset
    names = ("op", "dtype", "hardware", "statistic", "method", "reason", "scale_json")

    def open_as_objects(*args, **kwargs):
        ds = real_open(*args, **kwargs).load()
        for v in names:
            if v in ds.variables and ds[v].dtype.kind == "U":
                ds[v] = ds[v].astype(object)
        return ds

    monkeypatch.setattr(tbl.xr, "open_dataset", open_as_objects)
    back = load_table(p)
    kinds = {v: back.data[v].dtype.kind for v in names if v in back.data.variables}
    assert {"op", "dtype", "hardware", "statistic", "method", "reason"} <= set(kinds)
    assert set(kinds.values()) == {"U"}, kinds
    assert back.entry("matmul", "float16", "cpu").statistics["max_abs"].threshold == 0.5
    e = back.entry("add", "bfloat16", "gpu")
    assert e.statistics["max_abs"].threshold == 0.25 and e.hardware == "*"


def test_load_table_of_a_netcdf_file_missing_a_variable_names_it(tmp_path):
    t = _table([_group("add", "float32", "gpu", 0.5)])
    p = os.fspath(tmp_path / "t.nc")
    t.data.drop_vars("reason").to_netcdf(p, engine="h5netcdf")
    with pytest.raises(ValueError, match=r"missing variable\(s\) \['reason'\]"):
        load_table(p)


@pytest.mark.parametrize(("linear", "match"), [
    ({"K": "nan"}, r"scale linear\['K'\] must be finite, got 'nan'"),
    ({"K": "inf"}, r"scale linear\['K'\] must be finite, got 'inf'"),
    ({"K": "x"}, r"scale linear\['K'\]: expected a number, got 'x'"),
    ({"K": True}, r"scale linear\['K'\]: expected a number, got True \(bool\)"),
])
def test_scale_linear_coefficients_are_validated(linear, match):
    g = _group("op", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = {"form": "allclose", "atol": 0.5, "rtol": 0.25, "linear": linear}
    with pytest.raises(ValueError, match=match):
        _table([g], statistic="max_score")


def test_table_variables_have_the_documented_dimensions():
    # docs/selection.md: dims group, statistic, rank; per (group, statistic): threshold,
    # estimate, budget, stat_confidence, method, reason, tail_*; per group: n, scale_*
    g1 = _group("op", "float32", "*", 3.0, top=(3.0, 2.0), tail={"u": 1.0, "sigma": 0.5, "xi": 0.1,
                                                                 "zeta": 0.1, "gof_p": 0.5})
    g2 = _group("op2", "float16", "*", 1.0)
    t = _table([g1, g2])
    d = t.data
    per_stat = ["threshold", "estimate", "budget", "stat_confidence", "method", "reason",
                "tail_u", "tail_sigma", "tail_xi", "tail_zeta", "tail_gof_p"]
    per_group = ["n", "n_inexact", "scale_atol", "scale_rtol", "scale_json", "certificate_json"]
    assert {v: d[v].dims for v in per_stat} == {v: ("group", "statistic") for v in per_stat}
    assert {v: d[v].dims for v in per_group} == {v: ("group",) for v in per_group}
    assert d["top_scores"].dims == ("group", "statistic", "rank")
    assert set(d.dims) == {"group", "statistic", "rank"}
    assert d["reason"].values.tolist() == [["test"], ["test"]]


def test_table_scale_columns_default_to_zero_for_missing_coefficients():
    g = _group("op", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = {"form": "allclose", "rtol": 0.25}  # no atol
    h = _group("op2", "float32", "*", 2.0, statistic="max_score")
    h["scale"] = {"form": "allclose", "atol": 0.5}  # no rtol
    t = _table([g, h], statistic="max_score")
    assert t.data["scale_atol"].values.tolist() == [0.0, 0.5]
    assert t.data["scale_rtol"].values.tolist() == [0.25, 0.0]
    assert t.entry("op", "float32").allclose() == (0.0, 2.0 * 0.25)


@pytest.mark.parametrize(("tops", "width"), [([(), ()], 1), ([(2.0,), ()], 1), ([(3.0, 2.0, 1.0), (1.0,)], 3)])
def test_top_scores_rank_width_is_the_longest_list(tops, width):
    t = _table([_group("op", "float32", "*", 3.0, top=tops[0]), _group("op2", "float32", "*", 3.0, top=tops[1])])
    assert t.data.sizes["rank"] == width
    for i, (op, top) in enumerate(zip(("op", "op2"), tops)):
        np.testing.assert_array_equal(t.entry(op, "float32").statistics["max_abs"].top, np.array(top))


def test_fit_free_scale_without_a_quantile_round_trips_through_json(tmp_path):
    # 300 units leave none for a scale fit: the fit-free scale has no quantile (NaN)
    rng = np.random.default_rng(8)
    pairs = []
    for _ in range(300):
        e = rng.standard_normal(32)
        pairs.append(((e + rng.standard_normal(32) * 2.0 ** -11 * np.abs(e)).astype(np.float16), e))
    ds = tolstat.from_pairs(pairs, op="mm", dtype="float16")
    table = tolstat.select(ds, fp_budget=0.01, form="allclose")
    assert math.isnan(table.entry("mm", "float16").scale.quantile)
    back = tolstat.load_table(table.to_json(tmp_path / "t.json") and tmp_path / "t.json")
    assert math.isnan(back.entry("mm", "float16").scale.quantile)
    assert back.checksums() == table.checksums()
    np.testing.assert_array_equal(tolstat.check_runs(ds, back), tolstat.check_runs(ds, table))


@pytest.mark.parametrize(("scale", "match"), [
    ({"form": "nope", "atol": 0.5}, r"scale form 'nope' is not one of \("),
    ({"form": "baseline", "floor": 1.0}, r"scale baseline must name the covariate of the baseline error, got None"),
    ({"form": "baseline", "baseline": "", "floor": 1.0},
     r"scale baseline must name the covariate of the baseline error, got ''"),
])
def test_an_unknown_scale_form_or_a_baseline_without_its_covariate_is_rejected(scale, match, tmp_path):
    with pytest.raises(ValueError, match=r"group \('op', 'float32', '\*'\): " + match):
        _scaled(scale)
    good = _scaled({"form": "allclose", "atol": 0.5, "rtol": 0.25})
    d = json.loads(good.to_json())
    d["groups"][0]["scale"] = scale
    (tmp_path / "t.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match):
        load_table(tmp_path / "t.json", verify=False)


def test_netcdf_table_stores_each_group_checksum_along_the_group_dimension(tmp_path):
    import xarray as xr

    t = _table([_group("a", "float16", "cpu", 1.0), _group("b", "float32", "*", 2.0),
                _group("c", "float16", "*", 3.0)])
    by_group = {(g["op"], g["dtype"], g["hardware"]): g["checksum"] for g in json.loads(t.to_json())["groups"]}
    t.to_netcdf(tmp_path / "t.nc")
    with xr.open_dataset(tmp_path / "t.nc", engine="h5netcdf") as ds:
        assert ds["checksum"].dims == ("group",)
        stored = {(str(ds["op"].values[i]), str(ds["dtype"].values[i]), str(ds["hardware"].values[i])):
                  str(ds["checksum"].values[i]) for i in range(ds.sizes["group"])}
    assert stored == by_group and len(set(stored.values())) == 3
    assert tolstat.load_table(tmp_path / "t.nc").groups == t.groups


def test_an_edited_table_names_up_to_five_edited_groups_and_counts_the_rest(tmp_path):
    _table([_group("mm", "float32", f"hw{i}", 1.0 + i) for i in range(7)]).to_json(tmp_path / "t.json")
    names = [f"('mm', 'float32', 'hw{i}')" for i in range(7)]
    for k, what in [(1, f"group {names[0]} was"), (5, "groups " + ", ".join(names[:5]) + " were"),
                    (7, "groups " + ", ".join(names[:5]) + " and 2 more were")]:
        doc = json.loads((tmp_path / "t.json").read_text())
        for g in doc["groups"][:k]:
            g["statistics"]["max_abs"]["threshold"] *= 2
        (tmp_path / "e.json").write_text(json.dumps(doc))
        with pytest.raises(ValueError) as exc:
            load_table(tmp_path / "e.json")
        assert str(exc.value).startswith(f"tolerance table {str(tmp_path / 'e.json')!r}: {what} edited after it was "
                                         "saved: the stored fields"), (k, str(exc.value))
