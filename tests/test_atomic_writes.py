"""No file is ever lost: kill -9 during every writer, concurrent writers and readers.

A helper process imports tolstat once and forks one writer child per try, so that a try
costs a few writes, not an interpreter start. Each writer overwrites an existing file in
a loop (alternating two versions); the test SIGKILLs it at a random moment and then
checks that the file is one of the two versions, complete, and that the next save leaves
no temporary of the dead writer behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import tolstat
from tolstat.calibration.table import load_table

pytest.importorskip("h5netcdf")

HELPER = textwrap.dedent(
    '''
    import os, signal, sys
    import numpy as np
    import tolstat
    from tolstat.dataset import Store
    from tolstat.dataset.records import summarize_run

    def kernel(x):
        return (x.astype(np.float16) * np.float16(3.0)).astype(np.float16)

    def reference(x):
        return x.astype(np.float16).astype(np.float64) * 3.0

    def make(rng):
        return (rng.standard_normal(int(rng.integers(32, 512))),)

    STORE_KW = dict(op="mul3", dtype="float16", runs=30, hardware="cpu", seed=0,
                    options=tolstat.CollectOptions(sample_size=64, progress=False))
    #: the two versions each writer alternates: datasets of 50 / 60 runs, tables with
    #: fp_budget 0.05 / 0.1
    RUNS = (50, 60)
    BUDGETS = (0.05, 0.1)

    def payloads():
        ds = tolstat.collect(kernel, reference, make, op="mul3", dtype="float16", runs=60, hardware="cpu",
                             seed=0, options=tolstat.CollectOptions(sample_size=512, progress=False))
        dss = [ds.isel(run=slice(0, n)) for n in RUNS]
        tabs = [tolstat.select(ds, fp_budget=b, confidence=0.9) for b in BUDGETS]
        recs = []
        for n in RUNS:
            rng = np.random.default_rng(0)
            rs = []
            for i in range(n):
                x = make(rng)[0]
                m = tolstat.error_metrics(kernel(x), reference(x), dtype="float16")
                rs.append(summarize_run(m, op="mul3", hardware="cpu", seed=-1, run_index=i,
                                        labels={"test": f"t{i}"}, rng=np.random.default_rng(i)))
            recs.append(rs)
        return dss, tabs, recs

    def writers():
        from tolstat.checks.pytest_plugin import TolstatSession

        dss, tabs, recs = payloads()

        def record(path, v):  # the plugin's --tolstat-record writer
            st = TolstatSession.__new__(TolstatSession)
            st.record_path, st.records = path, list(recs[v])
            st.parts_dir, st.worker = None, None
            st.write()

        return {
            "nc": lambda p, v: tolstat.save(dss[v], p),
            "zarr": lambda p, v: tolstat.save(dss[v], p),
            "json": lambda p, v: tabs[v].to_json(p),
            "tnc": lambda p, v: tabs[v].to_netcdf(p),
            "record": record,
            "record_zarr": record,
        }

    def serve():
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
        w = writers()
        print("ready", flush=True)
        for line in sys.stdin:
            cmd, kind, path = line.split()
            if cmd == "init":
                w[kind](path, 0)
                print("ok", flush=True)
                continue
            pid = os.fork()
            if pid == 0:
                try:
                    if kind == "store":
                        tolstat.collect(kernel, reference, make, store=Store(path, chunk_runs=2), **STORE_KW)
                    else:
                        i = 1
                        while True:
                            w[kind](path, i % 2)
                            i += 1
                finally:
                    os._exit(0)
            print(pid, flush=True)

    if __name__ == "__main__":
        serve()
    '''
)


class Helper:
    def __init__(self, d: Path):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(tolstat.__file__).parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, str(d / "killhelper.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=d)
        assert self.proc.stdout.readline().strip() == "ready"

    def ask(self, cmd: str, kind: str, path: Path) -> str:
        self.proc.stdin.write(f"{cmd} {kind} {path}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    d = tmp_path_factory.mktemp("killhelper")
    (d / "killhelper.py").write_text(HELPER)
    sys.path.insert(0, str(d))
    import killhelper  # noqa: PLC0415 - the same functions (code hash) as the writer children

    h = Helper(d)
    h.module = killhelper
    yield h
    h.close()
    sys.path.remove(str(d))
    sys.modules.pop("killhelper", None)


def _kill(pid: int) -> None:
    """SIGKILL a writer (one that already finished its work and exited is fine too)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(500):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)
    raise AssertionError(f"writer {pid} did not die")


def _temporaries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if ".tmp-" in p.name or ".lnk-" in p.name or ".old-" in p.name)


def _version(kind: str, path: Path, helper) -> int:
    """Which of the two versions ``path`` holds (it must load completely)."""
    m = helper.module
    if kind in ("json", "tnc"):
        return m.BUDGETS.index(load_table(path).fp_budget)
    return m.RUNS.index(tolstat.open_errors(path).sizes["run"])


