"""Bad input never passes silently: every boundary raises a clear error, or gives the right result.

Each case asserts the exception type and a fragment of its message (the argument, the
value or what is allowed), or the correct result. Kinds: array inputs, ULP edge cases,
covariates, labels, budgets, tables on load, datasets on open, duplicate runs, store
identity, the CLI and the pytest plugin (see ``docs/errors.md``).
"""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat._base import validate as _validate
from tolstat.cli.main import main as cli_main
from tolstat.dataset.schema import DuplicateRunsWarning, duplicate_runs
from tolstat.assess.evaluation import EvalConfig
from tolstat.measure.metrics import ulp_distance
from tolstat.calibration.table import ToleranceTable, load_table

pytest.importorskip("h5netcdf")
pytest_plugins = ["pytester"]


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


def _make(rng):
    k = int(rng.choice([16, 64]))
    return tolstat.Inputs(args=(rng.standard_normal(k),), labels={"dist": "normal"}, covariates={"K": k})


@pytest.fixture(scope="module")
def ds():
    return tolstat.collect(_kernel, _ref, _make, op="mul3", dtype="float16", runs=60, hardware="cpu",
                           seed=1, options=tolstat.CollectOptions(sample_size=32, progress=False))


@pytest.fixture(scope="module")
def table(ds):
    return tolstat.select(ds, form=None, fp_budget=0.05, confidence=0.9)


@pytest.fixture(scope="module")
def table_doc(table):
    return table.to_dict()


