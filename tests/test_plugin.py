"""pytest plugin: table option / pyproject config, fixtures, recording (pytester)."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

import tolstat
from tolstat.selection import select

pytest_plugins = ["pytester"]

# installed (pip install -e .) the plugin loads through its pytest11 entry point;
# from a bare source tree it has to be named
_INSTALLED = any(ep.value == "tolstat.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
_LOAD = () if _INSTALLED else ("-p", "tolstat.pytest_plugin")

# import h5py before pytester's in-process runs: it cannot be imported twice in one process
pytest.importorskip("h5netcdf")


def _kernel(x):
    return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)


def _ref(x):
    return x.astype(np.float16).astype(np.float64) * 3.0


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    ds = tolstat.collect(_kernel, _ref, lambda r: tolstat.Inputs(args=(r.standard_normal(64),)), op="mul3",
                         dtype="float16", runs=400, hardware="cpu", progress=False)
    p = tmp_path_factory.mktemp("tab") / "table.json"
    select(ds, fp_budget=0.01, form="allclose", by=("op", "dtype")).to_json(p)
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
    tolstat.validate(ds)
    assert ds.sizes["run"] == 3  # only the passing checks
    assert set(ds["hardware"].values) == {"ci-box"} and set(ds["op"].values) == {"mul3"}
    assert all("test_good" in t for t in ds["test"].values)


def test_record_only_mode(pytester, tmp_path):
    pytester.makepyfile(SUITE)
    out = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, f"--tolstat-record={out}", "-k", "not table")
    res.assert_outcomes(passed=2)
    assert tolstat.open_errors(out).sizes["run"] == 4


HW_SUITE = """
import numpy as np

def test_which_group(tolstat_check):
    x = np.float16([1.0, 2.0])
    r = tolstat_check(x, x.astype(np.float64), op="mul3", dtype="float16")
    print("GROUP", r.hardware, r.fallback, r.thresholds["max_abs"])
"""


def _mixed_table(path, hardware):
    from tolstat.selection import ToleranceTable

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
    # another specific hardware and '*': '*' (no "several hardware" error)
    (("OTHER", "*"), None, "GROUP * any hardware 2.0"),
    (("OTHER", "DET2", "*"), None, "GROUP * any hardware 3.0"),
    # an explicit label wins over the detected one; absent from the table -> '*'
    (("*", "DET", "ci-box"), "ci-box", "GROUP ci-box exact 3.0"),
    (("*", "DET"), "ci-box", "GROUP * any hardware 1.0"),
    # only one specific hardware, not the detected one: the table's only hardware
    (("OTHER",), None, "GROUP OTHER only hardware 1.0"),
])
def test_plugin_hardware_choice_with_mixed_tables(pytester, tmp_path, hardware, opt, want):
    from tolstat.collect import hardware_fingerprint

    det = hardware_fingerprint()[0]
    hw = tuple(det if h == "DET" else h for h in hardware)
    want = want.replace("DET", det)
    path = _mixed_table(tmp_path / "mixed.json", hw)
    pytester.makepyfile(HW_SUITE)
    args = [*_LOAD, f"--tolstat-table={path}", "-s"] + ([f"--tolstat-hardware={opt}"] if opt else [])
    res = pytester.runpytest(*args)
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines([f"*{want}*"])
