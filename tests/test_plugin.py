"""pytest plugin: table option / pyproject config, fixtures, recording (pytester)."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

import tolstat
from tolstat.calibration.selection import select

pytest_plugins = ["pytester"]

# installed (pip install -e .) the plugin loads through its pytest11 entry point;
# from a bare source tree it has to be named
_INSTALLED = any(ep.value == "tolstat.checks.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
_LOAD = () if _INSTALLED else ("-p", "tolstat.checks.pytest_plugin")

# import h5py before pytester's in-process runs: it cannot be imported twice in one process
pytest.importorskip("h5netcdf")


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


@pytest.fixture(scope="module")
def cal_data():
    return tolstat.collect(_kernel, _ref, lambda r: tolstat.Inputs(args=(r.standard_normal(64),)), op="mul3",
                           dtype="float16", runs=1500, hardware="cpu", options=tolstat.CollectOptions(progress=False))


@pytest.fixture(scope="module")
def table_path(tmp_path_factory, cal_data):
    p = tmp_path_factory.mktemp("tab") / "table.json"
    select(cal_data, fp_budget=0.01, form="allclose", by=("op", "dtype")).to_json(p)
    return p


@pytest.fixture(scope="module")
def hw_table_path(tmp_path_factory, cal_data):
    """Calibrated on hardware 'cpu' only (no '*' entry)."""
    p = tmp_path_factory.mktemp("tab") / "hw_table.json"
    select(cal_data, fp_budget=0.01, form="allclose").to_json(p)
    return p


SUITE = """
import numpy as np

def k(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)

def ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0

def test_good(tolstat_check):
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(64)
        tolstat_check(k(x), ref(x), op="mul3", dtype="float16")

def test_bad(tolstat_check):
    x = np.random.default_rng(9).standard_normal(64)
    out = k(x)
    out[7] += np.float16(0.5)
    tolstat_check(out, ref(x), op="mul3", dtype="float16")

def test_table_fixture(tolstat_table):
    assert tolstat_table.fp_budget == 0.01
"""


def test_suite_passes_and_fails(pytester, table_path):
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}")
    res.assert_outcomes(passed=2, failed=1)
    res.stdout.fnmatch_lines(["*op='mul3'*", "*worst element at index (7)*", "*probability that a correct kernel*"])


def test_table_from_pyproject(pytester, table_path):
    pytester.makepyfile(SUITE)
    pytester.makefile(".toml", pyproject=f'[tool.tolstat]\ntable = "{table_path.as_posix()}"\n')
    res = pytester.runpytest(*_LOAD)
    res.assert_outcomes(passed=2, failed=1)


def test_no_table_is_a_clear_failure(pytester):
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_LOAD)
    res.assert_outcomes(errors=3)
    res.stdout.fnmatch_lines(["*no tolerance table configured*"])


def test_record_writes_valid_dataset(pytester, table_path, tmp_path):
    pytester.makepyfile(SUITE)
    out = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}",
                             f"--tolstat-record={out}", "--tolstat-hardware=ci-box")
    res.assert_outcomes(passed=2, failed=1)
    ds = tolstat.open_errors(out)
    tolstat.dataset.validate(ds)
    assert ds.sizes["run"] == 3  # only the passing checks
    assert set(ds["hardware"].values) == {"ci-box"} and set(ds["op"].values) == {"mul3"}
    assert all("test_good" in t for t in ds["test"].values)
    assert not list(tmp_path.glob(".rec.nc.parts-*"))  # no parts folder without xdist


def test_record_only_mode(pytester, tmp_path):
    pytester.makepyfile(SUITE)
    out = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, f"--tolstat-record={out}", "-k", "not table")
    res.assert_outcomes(passed=2)
    assert tolstat.open_errors(out).sizes["run"] == 4


# ----------------------------------------------------------------------- failure output
def test_failure_output_is_short(pytester, table_path):
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}", "-k", "test_bad")
    res.assert_outcomes(failed=1)
    lines = res.stdout.lines
    start = next(i for i, line in enumerate(lines) if line.startswith("_") and "test_bad" in line)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("="))
    block = lines[start:end]
    assert len(block) < 20, "\n".join(block)
    text = "\n".join(block)
    assert "def assert_close" not in text and "__tracebackhide__" not in text  # no library frames
    assert "tolstat check FAILED" in text and "tolstat_check(out, ref(x)" in text


# ----------------------------------------------------------------------- bad tables: one usage error
@pytest.mark.parametrize("kind", ["missing", "directory", "invalid_json", "not_a_table", "bad_schema"])
def test_bad_table_is_one_usage_error(pytester, kind):
    pytester.makepyfile(SUITE)
    bad = pytester.path / "bad.json"
    if kind == "directory":
        bad = pytester.mkdir("tabledir")
    elif kind == "invalid_json":
        bad.write_text("{ not json")
    elif kind == "not_a_table":
        bad.write_text('{"groups": []}')
    elif kind == "bad_schema":
        bad.write_text('{"tolstat_table": 99, "groups": []}')
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={bad}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    err = "\n".join(res.stderr.lines)
    assert err.count("tolstat:") == 1 and str(bad.name) in err
    assert ("directory" in err) if kind == "directory" else ("cannot load the tolerance table" in err)
    assert "passed" not in "\n".join(res.stdout.lines)


def test_bad_record_path_is_a_usage_error_at_start(pytester, table_path):
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}",
                             f"--tolstat-record={pytester.path / 'no' / 'such' / 'rec.nc'}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*tolstat: --tolstat-record*does not exist*"])
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}", "--tolstat-record=rec.csv")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*must end in .nc or .zarr*"])


# ----------------------------------------------------------------------- marker, hypothesis
MARKED = """
import numpy as np
import pytest

