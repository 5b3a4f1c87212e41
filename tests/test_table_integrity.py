"""A saved table's decision fields are validated and integrity-checked on load; diff reports them.

Every field that changes what a check decides (the certificate's normalisers and flags, the
scale model) is validated by :func:`tolstat.load_table` against its typed form; what cannot
be judged on its own (normalisers multiplied by 1e6 are still finite and positive) is caught
by the checksum that :meth:`~tolstat.ToleranceTable.to_json` / ``to_netcdf`` write. ``tolstat
diff`` names every such change. Tables are made through the public API (``collect`` of a
float16 matmul with the operator statistics, ``select``) or from group dicts.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import xarray as xr

import tolstat
from kernel_helpers import fp16_block_matmul
from table_helpers import group as _group, table as _table
from tolstat.cli.main import main

HW = "sim"
OP = "matmul"


def _kernel(a, b):
    return fp16_block_matmul(a, b)  # the same rounding on every machine


def _reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


def _inputs(rng):
    k = int(rng.choice([16, 64]))
    a = rng.standard_normal((8, k)).astype(np.float16).astype(np.float64)
    b = rng.standard_normal((k, 8)).astype(np.float16).astype(np.float64)
    return tolstat.Inputs(args=(a, b), covariates={"K": k})


def _magnitude(a, b):
    return np.abs(a) @ np.abs(b)


@pytest.fixture(scope="module")
def errors():
    opts = tolstat.CollectOptions(magnitude=_magnitude, progress=False)
    return tolstat.collect(_kernel, _reference, _inputs, op=OP, dtype="float16", runs=200, hardware=HW,
                           options=opts)


@pytest.fixture(scope="module")
def operator_table(errors):
    t = tolstat.select(errors, fp_budget=0.05)
    assert t.statistics == ["op_score"]
    return t


@pytest.fixture(scope="module")
def allclose_table(errors):
    return tolstat.select(errors, fp_budget=0.05, form="allclose")


def _pair(seed=7, bug=0.0, zero=False):
    inp = _inputs(np.random.default_rng(seed))
    a, b = inp.args
    out = _kernel(a, b)
    if bug:
        out = (out.astype(np.float64) * (1 + bug)).astype(np.float16)
    if zero:
        out = np.zeros_like(out)
    return out, _reference(a, b), _magnitude(a, b), inp.covariates


def _check(table, **kw):
    out, ref, mag, cov = _pair(**kw)
    return tolstat.check(out, ref, op=OP, dtype="float16", table=table, hardware=HW, covariates=cov,
                         options=tolstat.CheckOptions(magnitude=mag))


def _saved(table, path):
    table.to_json(path)
    return json.loads(path.read_text())


def _write(path, doc):
    path.write_text(json.dumps(doc, indent=1))
    return path


def _edit_certificate(doc, fn):
    doc = copy.deepcopy(doc)
    fn(doc["groups"][0]["certificate"])
    return doc


GROUP = r"group \('matmul', 'float16', 'sim'\)"


# ---------------------------------------------------------------- the switch-off edits are refused
def test_normalisers_times_1e6_are_refused_by_the_checksum(operator_table, tmp_path):
    assert not _check(operator_table, bug=0.05).passed  # the table as calibrated catches the bug
    doc = _saved(operator_table, tmp_path / "t.json")

    def scale_up(c):
        c["normalisers"] = {k: v * 1e6 for k, v in c["normalisers"].items()}

    p = _write(tmp_path / "edited.json", _edit_certificate(doc, scale_up))
    with pytest.raises(ValueError, match=GROUP + r" was edited after it was saved") as exc:
        tolstat.load_table(p)
    msg = str(exc.value)
    assert "edited.json" in msg and "verify=False" in msg and "to_json" in msg
    # accepted on purpose: the edit really does switch the check off
    edited = tolstat.load_table(p, verify=False)
    assert _check(edited, bug=0.05).passed and _check(edited, zero=True).passed


def test_normalisers_replaced_by_op_frac_are_refused_even_without_verification(operator_table, tmp_path):
    doc = _saved(operator_table, tmp_path / "t.json")
    p = _write(tmp_path / "edited.json",
               _edit_certificate(doc, lambda c: c.__setitem__("normalisers", {"op_frac": 1})))
    for verify in (True, False):
        with pytest.raises(ValueError, match=GROUP + r": certificate normalisers: 'op_frac' is not a statistic "
                                                     r"of the combined score of matmul"):
            tolstat.load_table(p, verify=verify)


def test_certificate_without_normalisers_is_refused_on_load_naming_the_field(operator_table, tmp_path):
    doc = _saved(operator_table, tmp_path / "t.json")
    p = _write(tmp_path / "edited.json", _edit_certificate(doc, lambda c: c.pop("normalisers")))
    with pytest.raises(ValueError, match=GROUP + r": certificate has no 'normalisers'"):
        tolstat.load_table(p, verify=False)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("normalisers", {"op_max": -1.0}, r"certificate normalisers\['op_max'\] must be finite and > 0, got -1\.0"),
    ("normalisers", {"op_max": 0}, r"certificate normalisers\['op_max'\] must be finite and > 0, got 0"),
    ("normalisers", {"op_max": "nan"}, r"certificate normalisers\['op_max'\]: expected a number, got 'nan'"),
    ("normalisers", {"op_max": True}, r"certificate normalisers\['op_max'\]: expected a number, got True"),
    ("normalisers", {}, r"certificate normalisers must be a non-empty object"),
    ("normalisers", [1.0], r"certificate normalisers must be a non-empty object"),
    ("rowwise", "yes", r"certificate rowwise must be true or false, got 'yes'"),
    ("needs_magnitude", 0, r"certificate needs_magnitude must be true or false, got 0"),
    ("covariates", "K", r"certificate covariates must be a list of names, got 'K'"),
    ("covariates", ["N"], r"certificate covariates: unknown covariate 'N'"),
    ("n_scores", -1, r"certificate n_scores must be an integer >= 0, got -1"),
    ("n_scores", 2.5, r"certificate n_scores must be an integer >= 0, got 2\.5"),
    ("method", 3, r"certificate method must be a string, got 3"),
    ("form", "allclose", r"certificate form 'allclose' does not match the group's statistic 'op_score'"),
])
def test_malformed_certificate_fields_are_named(operator_table, tmp_path, field, value, match):
    doc = _saved(operator_table, tmp_path / "t.json")
    p = _write(tmp_path / "edited.json", _edit_certificate(doc, lambda c: c.__setitem__(field, value)))
    with pytest.raises(ValueError, match=GROUP + ": " + match):
        tolstat.load_table(p, verify=False)


def test_certificate_must_be_an_object():
    g = _group("mm", "float32", "*", 1.0)
    g["certificate"] = ["not", "an", "object"]
    with pytest.raises(ValueError, match=r"group \('mm', 'float32', '\*'\): certificate must be an object, got list"):
        _table([g])


def test_plain_group_normalisers_name_the_groups_statistic():
    g = _group("mm", "float32", "*", 1.0)
    g["certificate"] = {"form": "plain", "method": "order_statistic", "normalisers": {"max_rel": 1.0}}
    with pytest.raises(ValueError, match=r"group \('mm', 'float32', '\*'\): certificate normalisers name 'max_rel', not "
                                         r"the group's statistic 'max_abs'"):
        _table([g])
    g["certificate"]["normalisers"] = {"max_abs": 1.0}
    assert _table([g]).entry("mm", "float32").certificate["normalisers"] == {"max_abs": 1.0}


def test_check_of_a_table_built_in_memory_without_normalisers_is_refused_when_built():
    g = _group("softmax", "float16", "*", 1.0, statistic="op_score")
    g["certificate"] = {"form": "operator", "method": "order_statistic", "guarantee": "PAC: test"}
    with pytest.raises(ValueError, match=r"group \('softmax', 'float16', '\*'\): certificate has no 'normalisers'"):
        _table([g], statistic="op_score")
    g["statistics"]["op_score"]["threshold"] = "nan"  # a refused group has no normalisers: fine
    g["certificate"]["method"] = "refused"
    assert len(_table([g], statistic="op_score")) == 1


# ---------------------------------------------------------------- the scale model
def test_scale_rtol_times_100_is_refused_by_the_checksum(allclose_table, tmp_path):
    doc = _saved(allclose_table, tmp_path / "t.json")
    doc["groups"][0]["scale"]["rtol"] *= 100
    p = _write(tmp_path / "edited.json", doc)
    with pytest.raises(ValueError, match=GROUP + r" was edited after it was saved"):
        tolstat.load_table(p)
    assert tolstat.load_table(p, verify=False).entry(OP, "float16", HW).scale.rtol == doc["groups"][0]["scale"]["rtol"]


@pytest.mark.parametrize(("scale", "match"), [
    ({"form": "allclos", "atol": 0.5}, r"scale form 'allclos' is not one of \('allclose', 'size_aware', "
                                       r"'normalised', 'baseline'\)"),
    ({"form": "allclose", "atol": 0.5, "linear": {"ref_rms": -1.0}}, r"scale linear\['ref_rms'\] must be >= 0, "
                                                                     r"got -1\.0"),
    ({"form": "allclose", "atol": 0.5, "power": {"K": [0.5, 0.0]}}, r"scale power\['K'\]\[1\] \(reference\) must "
                                                                    r"be > 0, got 0\.0"),
    ({"form": "baseline", "floor": 1.0}, r"scale baseline must name the covariate of the baseline error"),
    ({"form": "allclose", "atol": 0.5, "linear": ["ref_rms"]}, r"scale linear must be an object"),
])
def test_scale_model_fields_are_validated(scale, match):
    g = _group("mm", "float32", "*", 2.0, statistic="max_score")
    g["scale"] = scale
    with pytest.raises(ValueError, match=r"group \('mm', 'float32', '\*'\): " + match):
        _table([g], statistic="max_score")


# ---------------------------------------------------------------- the checksum
def test_saved_tables_load_and_resaving_an_accepted_edit_makes_it_valid(operator_table, tmp_path):
    doc = _saved(operator_table, tmp_path / "t.json")
    assert doc["checksum"].startswith("sha256:") and doc["groups"][0]["checksum"].startswith("sha256:")
    assert tolstat.load_table(tmp_path / "t.json").to_json() == (tmp_path / "t.json").read_text()
    doc["groups"][0]["statistics"]["op_score"]["threshold"] *= 2
    p = _write(tmp_path / "edited.json", doc)
    with pytest.raises(ValueError, match="was edited after it was saved"):
        tolstat.load_table(p)
    tolstat.load_table(p, verify=False).to_json(p)  # accepted on purpose: re-saved with new checksums
    assert tolstat.load_table(p).entry(OP, "float16", HW).statistics["op_score"].threshold == \
        2 * operator_table.entry(OP, "float16", HW).statistics["op_score"].threshold


def test_tables_saved_without_checksums_still_load(operator_table, tmp_path):
    doc = _saved(operator_table, tmp_path / "t.json")
    del doc["checksum"]
    for g in doc["groups"]:
        del g["checksum"]
    t = tolstat.load_table(_write(tmp_path / "old.json", doc))
    assert t.entry(OP, "float16", HW).certificate == operator_table.entry(OP, "float16", HW).certificate
    # the table as the earlier writer laid it out
    old = _write(tmp_path / "older.json", operator_table.to_dict())
    assert tolstat.load_table(old).groups == operator_table.groups


def test_removed_group_or_checksum_and_edited_settings_are_refused(tmp_path):
    t = _table([_group("a", "float32", "*", 1.0), _group("b", "float32", "*", 2.0)])
    doc = _saved(t, tmp_path / "t.json")
    gone = copy.deepcopy(doc)
    gone["groups"].pop()
    with pytest.raises(ValueError, match=r"table settings or its list of groups were edited"):
        tolstat.load_table(_write(tmp_path / "gone.json", gone))
    nosum = copy.deepcopy(doc)
    del nosum["groups"][1]["checksum"]
    with pytest.raises(ValueError, match=r"group \('b', 'float32', '\*'\) has no checksum"):
        tolstat.load_table(_write(tmp_path / "nosum.json", nosum))
    stats = copy.deepcopy(doc)
    stats["fp_budget"] = 0.02
    with pytest.raises(ValueError, match=r"table settings or its list of groups were edited"):
        tolstat.load_table(_write(tmp_path / "settings.json", stats))
    assert tolstat.load_table(tmp_path / "settings.json", verify=False).fp_budget == 0.02
    bad = copy.deepcopy(doc)
    bad["groups"][0]["checksum"] = 5
    with pytest.raises(ValueError, match=r"group \('a', 'float32', '\*'\): checksum must be a string 'sha256:<hex>', got 5"):
        tolstat.load_table(_write(tmp_path / "bad.json", bad))


def test_netcdf_tables_carry_the_checksum_too(operator_table, tmp_path):
    p = tmp_path / "t.nc"
    operator_table.to_netcdf(p)
    back = tolstat.load_table(p)
    assert back.entry(OP, "float16", HW).certificate == operator_table.entry(OP, "float16", HW).certificate
    assert "checksum" not in back.data and "checksum" not in back.data.attrs
    ds = xr.open_dataset(p, engine="h5netcdf").load()
    ds.close()
    c = json.loads(str(ds["certificate_json"].values[0]))
    c["normalisers"] = {k: v * 1e6 for k, v in c["normalisers"].items()}
    ds["certificate_json"] = ("group", np.array([json.dumps(c, sort_keys=True)]))
    ds.to_netcdf(tmp_path / "edited.nc", engine="h5netcdf")
    with pytest.raises(ValueError, match=GROUP + r" was edited after it was saved"):
        tolstat.load_table(tmp_path / "edited.nc")
    assert tolstat.load_table(tmp_path / "edited.nc", verify=False).entry(OP, "float16", HW).certificate[
        "normalisers"] == c["normalisers"]
    old = ds.drop_vars("checksum")
    del old.attrs["checksum"]
    old.to_netcdf(tmp_path / "old.nc", engine="h5netcdf")  # saved before checksums: loads
    assert len(tolstat.load_table(tmp_path / "old.nc")) == 1


def test_load_table_verify_must_be_a_bool(tmp_path):
    p = tmp_path / "t.json"
    _table([_group("a", "float32", "*", 1.0)]).to_json(p)
    with pytest.raises(TypeError, match=r"verify must be True or False, got 'no'"):
        tolstat.load_table(p, verify="no")


# ---------------------------------------------------------------- diff names every decision change
def _variant(table, path, fn):
    d = table.to_dict()
    fn(d["groups"][0])
    t = tolstat.ToleranceTable.from_groups(d["groups"], d)
    t.to_json(path)
    return str(path)


def _diff(capsys, old, new):
    capsys.readouterr()
    assert main(["diff", old, new, "--changed-only"]) == 0
    return capsys.readouterr().out


def test_diff_reports_certificate_normaliser_changes(operator_table, tmp_path, capsys):
    old = str(tmp_path / "old.json")
    operator_table.to_json(old)
    q = operator_table.entry(OP, "float16", HW).certificate["normalisers"]

    def scale_up(g):
        g["certificate"]["normalisers"] = {k: v * 1e6 for k, v in g["certificate"]["normalisers"].items()}

    out = _diff(capsys, old, _variant(operator_table, tmp_path / "new.json", scale_up))
    assert "0 changed" not in out and out.rstrip().endswith("1 changed (0 thresholds), 0 unchanged (group, "
                                                            "statistic) entries")
    row = next(line for line in out.splitlines() if line.lstrip().startswith("~  matmul"))
    assert "float16" in row and HW in row
    assert f"certificate normalisers['op_max'] {q['op_max']:.4g} -> {q['op_max'] * 1e6:.4g}" in row

    def swap(g):
        g["certificate"]["normalisers"] = {"op_max": 1.0}
        g["certificate"]["method"] = "pooled_order_statistic"
        g["certificate"]["rowwise"] = True

    out = _diff(capsys, old, _variant(operator_table, tmp_path / "new2.json", swap))
    assert "certificate normalisers['op_rms'] removed" in out
    assert "certificate method order_statistic -> pooled_order_statistic" in out
    assert "certificate rowwise False -> True" in out


def test_diff_reports_scale_model_changes(allclose_table, tmp_path, capsys):
    old = str(tmp_path / "old.json")
    allclose_table.to_json(old)
    rtol = allclose_table.entry(OP, "float16", HW).scale.rtol
    out = _diff(capsys, old, _variant(allclose_table, tmp_path / "new.json",
                                      lambda g: g["scale"].__setitem__("rtol", g["scale"]["rtol"] * 100)))
    assert "0 changed" not in out
    assert f"scale rtol {rtol:.4g} -> {rtol * 100:.4g}" in out

    def reform(g):
        g["scale"]["form"] = "size_aware"
        g["scale"]["power"] = {"K": [0.5, 32.0]}

    out = _diff(capsys, old, _variant(allclose_table, tmp_path / "new2.json", reform))
    assert "scale form allclose -> size_aware" in out and "scale power['K'] added ([0.5, 32.0])" in out


def test_diff_of_a_tiny_change_shows_distinct_numbers(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    g = _group("mm", "float32", "*", 1.0)
    g["certificate"] = {"form": "plain", "normalisers": {"max_abs": 1.0}, "n_scores": 400}
    _table([g]).to_json(a)
    g["certificate"]["normalisers"]["max_abs"] = 1.0000001
    g["certificate"]["n_scores"] = 399
    _table([g]).to_json(b)
    out = _diff(capsys, str(a), str(b))
    assert "certificate normalisers['max_abs'] 1.0 -> 1.0000001" in out
    assert "certificate n_scores 400 -> 399" in out


def test_diff_and_show_refuse_an_edited_table_unless_asked(operator_table, tmp_path, capsys):
    p = tmp_path / "t.json"
    doc = _saved(operator_table, p)
    doc["groups"][0]["certificate"]["normalisers"]["op_max"] *= 1e6
    e = _write(tmp_path / "edited.json", doc)
    assert main(["show", str(e)]) == 2
    assert "was edited after it was saved" in capsys.readouterr().err
    assert main(["show", str(e), "--no-verify"]) == 0
    assert main(["diff", str(p), str(e)]) == 2
    assert "was edited after it was saved" in capsys.readouterr().err
    assert main(["diff", str(p), str(e), "--no-verify"]) == 0
    assert "certificate normalisers['op_max']" in capsys.readouterr().out


# ---------------------------------------------------------------- many groups (correctness; timing in benchmarks/)
def _many(n):
    groups = []
    for i in range(n):
        g = _group(f"op{i:04d}", "float16", ("gpuA", "gpuB")[i % 2], 1.0 + i, statistic="op_score")
        g["certificate"] = {"form": "operator", "method": "order_statistic", "normalisers": {"op_max": 2.0 + i},
                            "rowwise": False, "needs_magnitude": True, "covariates": ["K"], "guarantee": "PAC"}
        groups.append(g)
    return _table(groups, statistic="op_score")


def test_save_load_show_and_diff_of_hundreds_of_groups(tmp_path, capsys):
    t = _many(300)
    p, q = tmp_path / "a.json", tmp_path / "b.nc"
    t.to_json(p)
    t.to_netcdf(q)
    for back in (tolstat.load_table(p), tolstat.load_table(q)):
        assert back.groups == sorted(t.groups) or back.groups == t.groups
        for i in (0, 137, 299):
            key = (f"op{i:04d}", "float16", ("gpuA", "gpuB")[i % 2])
            e = back.entry(*key)
            assert e.statistics["op_score"].threshold == 1.0 + i
            assert e.certificate["normalisers"] == {"op_max": 2.0 + i}
    capsys.readouterr()
    assert main(["show", str(p)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tolstat table {p}: 300 groups")
    assert sum(line.startswith("op0") for line in out.splitlines()) == 300
    assert "op0137  float16  gpuB" in out
    assert main(["diff", str(p), str(q)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("0 changed (0 thresholds), 300 unchanged (group, statistic) "
                                                     "entries")
    # lookups without hardware on a table with several: the only hardware of each (op, dtype)
    assert t.entry("op0001", "float16").hardware == "gpuB"
    assert t.to_assert_close_kwargs() == {}  # op_score has no allclose form: every group skipped
    assert math.isfinite(t.entry("op0299", "float16", "gpuB").statistics["op_score"].threshold)