def _write_doc(tmp_path, doc, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _xy(n=8):
    x = np.random.default_rng(0).standard_normal(n)
    return _kernel(x), _ref(x)


def _check(table, actual, expected, **kw):
    return tolstat.check(actual, expected, op="mul3", dtype="float16", table=table, **kw)


# --------------------------------------------------------------------------- array inputs
@pytest.mark.parametrize("bad,exc,match", [
    (np.zeros(4, dtype=[("a", "f4"), ("b", "f4")]), TypeError, "structured dtype"),
    (np.zeros(4, dtype=np.complex128), TypeError, "complex dtype"),
    (np.array(["1.0", "2.0", "3", "4"]), TypeError, "unsupported dtype <U3"),
    (np.array([1.0, None, 2.0, 3.0], dtype=object), TypeError, "unsupported dtype object"),
    (np.arange(4), TypeError, "integer/bool dtype"),
    (np.array([True, False, True, True]), TypeError, "integer/bool dtype"),
])
def test_bad_array_dtype_in_check(table, bad, exc, match):
    _, e = _xy(4)
    with pytest.raises(exc, match=match):
        _check(table, bad, e)


def test_bad_reference_dtype_named(table):
    a, _ = _xy(4)
    with pytest.raises(TypeError, match="expected has complex dtype"):
        _check(table, a, np.zeros(4, np.complex64))


def test_shape_mismatch(table):
    a, e = _xy(8)
    with pytest.raises(ValueError, match=r"shape mismatch: actual \(8,\) vs expected \(7,\)"):
        _check(table, a, e[:7])


@pytest.mark.parametrize("bad,match", [
    (np.array([1 + 1j, 2.0]), "complex dtype"),
    (np.array(["a", "b"]), "unsupported dtype"),
    (np.zeros(2, dtype=[("x", "f8")]), "structured dtype"),
])
def test_ulp_distance_refuses_non_real(bad, match):
    with pytest.raises(TypeError, match=match):
        ulp_distance(bad, np.zeros(2), "float16")
    with pytest.raises(TypeError, match="expected has .*" + match):
        ulp_distance(np.zeros(2, np.float16), bad, "float16")


# --------------------------------------------------------------------------- ULP saturation
@pytest.mark.parametrize("dtype,sat,ref", [
    ("float16", 65504.0, 1e6),
    ("bfloat16", float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 1e39),
    ("float8_e4m3fn", 448.0, 1e4),
    ("float8_e5m2", 57344.0, 1e6),
    ("float32", float(np.finfo(np.float32).max), 1e39),
])
def test_saturated_output_is_not_zero_ulp(dtype, sat, ref):
    a = np.array([sat, -sat]).astype(tolstat.measure.metrics.target_dtype(dtype).np_dtype)
    d = ulp_distance(a, np.array([ref, -ref]), dtype)
    assert np.all(d == np.inf)
    # an in-range reference next to the maximum is still counted exactly
    assert ulp_distance(a[:1], np.array([sat]), dtype)[0] == 0


def test_max_ulp_check_fails_a_saturated_output(ds):
    t = tolstat.select(ds, form=None, fp_budget=0.05, confidence=0.9, statistic="max_ulp")
    x = np.full(16, 1e6)
    res = tolstat.check(np.full(16, 65504, np.float16), x, op="mul3", dtype="float16", table=t)
    assert not res.passed and res.statistics["max_ulp"] == np.inf


# --------------------------------------------------------------------------- covariates
@pytest.mark.parametrize("cov,exc,match", [
    ({"K": np.inf}, ValueError, r"covariate 'K' must be a finite number.*inf"),
    ({"K": float("nan")}, ValueError, r"covariate 'K' must be a finite number.*nan"),
    ({"K": [1, 2]}, TypeError, r"covariate 'K' must be a real number, got \[1, 2\]"),
    ({"K": "512"}, TypeError, r"covariate 'K' must be a real number, got '512'"),
    ({"K": True}, TypeError, "covariate 'K' must be a real number"),
    ({"ref_rms": 1e9}, ValueError, "covariate 'ref_rms' is computed from the reference"),
    ({"ref_max_abs": 1e9}, ValueError, "covariate 'ref_max_abs' is computed"),
    ({"n_elements": 1}, ValueError, "covariate 'n_elements' is computed"),
    ({"a,b": 1.0}, ValueError, "may not contain commas"),
    ([("K", 1)], TypeError, "covariates must be a mapping"),
])
def test_bad_covariates_in_check(table, cov, exc, match):
    a, e = _xy()
    with pytest.raises(exc, match=match):
        _check(table, a, e, covariates=cov)


def test_bad_covariate_in_allclose(ds):
    t = tolstat.select(ds, fp_budget=0.05, confidence=0.9, form="size_aware")
    ent = t.entry("mul3", "float16")
    with pytest.raises(ValueError, match="covariate 'K' must be a finite number"):
        ent.allclose({"K": np.inf, "ref_rms": 1.0})
    with pytest.raises(ValueError, match="covariate 'K' must be a finite number"):
        t.to_assert_close_kwargs(covariates={"K": np.inf, "ref_rms": 1.0}, skip_unsupported=False)
    atol, rtol = ent.allclose({"K": 64.0, "ref_rms": 1.0})
    assert np.isfinite(atol) and np.isfinite(rtol)


def test_bad_covariate_in_collect():
    def make(rng):
        return tolstat.Inputs(args=(rng.standard_normal(8),), covariates={"K": float("inf")})

    with pytest.raises(ValueError, match="covariate 'K' must be a finite number"):
        tolstat.collect(_kernel, _ref, make, op="mul3", dtype="float16", runs=2, hardware="cpu")


def test_computed_covariate_cannot_be_recorded():
    def make(rng):
        return tolstat.Inputs(args=(rng.standard_normal(8),), covariates={"ref_rms": 1.0})

    with pytest.raises(ValueError, match="'ref_rms' is computed"):
        tolstat.collect(_kernel, _ref, make, op="mul3", dtype="float16", runs=2, hardware="cpu")


def test_numpy_scalar_covariate_is_fine(table):
    a, e = _xy()
    assert _check(table, a, e, covariates={"K": np.int64(8), "L": np.array(2.0)}).passed


# --------------------------------------------------------------------------- labels
@pytest.mark.parametrize("kw,match", [
    (dict(op="mul3\x00x"), r"op 'mul3\\x00x' contains the control character '\\x00'"),
    (dict(op="mul3\n"), r"control character '\\n'"),
    (dict(hardware="cpu\x07"), "hardware .* control character"),
    (dict(labels={"dist": "a\x00b"}), "label 'dist' .* control character"),
    (dict(labels={"a,b": "x"}), "label name 'a,b' may not contain commas"),
    (dict(labels={"": "x"}), "label name '' must be non-empty"),
    (dict(labels=["dist"]), r"CollectOptions.labels must be a mapping \{name: value\} or None, got \['dist'\]"),
])
def test_bad_labels(kw, match):
    args = dict(op="mul3", dtype="float16", runs=2, hardware="cpu")
    args.update(kw)
    labels = args.pop("labels", None)
    with pytest.raises((ValueError, TypeError), match=match):
        tolstat.collect(_kernel, _ref, lambda r: (r.standard_normal(8),),
                        options=tolstat.CollectOptions(labels=labels, progress=False), **args)


def test_per_run_labels_must_be_mappings():
    with pytest.raises(TypeError, match="labels and covariates must be mappings"):
        tolstat.collect(_kernel, _ref, lambda r: tolstat.Inputs(args=(r.standard_normal(8),), labels=["dist"]),
                        op="mul3", dtype="float16", runs=2, hardware="cpu",
                        options=tolstat.CollectOptions(progress=False))


def test_comma_in_label_value_is_kept(tmp_path):
    ds = tolstat.collect(_kernel, _ref, lambda r: (r.standard_normal(8),), op="mul3", dtype="float16",
                         runs=2, hardware="cpu", options=tolstat.CollectOptions(labels={"dist": "a,b"}, progress=False))
    tolstat.save(ds, tmp_path / "c.nc")
    assert tolstat.open_errors(tmp_path / "c.nc")["dist"].values.tolist() == ["a,b", "a,b"]


# --------------------------------------------------------------------------- budgets
@pytest.mark.parametrize("budget,match", [
    (5, r"fp_budget must be a probability in \[1e-09, 0.5\].*got 5.0"),
    (1e-300, r"fp_budget must be a probability in \[1e-09, 0.5\].*got 1e-300"),
    (0.0, r"\[1e-09, 0.5\].*got 0.0"),
    (0.9, r"\[1e-09, 0.5\].*got 0.9"),
    (float("nan"), r"got nan"),
    ("abc", r"fp_budget must be a probability .* got 'abc'"),
])
def test_bad_fp_budget(ds, budget, match):
    with pytest.raises(ValueError, match=match):
        tolstat.select(ds, form=None, fp_budget=budget)


def test_smallest_budget_is_accepted_but_needs_data():
    # the validation accepts 1e-9; 60 runs (not correctly rounded) cannot support it:
    # NotEnoughData says how many
    rng = np.random.default_rng(0)
    pairs = [(r * (1 + rng.uniform(-2.0**-11, 2.0**-11, 16))).astype(np.float16) for r in
             (rng.standard_normal(16) for _ in range(60))]
    # references 0.7 ULP away from the output: the output is never the rounded reference
    noisy = tolstat.from_pairs([(a, a.astype(np.float64) + 0.7 * np.spacing(a).astype(np.float64)) for a in pairs],
                               op="mul3", dtype="float16", options=tolstat.CollectOptions(progress=False))
    with pytest.raises(tolstat.NotEnoughData, match="units") as info:
        tolstat.select(noisy, form=None, fp_budget=_validate.MIN_BUDGET)
    assert info.value.n_needed > 10**8


@pytest.mark.parametrize("conf", [-1, 0, 1, 1.5])
def test_bad_confidence(ds, conf):
    with pytest.raises(ValueError, match=f"confidence must lie strictly between 0 and 1, got {float(conf)!r}"):
        tolstat.select(ds, form=None, fp_budget=0.05, confidence=conf)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(fp_budget=2), ValueError, r"fp_budget must be a probability in \[1e-09, 0.5\]"),
    (dict(n_cal=0), ValueError, "n_cal must be an integer >= 1, got 0"),
    (dict(n_test=-1), ValueError, "n_test must be an integer >= 1, got -1"),
    (dict(n_cal=2.5), TypeError, "n_cal must be an integer"),
    (dict(ops=["bogus"]), ValueError, r"unknown op\(s\) \['bogus'\]"),
    (dict(dtypes=("float17",)), ValueError, "float17"),
])
def test_bad_eval_config(kw, exc, match):
    with pytest.raises(exc, match=match):
        EvalConfig(**kw)


