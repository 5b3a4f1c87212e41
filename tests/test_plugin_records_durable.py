"""pytest plugin: recorded checks are never lost (crashed xdist workers, Ctrl-C while merging).

Every test runs a small suite through pytester in record-only mode (``--tolstat-record``
without a table). Under xdist the controller runs in this process and the workers are
subprocesses, so a ``monkeypatch`` here reaches the controller only.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import subprocess
import sys

import pytest

import tolstat
import tolstat.dataset.io as tolstat_io
from tolstat.checks import pytest_plugin

pytest_plugins = ["pytester"]

_INSTALLED = any(ep.value == "tolstat.checks.pytest_plugin"
                 for ep in importlib.metadata.entry_points(group="pytest11"))
# plugins the suite does not need stay out of the (sub)processes: faster start-up
_LOAD = (() if _INSTALLED else ("-p", "tolstat.checks.pytest_plugin")) + ("-p", "no:cacheprovider")

# import h5py and what recording uses (ml_dtypes) before pytester's in-process runs: an
# extension module cannot be imported twice in one process
pytest.importorskip("h5netcdf")
import tolstat.dataset.runs  # noqa: E402,F401
import tolstat.measure.noise  # noqa: E402,F401


@pytest.fixture(scope="module", autouse=True)
def _loaded_before_pytester(tmp_path_factory):
    """Save and open a dataset once here, before any in-process run.

    A module first imported inside an in-process run is dropped afterwards; some that
    writing a dataset imports (the ``importlib_metadata`` backport, which replaces the
    standard library's distribution finder) would leave later runs without entry-point
    plugins, this one included.
    """
    ds = tolstat.collect(lambda x: x, lambda x: x, lambda r: tolstat.Inputs(args=(r.standard_normal(8),)), op="id",
                         dtype="float32", runs=2, hardware="cpu", options=tolstat.CollectOptions(progress=False))
    p = tmp_path_factory.mktemp("warm") / "w.nc"
    tolstat.save(ds, p)
    tolstat.open_errors(p)

# the hardware label is fixed (detecting it imports torch: seconds per worker)
CONFTEST = """
import pytest
import tolstat.dataset.runs as runs

@pytest.fixture(autouse=True)
def _fixed_hardware(monkeypatch):
    monkeypatch.setattr(runs, "hardware_fingerprint", lambda: runs.Hardware(label="cpu", platform="test"))
"""

SUITE = """
import os
import numpy as np
import pytest

def _check(tolstat_check, seed):
    x = np.random.default_rng(seed).standard_normal(64)
    out = (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)
    tolstat_check(out, x.astype(np.float16).astype(np.float64) * 3.0, op="mul3", dtype="float16")

@pytest.mark.parametrize("i", range(6))
def test_many(tolstat_check, i):
    _check(tolstat_check, i)
    if i == 3:
        _check(tolstat_check, 100)  # two passing checks, then the worker dies
        if os.environ.get("TOLSTAT_TEST_CRASH") and os.environ.get("PYTEST_XDIST_WORKER"):
            os._exit(1)
"""

#: records the suite makes: one per test, two in test_many[3]
N_RECORDS = 7
TESTS = [f"test_suite.py::test_many[{i}]" for i in range(6)]


def _suite(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)


def _parts_folders(rec) -> list:
    return sorted(p for p in rec.parent.glob(f".{rec.name}.parts-*") if p.is_dir())


def _interrupt_record_save(mp: pytest.MonkeyPatch, rec) -> None:
    """Ctrl-C while the record file (not anything else) is being written."""
    real = tolstat_io.save

    def save(ds, path, **kw):
        if str(path) == str(rec):
            raise KeyboardInterrupt
        return real(ds, path, **kw)

    mp.setattr(tolstat_io, "save", save)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    try:
        return pytester.runpytest(*_LOAD, *args)
    except KeyboardInterrupt:  # it would otherwise stop this test session too
        pytest.fail("the Ctrl-C while merging the records escaped the session: no record, no message")


def _assert_all_records(rec) -> None:
    ds = tolstat.open_errors(rec)
    assert ds.sizes["run"] == N_RECORDS
    assert sorted(set(ds["test"].values)) == TESTS


# ----------------------------------------------------------------------- xdist
@pytest.mark.slow
def test_a_crashed_worker_keeps_every_check_it_recorded(pytester, tmp_path, monkeypatch):
    pytest.importorskip("xdist")
    _suite(pytester)
    monkeypatch.setenv("TOLSTAT_TEST_CRASH", "1")
    rec = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, "-n", "2", f"--tolstat-record={rec}")
    res.assert_outcomes(passed=5, failed=1)  # test_many[3]: "worker 'gw.' crashed"
    out = "\n".join(res.outlines)
    assert "crashed" in out
    # both checks of the crashing test passed before the crash: they are records too
    _assert_all_records(rec)
    res.stdout.fnmatch_lines([f"tolstat: recorded {N_RECORDS} passing check(s) to {rec} (merged from * part(s))",
                              "tolstat: merged the records of 1 worker(s) that did not finish*: gw*"])
    assert not _parts_folders(rec)


@pytest.mark.slow
def test_ctrl_c_in_the_controllers_merge_leaves_the_parts_and_the_command(pytester, tmp_path):
    pytest.importorskip("xdist")
    _suite(pytester)
    rec = tmp_path / "rec.nc"
    with pytest.MonkeyPatch.context() as mp:  # (pytester's own monkeypatch keeps its chdir)
        _interrupt_record_save(mp, rec)  # the controller only: the workers are subprocesses
        res = _run(pytester, "-n", "2", f"--tolstat-record={rec}")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    assert not rec.exists()
    out = "\n".join(res.outlines)
    m = re.search(r"interrupted while merging the records: .* every record is kept in (\S+); "
                  r"merge them with `([^`]+)`", out)
    assert m, out
    (folder,) = _parts_folders(rec)
    assert m.group(1) == str(folder)
    cmd = shlex.split(m.group(2))
    assert cmd[:2] == ["tolstat", "merge-parts"]
    cli = "import sys; from tolstat.cli.main import main; sys.exit(main(sys.argv[1:]))"  # the `tolstat` script
    done = subprocess.run([sys.executable, "-c", cli, *cmd[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"recorded {N_RECORDS} passing check(s)" in done.stdout
    _assert_all_records(rec)
    assert not folder.exists()


# ----------------------------------------------------------------------- one process
def test_ctrl_c_while_writing_the_record_keeps_the_records(pytester, tmp_path):
    _suite(pytester)
    rec = tmp_path / "rec.nc"
    with pytest.MonkeyPatch.context() as mp:
        _interrupt_record_save(mp, rec)
        res = _run(pytester, f"--tolstat-record={rec}")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    assert not rec.exists()
    (folder,) = _parts_folders(rec)
    res.stdout.fnmatch_lines([f"tolstat: interrupted while merging the records: {rec} was not written; every "
                              f"record is kept in {folder}; merge them with `tolstat merge-parts "
                              f"{folder} {rec}`"])
    merged = pytest_plugin.merge_parts(folder, rec)
    assert merged.n_records == N_RECORDS and merged.unreadable == [] and merged.unfinished == []
    _assert_all_records(rec)
    assert not folder.exists()


def test_a_new_session_names_the_parts_an_earlier_one_left(pytester, tmp_path):
    _suite(pytester)
    rec = tmp_path / "rec.nc"
    left = tmp_path / ".rec.nc.parts-0123abcd"
    left.mkdir()
    res = pytester.runpytest(*_LOAD, f"--tolstat-record={rec}", "--co")
    res.stdout.fnmatch_lines([f"tolstat: {left} holds records of an earlier session that were not merged (or of "
                              f"one still running); merge them with `tolstat merge-parts "
                              f"{left} {rec}`"])


def test_ctrl_c_after_the_record_is_complete_says_so(pytester, tmp_path):
    import pathlib

    _suite(pytester)
    rec = tmp_path / "rec.nc"
    real = pathlib.Path.unlink

    def unlink(self, *a, **kw):  # Ctrl-C while the merged parts are removed
        if ".parts-" in self.parent.name and self.suffix == ".part":
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pathlib.Path, "unlink", unlink)
        res = _run(pytester, f"--tolstat-record={rec}")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    _assert_all_records(rec)
    res.stdout.fnmatch_lines([f"tolstat: recorded {N_RECORDS} passing check(s) to {rec}*",
                              "tolstat: interrupted while removing the merged parts: the record file is complete; "
                              "the parts folder * is left over and can be deleted"])


CORRUPT = """
import json
from pathlib import Path
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    # what writers that stopped leave: a part cut off mid-line, a foreign file, a temporary
    rec = Path(session.config.getoption("--tolstat-record")).resolve()
    (folder,) = rec.parent.glob(f".{rec.name}.parts-*")
    (own,) = folder.glob("*.part")  # its 7 records so far (a header line, then one frame each)
    head, frames = own.read_bytes().split(b"\\n", 1)
    hd = json.loads(head)
    hd["worker"] = "gw7"
    # a worker killed while writing its 7th record
    (folder / "gw7-1-abcdef.part").write_bytes(json.dumps(hd).encode() + b"\\n" + frames[:-10])
    (folder / "gw8-1-abcdef.part").write_bytes(b"\\x89HDF garbage")
    (folder / ".gw9.nc.tmp-000000-1-00000000.nc").write_bytes(b"")
"""


def test_parts_that_cannot_be_read_are_named_and_the_rest_merged(pytester, tmp_path):
    _suite(pytester)
    pytester.makeconftest(CONFTEST + CORRUPT)
    rec = tmp_path / "rec.nc"
    res = pytester.runpytest(*_LOAD, f"--tolstat-record={rec}")
    res.assert_outcomes(passed=6)
    ds = tolstat.open_errors(rec)
    assert ds.sizes["run"] == N_RECORDS + 6  # and the 6 complete records of gw7's part
    assert sorted(set(ds["test"].values)) == TESTS
    res.stdout.fnmatch_lines([
        f"tolstat: recorded {N_RECORDS + 6} passing check(s) to {rec} (merged from 2 part(s))",
        "tolstat: merged the records of 1 worker(s) that did not finish *: gw7; *",
        "tolstat: part gw7-1-abcdef.part: frame 7 (byte *) is incomplete (its writer stopped while writing it)",
        "tolstat: could not read 1 part(s), left in *: gw8-1-abcdef.part (not a tolstat record part*)",
        "tolstat: ignored 1 other file(s) in *: .gw9.nc.tmp-*"])
    (folder,) = _parts_folders(rec)
    assert sorted(p.name for p in folder.iterdir()) == [".gw9.nc.tmp-000000-1-00000000.nc", "gw8-1-abcdef.part"]


def test_merge_parts_refuses_what_it_cannot_merge(tmp_path):
    with pytest.raises(FileNotFoundError, match="no parts folder at"):
        pytest_plugin.merge_parts(tmp_path / "missing", tmp_path / "rec.nc")
    with pytest.raises(ValueError, match=r"must end in \.nc or \.zarr"):
        pytest_plugin.merge_parts(tmp_path, tmp_path / "rec.csv")


@pytest.mark.slow
def test_ctrl_c_during_the_tests_keeps_the_checks_recorded_so_far(pytester, tmp_path):
    """Ctrl-C in a test (not in the merge): the session stops, and every check that passed
    before it is in a complete record file."""
    _suite(pytester)
    pytester.makepyfile(test_stop="""
def test_zz_stop(tolstat_check):
    raise KeyboardInterrupt
""")
    rec = tmp_path / "rec.nc"
    # in a subprocess: an in-process run hands the KeyboardInterrupt on to this session
    res = pytester.runpytest_subprocess(*_LOAD, f"--tolstat-record={rec}", "test_suite.py", "test_stop.py")
    assert res.ret == pytest.ExitCode.INTERRUPTED
    res.stdout.fnmatch_lines([f"tolstat: recorded {N_RECORDS} passing check(s) to {rec} (merged from 1 part(s))"])
    _assert_all_records(rec)
    assert not _parts_folders(rec)