def k(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)

def ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0

@pytest.mark.tolstat(op="mul3", dtype="float16")
def test_marked(tolstat_check):
    x = np.random.default_rng(1).standard_normal(64)
    r = tolstat_check(k(x), ref(x))
    assert r.op == "mul3" and r.dtype == "float16"

@pytest.mark.tolstat(op="mul3", dtype="float16")
def test_marked_bad(tolstat_check):
    x = np.random.default_rng(1).standard_normal(64)
    tolstat_check(k(x) * np.float16(1.5), ref(x))

def test_unmarked_needs_op(tolstat_check):
    tolstat_check(np.zeros(3), np.zeros(3))
"""


def test_marker_gives_op_and_dtype(pytester, table_path):
    pytester.makepyfile(MARKED)
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}", "--strict-markers")
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines(["*tolstat check FAILED: op='mul3'*", "*tolstat_check needs op and dtype*"])
    assert "tolstat(op=None" in "\n".join(pytester.runpytest(*_LOAD, "--markers").stdout.lines)


HYPO = """
import numpy as np
from hypothesis import given, settings, strategies as st

@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_property(tolstat_check, seed):
    x = np.random.default_rng(seed).standard_normal(64)
    out = (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)
    tolstat_check(out, x.astype(np.float16).astype(np.float64) * 3.0, op="mul3", dtype="float16")
"""


def test_hypothesis_given_test(pytester, table_path, tmp_path):
    pytest.importorskip("hypothesis")
    pytester.makepyfile(HYPO)
    out = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}", f"--tolstat-record={out}")
    res.assert_outcomes(passed=1)
    assert "FailedHealthCheck" not in "\n".join(res.stdout.lines)
    assert tolstat.open_errors(out).sizes["run"] >= 15


# ----------------------------------------------------------------------- xdist
XDIST = """
import numpy as np
import pytest

@pytest.mark.parametrize("i", range(10))
def test_many(tolstat_check, i):
    for j in range(2):
        x = np.random.default_rng(100 * i + j).standard_normal(64)
        out = (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)
        tolstat_check(out, x.astype(np.float16).astype(np.float64) * 3.0, op="mul3", dtype="float16")