# --------------------------------------------------------------------------- tables on load
def _stat(doc):
    return doc["groups"][0]["statistics"]["max_abs"]


@pytest.mark.parametrize("edit,match", [
    (lambda d: _stat(d).update(threshold="inf"), r"threshold must be a finite number >= 0, got inf"),
    (lambda d: _stat(d).update(threshold="Infinity"), r"threshold must be a finite number >= 0, got inf"),
    (lambda d: _stat(d).update(threshold=-1.0), r"threshold must be a finite number >= 0, got -1.0"),
    (lambda d: _stat(d).update(threshold="abc"), r"expected a number, got 'abc'"),
    (lambda d: _stat(d).update(threshold=[1.0]), r"expected a number, got \[1.0\]"),
    (lambda d: d.update(fp_budget=5), r"fp_budget must be a probability in \[1e-09, 0.5\].*got 5"),
    (lambda d: d.update(confidence=-1), r"confidence must lie strictly between 0 and 1, got -1"),
    (lambda d: _stat(d).update(budget=2.0), r"budget must lie in \(0, 1\), got 2.0"),
    (lambda d: _stat(d).update(confidence=0.0), r"confidence must lie in \(0, 1\), got 0.0"),
    (lambda d: d["groups"][0].update(n=0), r"'n' \(calibration runs\) must be integers >= 1"),
    (lambda d: d["groups"][0].update(scale={"form": "allclose", "atol": "inf", "rtol": 0.0}),
     r"scale atol must be finite"),
    (lambda d: d["groups"][0].update(scale={"form": "allclose", "atol": 1e-3, "rtol": -1.0}),
     r"scale rtol must be >= 0"),
    (lambda d: _stat(d).pop("threshold"), r"statistic 'max_abs' has no 'threshold'"),
    (lambda d: d.pop("groups"), r"missing key 'groups'"),
    (lambda d: d["groups"][0].pop("op"), r"group 0 has no 'op'"),
    (lambda d: d.update(statistics=["max_foo"]), r"has no entry for statistic 'max_foo'"),
    (lambda d: d["groups"].append(json.loads(json.dumps(d["groups"][0]))), r"duplicate \(op, dtype, hardware\)"),
    (lambda d: d.update(tolstat_table="abc"), r"table schema 'abc' is not supported"),
    (lambda d: d.update(groups=[]), r"non-empty list of groups"),
    (lambda d: d["groups"][0].update(op="mul3\x00"), r"control character"),
])
def test_bad_table_json(tmp_path, table_doc, edit, match):
    doc = json.loads(json.dumps(table_doc))
    edit(doc)
    p = _write_doc(tmp_path, doc)
    with pytest.raises(ValueError, match=match):
        load_table(p)