FILES = {"nc": "e.nc", "zarr": "e.zarr", "json": "t.json", "tnc": "t.nc", "record": "rec.nc",
         "record_zarr": "rec.zarr"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(FILES))
def test_kill9_never_loses_the_file(helper, tmp_path, kind):
    path = tmp_path / FILES[kind]
    assert helper.ask("init", kind, path) == "ok"
    rnd = random.Random(kind)
    mid_write = 0
    seen = set()
    tries = 0
    # at least 5 kills, and more (up to 25) until one lands inside a write (a temporary
    # is left): a fast writer spends much of its loop outside the window
    while tries < 5 or (mid_write == 0 and tries < 25):
        tries += 1
        pid = int(helper.ask("start", kind, path))
        time.sleep(rnd.uniform(0.05, 0.6))
        _kill(pid)
        seen.add(_version(kind, path, helper))  # old or new, complete, never neither
        mid_write += bool(_temporaries(tmp_path))
        # the next save removes what the dead writer left behind
        assert helper.ask("init", kind, path) == "ok"
        assert _temporaries(tmp_path) == []
        if path.is_symlink():
            versions = [p.name for p in tmp_path.iterdir() if ".v-" in p.name]
            assert versions == [os.readlink(path)]
    assert mid_write >= 1, "no kill landed inside a write: the test did not exercise the window"


@pytest.mark.slow
def test_kill9_store_resumes_complete(helper, tmp_path):
    m = helper.module
    expected = tolstat.collect(m.kernel, m.reference, m.make, **m.STORE_KW)
    rnd = random.Random(7)
    for t in range(3):
        store = tmp_path / f"s{t}.zarr"
        pid = int(helper.ask("start", "store", store))
        time.sleep(rnd.uniform(0.3, 2.0))
        _kill(pid)
        done = len(tolstat.dataset.stream.store_progress(store).done) if store.exists() else 0
        ds = tolstat.collect(m.kernel, m.reference, m.make, store=tolstat.dataset.Store(store, chunk_runs=2),
                             **m.STORE_KW)
        a, b = expected.copy(), ds.copy()
        a.attrs.pop("provenance")
        b.attrs.pop("provenance")
        xr.testing.assert_identical(a, b)
        assert _temporaries(tmp_path) == [], (done, _temporaries(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nc", "zarr", "json", "tnc"])
def test_concurrent_writers_reader_never_sees_a_torn_file(helper, tmp_path, kind):
    path = tmp_path / FILES[kind]
    assert helper.ask("init", kind, path) == "ok"
    pids = [int(helper.ask("start", kind, path)) for _ in range(2)]
    seen, loads = set(), 0
    try:
        t0 = time.monotonic()
        # at least 1.5 s and 3 complete loads (the machine may be busy), at most 15 s
        while (time.monotonic() < t0 + 1.5 or loads < 3) and time.monotonic() < t0 + 15:
            seen.add(_version(kind, path, helper))
            loads += 1
    finally:
        for pid in pids:
            _kill(pid)
    assert loads >= 3
    assert seen <= {0, 1}
    assert helper.ask("init", kind, path) == "ok"
    assert _temporaries(tmp_path) == []


def test_unique_temporary_names_and_cleanup_of_dead_writers(tmp_path):
    from tolstat._base.util import _tmp_path, atomic_write_text, clean_stale

    dest = tmp_path / "t.json"
    names = {_tmp_path(dest).name for _ in range(100)}
    assert len(names) == 100 and all(n.startswith(".t.json.tmp-") and n.endswith(".json") for n in names)
    # a temporary of a dead writer (pid that does not exist) is removed, a live one kept
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    live = _tmp_path(dest)
    dead = live.with_name(live.name.replace(f"-{os.getpid()}-", f"-{proc.pid}-"))
    live.write_text("x")
    dead.write_text("x")
    assert clean_stale(dest) == [dead]
    atomic_write_text(dest, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dest.name, live.name])


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    from tolstat._base.util import atomic_write

    dest = tmp_path / "d.zarr"

    def good(tmp):
        tmp.mkdir()
        (tmp / "x").write_text("old")

    def bad(tmp):
        tmp.mkdir()
        (tmp / "x").write_text("half")
        raise OSError("disk full")

    atomic_write(dest, good)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(dest, bad)
    assert (dest / "x").read_text() == "old"
    assert _temporaries(tmp_path) == []


def test_plain_directory_is_replaced_by_the_versioned_link(tmp_path, helper):
    m = helper.module
    ds = tolstat.collect(m.kernel, m.reference, m.make, op="mul3", dtype="float16", runs=3, hardware="cpu",
                         options=tolstat.CollectOptions(progress=False))
    old = tmp_path / "e.zarr"
    ds.to_zarr(old, zarr_format=2, consolidated=True)  # a plain directory store
    tolstat.save(ds.isel(run=slice(0, 2)), old)
    assert old.is_symlink() and tolstat.open_errors(old).sizes["run"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()] == [os.readlink(old)]
    np.testing.assert_array_equal(tolstat.open_errors(old)["max_abs"].values, ds["max_abs"].values[:2])