"""


@pytest.mark.slow
def test_xdist_recording_keeps_every_record(pytester, table_path, tmp_path):
    pytest.importorskip("xdist")
    pytester.makepyfile(XDIST)
    out = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, "-n", "2", f"--tolstat-table={table_path}",
                                        f"--tolstat-record={out}")
    res.assert_outcomes(passed=10)
    res.stdout.fnmatch_lines(["*recorded 20 passing check(s)*"])
    ds = tolstat.open_errors(out)
    assert ds.sizes["run"] == 20
    assert sorted(set(ds["test"].values)) == sorted(f"test_xdist_recording_keeps_every_record.py::test_many[{i}]"
                                                    for i in range(10))
    assert not list(tmp_path.glob(".rec.nc.parts-*"))  # part files cleaned up


# ----------------------------------------------------------------------- header, hardware policy
def test_header_names_table_hardware_and_match(pytester, hw_table_path):
    pytester.makepyfile(SUITE)
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={hw_table_path}", "--tolstat-hardware=cpu", "-k", "good")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["tolstat: table *hw_table.json (1 groups, hardware cpu)",
                              "tolstat: this machine 'cpu': this machine is calibrated; hardware_policy=error"])


def test_hardware_policy_in_the_plugin(pytester, hw_table_path):
    pytester.makepyfile(SUITE)
    # this machine is not 'cpu': under the default policy that is one usage error at startup
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={hw_table_path}", "--tolstat-hardware=cuda:Other GPU")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*'cuda:Other GPU' is not in the tolerance table (calibrated on *'cpu'*"])
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={hw_table_path}", "--tolstat-hardware=cuda:Other GPU",
                             "--tolstat-hardware-policy=nearest", "-k", "good")
    res.assert_outcomes(passed=1)
    pytester.makefile(".toml", pyproject=f'[tool.tolstat]\ntable = "{hw_table_path.as_posix()}"\n'
                                         'hardware_policy = "pooled"\n')
    res = pytester.runpytest(*_LOAD, "--tolstat-hardware=cuda:Other GPU", "-k", "good")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*this machine is NOT calibrated; hardware_policy=pooled"])
    pytester.makefile(".toml", pyproject='[tool.tolstat]\nhardware_policy = "closest"\n')
    res = pytester.runpytest(*_LOAD)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*hardware_policy must be one of*"])


# ----------------------------------------------------------------------- suite budget
def test_suite_table_is_the_order_statistic_at_the_split_budget(cal_data):
    from tolstat.checks.pytest_plugin import suite_table

    base = select(cal_data, form=None, fp_budget=0.01, by=("op", "dtype"))
    t = suite_table(base, 0.01, 4)
    assert t.fp_budget == 0.0025
    e = t.entry("mul3", "float16")
    from tolstat.calibration.decision import run_values

    # the decision values the table was certified on (0 for correctly rounded runs)
    full = tolstat.calibration.calibrate(run_values(cal_data, "max_abs"), 0.0025, 0.95, method="order_statistic")
    assert e.statistics["max_abs"].threshold == full.threshold  # rank inside the stored top scores: exact
    assert e.statistics["max_abs"].threshold >= base.entry("mul3", "float16").statistics["max_abs"].threshold
    assert "Bonferroni" in e.statistics["max_abs"].reason
    # too many checks for the calibration runs: the group is refused with the runs needed
    with pytest.raises(KeyError, match="needs n >= "):
        suite_table(base, 0.01, 1000).entry("mul3", "float16")
    with pytest.raises(ValueError, match="more than the table's fp_budget"):
        suite_table(base, 0.5, 2)


def test_suite_budget_in_pyproject(pytester, table_path):
    pytester.makepyfile(SUITE)
    pytester.makefile(".toml", pyproject=f'[tool.tolstat]\ntable = "{table_path.as_posix()}"\nsuite_budget = 0.01\n')
    pytester.makeconftest("""
def pytest_sessionfinish(session):
    t = session.config.stash[__import__("tolstat.checks.pytest_plugin").checks.pytest_plugin._KEY].table
    print("PER_CHECK", t.fp_budget)