def test_nan_threshold_loads_but_never_passes(tmp_path, table_doc):
    # a NaN threshold (a refused group) cannot switch a check off: looking it up raises
    doc = json.loads(json.dumps(table_doc))
    _stat(doc)["threshold"] = "nan"
    t = load_table(_write_doc(tmp_path, doc))
    with pytest.raises(KeyError, match="has no max_abs threshold"):
        t.entry("mul3", "float16", "cpu")


def test_unknown_statistic_in_table(tmp_path, table_doc):
    doc = json.loads(json.dumps(table_doc))
    doc["statistics"] = ["max_foo"]
    doc["groups"][0]["statistics"]["max_foo"] = doc["groups"][0]["statistics"].pop("max_abs")
    with pytest.raises(ValueError, match=r"unknown statistic\(s\) \['max_foo'\]; known:"):
        load_table(_write_doc(tmp_path, doc))


def test_table_threshold_1e999_text(tmp_path, table_doc):
    doc = json.loads(json.dumps(table_doc))
    _stat(doc)["threshold"] = "__threshold__"
    text = json.dumps(doc).replace('"__threshold__"', "1e999", 1)
    p = tmp_path / "t.json"
    p.write_text(text)
    with pytest.raises(ValueError, match="threshold must be a finite number >= 0, got inf"):
        load_table(p)


def test_deeply_nested_json(tmp_path):
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply|not a tolstat"):
        load_table(p)


@pytest.mark.parametrize("content,match", [
    ('{"tolstat_table": 1, "groups": [', "not valid JSON"),
    ("[1, 2]", "not a tolstat tolerance table"),
    (b"\xff\xfe\x00", "not valid JSON"),
])
def test_truncated_or_foreign_json(tmp_path, content, match):
    p = tmp_path / "t.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=match):
        load_table(p)


def test_table_path_is_a_directory(tmp_path):
    (tmp_path / "t.json").mkdir()
    with pytest.raises(ValueError, match="is a directory, not a tolerance table file"):
        load_table(tmp_path / "t.json")


def test_table_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tolerance table at"):
        load_table(tmp_path / "nope.json")


def test_table_unknown_extension(tmp_path, table):
    p = tmp_path / "t.txt"
    p.write_text(table.to_json())
    with pytest.raises(ValueError, match=r"ends in .json or .nc, got '.txt'"):
        load_table(p)


def test_truncated_netcdf_table(tmp_path, table):
    p = tmp_path / "t.nc"
    table.to_netcdf(p)
    p.write_bytes(p.read_bytes()[:500])
    with pytest.raises(ValueError, match="cannot read .* as a netCDF tolerance table"):
        load_table(p)


def test_tampered_netcdf_table(tmp_path, table):
    d = table.data.copy(deep=True)
    d["threshold"][:] = np.inf
    d.to_netcdf(tmp_path / "t.nc", engine="h5netcdf")
    with pytest.raises(ValueError, match="threshold must be a finite number >= 0, got inf"):
        load_table(tmp_path / "t.nc")


def test_table_round_trip_still_loads(tmp_path, table):
    table.to_json(tmp_path / "ok.json")
    table.to_netcdf(tmp_path / "ok.nc")
    for p in ("ok.json", "ok.nc"):
        back = load_table(tmp_path / p)
        assert back.groups == table.groups and back.fp_budget == table.fp_budget


def test_table_from_foreign_object():
    with pytest.raises(TypeError, match="ToleranceTable needs an xarray.Dataset, got dict"):
        ToleranceTable({"tolstat_table": 1})


# --------------------------------------------------------------------------- datasets on open
def test_dataset_schema_abc(tmp_path, ds):
    bad = ds.copy()
    bad.attrs["tolstat_schema"] = "abc"
    bad.to_netcdf(tmp_path / "e.nc", engine="h5netcdf")
    with pytest.raises(ValueError, match="schema version 'abc' is not supported"):
        tolstat.open_errors(tmp_path / "e.nc")


def test_empty_dir_named_zarr(tmp_path):
    (tmp_path / "e.zarr").mkdir()
    with pytest.raises(ValueError, match="cannot read .*e.zarr.* as a zarr error dataset"):
        tolstat.open_errors(tmp_path / "e.zarr")


def test_plain_file_named_zarr(tmp_path):
    (tmp_path / "e.zarr").write_text("hello")
    with pytest.raises(ValueError, match="is a plain file, not a zarr store"):
        tolstat.open_errors(tmp_path / "e.zarr")


def test_directory_named_nc(tmp_path):
    (tmp_path / "e.nc").mkdir()
    with pytest.raises(ValueError, match="is a directory, not a netCDF file"):
        tolstat.open_errors(tmp_path / "e.nc")


def test_missing_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="no error dataset at"):
        tolstat.open_errors(tmp_path / "nope.nc")


@pytest.mark.parametrize("factor,match", [(1e3, "larger than every sampled error"),
                                          (1e-3, "exceeds its 'max_abs'")])
def test_tampered_max_abs(tmp_path, ds, factor, match):
    bad = ds.copy(deep=True)
    bad["max_abs"].values[3] *= factor
    bad.to_netcdf(tmp_path / "e.nc", engine="h5netcdf")
    with pytest.raises(ValueError, match=f"run 3: .*{match}"):
        tolstat.open_errors(tmp_path / "e.nc")


@pytest.mark.parametrize("obj", [{"a": 1}, [1, 2], None])
def test_save_foreign_object(tmp_path, obj):
    with pytest.raises(TypeError, match="save needs an error dataset"):
        tolstat.save(obj, tmp_path / "e.nc")


def test_save_dataarray(tmp_path, ds):
    with pytest.raises(TypeError, match="got DataArray"):
        tolstat.save(ds["max_abs"], tmp_path / "e.nc")


def test_save_unknown_extension(tmp_path, ds):
    with pytest.raises(ValueError, match="cannot tell the format"):
        tolstat.save(ds, tmp_path / "e.csv")


def test_save_non_tolstat_dataset(tmp_path):
    with pytest.raises(ValueError, match="missing attribute 'tolstat_schema'"):
        tolstat.save(xr.Dataset({"x": ("run", [1.0])}), tmp_path / "e.nc")