""")
    res = pytester.runpytest(*_LOAD, "-s")
    # 2 tests use tolstat_check, but test_good makes 3 checks: 4 checks > 2, so the promise fails;
    # test_table_fixture fails too: tolstat_table is the split table (fp_budget 0.005)
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines(["tolstat: suite budget 0.01, split over the checks after collection",
                              "tolstat: suite budget 0.01 split over 2 checks (Bonferroni): 0.005 per check",
                              "*PER_CHECK 0.005*", "*4 checks ran but the suite budget 0.01 was split over 2*"])
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    pytester.makefile(".toml", pyproject=f'[tool.tolstat]\ntable = "{table_path.as_posix()}"\n'
                                         'suite_budget = 0.01\nsuite_checks = 4\n')
    res = pytester.runpytest(*_LOAD, "-s", "-k", "good")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*PER_CHECK 0.0025"])
    assert res.ret == pytest.ExitCode.OK


def test_entry_point_name_allows_dash_p():
    # pytest skips an entry point whose name is already registered: naming it after the
    # module makes `pytest -p tolstat.checks.pytest_plugin` work with tolstat installed
    import tomllib
    from pathlib import Path

    pp = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pp["project"]["entry-points"]["pytest11"] == {"tolstat.checks.pytest_plugin": "tolstat.checks.pytest_plugin"}


@pytest.mark.slow
def test_dash_p_with_the_entry_point_installed(pytester, monkeypatch, tmp_path):
    # simulate an installed distribution whose pytest11 entry point has the new name;
    # `-p no:tolstat` blocks an older installed copy registered under the old name
    import os
    from pathlib import Path

    info = tmp_path / "site" / "tolstatsim-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tolstatsim\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\ntolstat.checks.pytest_plugin = tolstat.checks.pytest_plugin\n")
    root = str(Path(__file__).parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(info.parent), root]))
    pytester.makepyfile("def test_a(tolstat_check):\n    pass\n")
    res = pytester.runpytest_subprocess("-p", "no:tolstat", "-p", "tolstat.checks.pytest_plugin", "--tolstat-record=r.nc")
    res.assert_outcomes(passed=1)
    assert "already registered" not in "\n".join(res.stdout.lines + res.stderr.lines)


@pytest.mark.slow
def test_suite_budget_coverage_monte_carlo():
    """Exponential scores (true exceedance exp(-t)): the split thresholds keep the
    per-check budget suite_budget / N in at least `confidence` of the calibrations."""
    from tolstat.checks.pytest_plugin import suite_table

    suite, n_checks, n, reps = 0.02, 4, 700, 200
    per_check = suite / n_checks
    rng = np.random.default_rng(5)
    bad = 0
    for _ in range(reps):
        x = rng.exponential(size=n)
        top = np.sort(x)[::-1][:256]  # what a table stores
        g = {"op": "k", "dtype": "float16", "hardware": "*", "n": n, "statistics": {"max_abs": {
            "threshold": float(top[-1]), "estimate": float(top[-1]), "budget": 0.02, "confidence": 0.95,
            "method": "order_statistic", "reason": "", "tail": {}, "top_scores": top.tolist()}}}
        t = tolstat.ToleranceTable.from_groups([g], {"fp_budget": 0.02, "confidence": 0.95,
                                                     "statistics": ["max_abs"]})
        thr = suite_table(t, suite, n_checks).entry("k", "float16").statistics["max_abs"].threshold
        bad += np.exp(-thr) > per_check
    # binomial(200, 0.05): mean 10, P(>= 20) < 0.5%
    assert bad < 20, bad
    print(f"split thresholds over the per-check budget in {bad} of {reps} calibrations")


HW_SUITE = """
import numpy as np

def test_which_group(tolstat_check):
    x = np.float16([1.0, 2.0])
    r = tolstat_check(x, x.astype(np.float64), op="mul3", dtype="float16")
    print("GROUP", r.hardware, r.fallback, r.thresholds["max_abs"])