# --------------------------------------------------------------------------- duplicate runs
def test_triplicated_runs_are_calibrated_once(ds, table):
    triple = tolstat.concat([ds, ds, ds])
    assert duplicate_runs(triple).size == 2 * ds.sizes["run"]
    with pytest.warns(DuplicateRunsWarning, match=f"{2 * ds.sizes['run']} of {3 * ds.sizes['run']} runs"):
        t3 = tolstat.select(triple, form=None, fp_budget=0.05, confidence=0.9)
    e1, e3 = table.entry("mul3", "float16"), t3.entry("mul3", "float16")
    assert e3.n == e1.n == ds.sizes["run"]
    assert e3.statistics["max_abs"].threshold == e1.statistics["max_abs"].threshold


def test_distinct_runs_are_not_duplicates(ds):
    assert duplicate_runs(ds).size == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", DuplicateRunsWarning)
        tolstat.select(ds, form=None, fp_budget=0.05, confidence=0.9)


def test_same_seed_different_kernel_is_not_a_duplicate(ds):
    other = tolstat.collect(lambda x: _kernel(x) * np.float16(1.001), _ref, _make, op="mul3",
                            dtype="float16", runs=60, hardware="cpu", seed=1, options=tolstat.CollectOptions(sample_size=32))
    both = tolstat.concat([ds, other])
    assert duplicate_runs(both).size == 0


# --------------------------------------------------------------------------- store identity
def test_store_refuses_a_changed_kernel_body(tmp_path):
    kw = dict(op="mul3", dtype="float16", runs=2, hardware="cpu",
              options=tolstat.CollectOptions(sample_size=16, progress=False))
    store = tmp_path / "s.zarr"

    def kernel(x):
        return _kernel(x)

    tolstat.collect(kernel, _ref, _make, store=store, **kw)

    def kernel(x):  # noqa: F811 - same name, different body
        return _kernel(x) * np.float16(2)

    with pytest.raises(ValueError, match="kernel: the code of 'test_store_refuses_a_changed_kernel_body.<locals>.kernel' differs"):
        tolstat.collect(kernel, _ref, _make, store=store, **kw)


def test_store_resumes_with_the_same_code(tmp_path):
    kw = dict(op="mul3", dtype="float16", runs=2, hardware="cpu",
              options=tolstat.CollectOptions(sample_size=16, progress=False))
    store = tmp_path / "s.zarr"
    makers = []
    for _ in range(2):
        def kernel(x):  # re-defined with the same body: same code hash
            return _kernel(x)

        makers.append(kernel)
    a = tolstat.collect(makers[0], _ref, _make, store=store, **kw)
    b = tolstat.collect(makers[1], _ref, _make, store=store, **kw)
    xr.testing.assert_identical(a, b)


def test_code_fingerprint_sees_closures_and_partials():
    import functools

    def f(x, s):
        return x * s

    assert _validate.code_fingerprint(functools.partial(f, s=2)) != _validate.code_fingerprint(
        functools.partial(f, s=3))

    def make(c):
        return lambda x: x + c

    assert _validate.code_fingerprint(make(1)) != _validate.code_fingerprint(make(2))
    assert _validate.code_fingerprint(make(1)) == _validate.code_fingerprint(make(1))


# --------------------------------------------------------------------------- CLI
def _cli(argv, capsys):
    try:
        rc = cli_main(argv)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    return rc, err


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory, ds, table):
    d = tmp_path_factory.mktemp("cli")
    tolstat.save(ds, d / "e.nc")
    table.to_json(d / "t.json")
    a, e = _xy(16)
    np.save(d / "a.npy", a)
    np.save(d / "e.npy", e)
    (d / "res").mkdir()
    (d / "res" / "results.json").write_text('{"config": {}, "summary": [1]}')
    (d / "tdir.json").mkdir()
    return d


@pytest.mark.parametrize("argv,match", [
    ("collect -o {d}/x.nc --cases 0", "argument --cases: cases must be an integer >= 1, got 0"),
    ("evaluate --n-cal -1", "argument --n-cal: n_cal must be an integer >= 1, got -1"),
    ("evaluate --fp-budget 2", r"argument --fp-budget: fp_budget must be a probability in \[1e-09, 0.5\]"),
    ("evaluate --fp-budget 1e-300", r"argument --fp-budget: .*got 1e-300"),
    ("evaluate --confidence 1.5", "argument --confidence: confidence must lie strictly between 0 and 1"),
    ("collect -o {d}/x.nc --ops bogus", r"unknown op\(s\) \['bogus'\]"),
    ("collect -o {d}/x.txt", r"argument -o/--output: '.*x.txt' must end in .nc or .zarr"),
    ("calibrate {d}/e.nc --fp-budget 0.05 -o {d}/t.txt", r"'.*t.txt' must end in .json or .nc"),
    ("calibrate {d}/nope.nc --fp-budget 0.05 -o {d}/t2.json", "no error dataset at"),
    ("report {d}/res", r"results.json' is not a tolstat evaluation result \(missing key"),
    ("check {d}/a.npy {d}/e.npy --op mul3 --dtype fp16 --table {d}/t.json --hardware cpu --cov K=inf",
     r"covariate 'K' must be a finite number"),
    ("check {d}/a.npy {d}/e.npy --op mul3 --dtype fp16 --table {d}/t.json --hardware cpu --cov ref_rms=1e9",
     r"covariate 'ref_rms' is computed"),
    ("check {d}/a.npy {d}/e.npy --op mul3 --dtype fp16 --table {d}/t.json --hardware cpu --cov K=abc",
     r"--cov 'K=abc': 'abc' is not a number"),
    ("check {d}/a.npy {d}/e.npy --op mul3 --dtype fp16 --table {d}/tdir.json", "is a directory"),
    ("check {d}/a.npy {d}/e.npy --op nope --dtype fp16 --table {d}/t.json", "no tolerance for op='nope'"),
    ("demo --runs 0", "argument --runs: runs must be an integer >= 1, got 0"),
    ("calibrate", "the following arguments are required"),
])
def test_cli_errors_are_one_line(cli_files, capsys, argv, match):
    rc, err = _cli(argv.format(d=cli_files).split(), capsys)
    assert rc == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert __import__("re").search(match, lines[0]), lines[0]


def test_cli_check_passes_good_input(cli_files, capsys):
    d = cli_files
    rc = cli_main(f"check {d}/a.npy {d}/e.npy --op mul3 --dtype fp16 --table {d}/t.json --hardware cpu --cov K=16".split())
    assert rc == 0 and capsys.readouterr().out.startswith("PASS mul3/float16")


# --------------------------------------------------------------------------- pytest plugin
SUITE = """
import numpy as np

def test_one(tolstat_check):
    x = np.linspace(-1, 1, 16)
    tolstat_check((x.astype(np.float16) * np.float16(3)).astype(np.float16),
                  x.astype(np.float16).astype(np.float64) * 3, op="mul3", dtype="float16")
"""


def _plugin_args():
    import importlib.metadata

    installed = any(ep.value == "tolstat.checks.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    return () if installed else ("-p", "tolstat.checks.pytest_plugin")


@pytest.mark.parametrize("kind", ["directory", "corrupt", "tampered"])
def test_plugin_bad_table_is_one_usage_error(pytester, tmp_path, table_doc, kind):
    p = tmp_path / "t.json"
    if kind == "directory":
        p.mkdir()
    elif kind == "corrupt":
        p.write_text('{"tolstat_table": 1, "gro')
    else:
        doc = json.loads(json.dumps(table_doc))
        _stat(doc)["threshold"] = "inf"
        p.write_text(json.dumps(doc))
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_plugin_args(), f"--tolstat-table={p}")
    text = res.stdout.str() + res.stderr.str()
    assert res.ret != 0
    assert __import__("re").search({"directory": "tolerance table '.*' is a directory",
                                    "corrupt": "cannot load the tolerance table .*not valid JSON",
                                    "tampered": "cannot load the tolerance table .*threshold must be a finite"}[kind],
                                   text)
    assert text.count("tolstat:") == 1  # one usage error


@pytest.mark.parametrize("path,match", [("{d}/nodir/rec.nc", "does not exist"),
                                        ("{d}/rec.csv", "must end in .nc or .zarr")])
def test_plugin_bad_record_path_fails_at_start(pytester, tmp_path, path, match):
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_plugin_args(), f"--tolstat-record={path.format(d=tmp_path)}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert match in res.stderr.str()


def test_tail_options_min_exceedances_below_two_named():
    """A tail fit needs two exceedances: TailOptions says so itself, naming the field."""
    from tolstat.calibration.bounds import TailOptions

    with pytest.raises(ValueError, match=r"TailOptions\.min_exceedances must be >= 2.*got 1"):
        TailOptions(min_exceedances=1)
    assert TailOptions(min_exceedances=2).min_exceedances == 2