"""


def _mixed_table(path, hardware):
    from tolstat.calibration.table import ToleranceTable

    def grp(hw, thr):
        st = {"threshold": thr, "estimate": thr, "budget": 0.01, "confidence": 0.95, "method": "order_statistic",
              "reason": "test", "tail": {}, "top_scores": []}
        return {"op": "mul3", "dtype": "float16", "hardware": hw, "n": 400, "statistics": {"max_abs": st}}

    groups = [grp(hw, float(i + 1)) for i, hw in enumerate(hardware)]
    ToleranceTable.from_groups(groups, {"fp_budget": 0.01, "confidence": 0.95, "statistics": ["max_abs"]}).to_json(path)
    return path


@pytest.mark.parametrize("hardware,opt,want", [
    # the detected hardware is in the table: its exact group, not '*'
    (("*", "DET"), None, "GROUP DET exact 2.0"),
    # another specific hardware and '*': '*' (no "several hardware" error, no policy error)
    (("OTHER", "*"), None, "GROUP * any hardware 2.0"),
    (("OTHER", "DET2", "*"), None, "GROUP * any hardware 3.0"),
    # an explicit label wins over the detected one; absent from the table -> '*'
    (("*", "DET", "ci-box"), "ci-box", "GROUP ci-box exact 3.0"),
    (("*", "DET"), "ci-box", "GROUP * any hardware 1.0"),
])
def test_plugin_hardware_choice_with_mixed_tables(pytester, tmp_path, hardware, opt, want):
    from tolstat.dataset.runs import hardware_fingerprint

    det = hardware_fingerprint().label
    hw = tuple(det if h == "DET" else h for h in hardware)
    want = want.replace("DET", det)
    path = _mixed_table(tmp_path / "mixed.json", hw)
    pytester.makepyfile(HW_SUITE)
    args = [*_LOAD, f"--tolstat-table={path}", "-s"] + ([f"--tolstat-hardware={opt}"] if opt else [])
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines([f"*{want}*"])


@pytest.mark.parametrize("value", ["0.7", "0", "-0.01"])
def test_suite_budget_outside_the_budget_range_is_refused(pytester, table_path, value):
    """A suite budget is a budget: the one accepted range of tolstat._base.validate.budget."""
    pytester.makepyfile(SUITE)
    pytester.makefile(".toml", pyproject=f'[tool.tolstat]\ntable = "{table_path.as_posix()}"\nsuite_budget = {value}\n')
    res = pytester.runpytest(*_LOAD)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "suite_budget must be a probability in [1e-09, 0.5]" in "\n".join(res.stderr.lines + res.stdout.lines)


MATMUL_SUITE = """
import numpy as np

def _pair(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16, 64)).astype(np.float16)
    b = rng.standard_normal((64, 16)).astype(np.float16)
    out = ((a.astype(np.float32) @ b.astype(np.float32)) * np.float32(scale)).astype(np.float16)
    return out, a.astype(np.float64) @ b.astype(np.float64), (a, b)

def test_matmul_good(tolstat_check):
    out, ref, inputs = _pair(1)
    r = tolstat_check(out, ref, op="matmul", dtype="float16", inputs=inputs)
    assert r.methods == {"zero_run": "model_zero_run"}

def test_matmul_bad(tolstat_check):
    out, ref, inputs = _pair(2, 1.05)
    tolstat_check(out, ref, op="matmul", dtype="float16", inputs=inputs)
"""


@pytest.mark.parametrize("how", ["option", "pyproject"])
def test_uncalibrated_model_checks_groups_without_runs(pytester, table_path, how):
    # the table has only mul3: matmul checks are decided by the zero-run model, with or without a table
    pytester.makepyfile(MATMUL_SUITE)
    if how == "option":
        res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}", "--tolstat-uncalibrated=model")
    else:
        pytester.makefile(".toml", pyproject='[tool.tolstat]\nuncalibrated = "model"\n')
        res = pytester.runpytest(*_LOAD)  # no table at all
    res.assert_outcomes(passed=1, failed=1)
    assert "model-based threshold from zero runs" in res.stdout.str()


def test_uncalibrated_default_raises_and_bad_values_are_usage_errors(pytester, table_path):
    pytester.makepyfile(MATMUL_SUITE)
    res = pytester.runpytest(*_LOAD, f"--tolstat-table={table_path}")
    res.assert_outcomes(failed=2)
    assert "no tolerance for op='matmul'" in res.stdout.str()
    pytester.makefile(".toml", pyproject='[tool.tolstat]\nuncalibrated = "maybe"\nsuite_budget = 0.01\n')
    res = pytester.runpytest(*_LOAD)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "uncalibrated must be 'raise' or 'model', got 'maybe'" in res.stderr.str()
    pytester.makefile(".toml", pyproject='[tool.tolstat]\nuncalibrated = "model"\nsuite_budget = 0.01\n')
    res = pytester.runpytest(*_LOAD)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "cannot split suite_budget" in res.stderr.str()
