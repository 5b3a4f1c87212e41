"""pytest plugin: calibrated kernel checks in test suites, and recording for recalibration.

Register it with the entry point (pyproject.toml)::

    [project.entry-points.pytest11]
    tolstat = "tolstat.pytest_plugin"

or per run with ``pytest -p tolstat.pytest_plugin``.

Options
-------
``--tolstat-table PATH``
    Tolerance table (``.json`` or ``.nc``) used by the ``tolstat_check`` fixture.
    Default: ``[tool.tolstat] table = "..."`` in the rootdir's ``pyproject.toml``
    (relative to the rootdir).
``--tolstat-record PATH``
    Record the errors that *passing* checks saw into an error dataset (``.nc`` or
    ``.zarr``), written at the end of the session, so that tables can be recalibrated
    from the suite's own CI runs. Without a table, checks only record (calibration
    mode) and always pass.
``--tolstat-hardware LABEL``
    Hardware label for lookups and records (default: :func:`tolstat.hardware_fingerprint`).

Fixtures
--------
``tolstat_table``
    The session's :class:`~tolstat.selection.ToleranceTable`.
``tolstat_check``
    ``tolstat_check(actual, expected, *, op, dtype, covariates=None, hardware=None)``:
    :func:`tolstat.assert_close` with the session table; returns the
    :class:`~tolstat.checks.CheckResult`.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Mapping

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "TolstatSession"]

_KEY = pytest.StashKey["TolstatSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--tolstat-*`` options."""
    group = parser.getgroup("tolstat", "calibrated kernel tolerances (tolstat)")
    group.addoption("--tolstat-table", action="store", default=None, metavar="PATH",
                    help="tolerance table (.json or .nc) for the tolstat_check fixture "
                         "(default: [tool.tolstat] table in pyproject.toml)")
    group.addoption("--tolstat-record", action="store", default=None, metavar="PATH",
                    help="record the errors of passing tolstat checks into an error dataset (.nc/.zarr)")
    group.addoption("--tolstat-hardware", action="store", default=None, metavar="LABEL",
                    help="hardware label for table lookups and records (default: detected)")


def _pyproject_table(rootpath: Path) -> str | None:
    pp = rootpath / "pyproject.toml"
    if not pp.is_file():
        return None
    with open(pp, "rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise pytest.UsageError(f"tolstat: cannot parse {pp}: {exc}") from exc
    cfg = data.get("tool", {}).get("tolstat", {})
    t = cfg.get("table")
    if t is None:
        return None
    p = Path(str(t))
    return str(p if p.is_absolute() else rootpath / p)


class TolstatSession:
    """Per-session state: the table (loaded lazily), hardware label and recorded runs."""

    def __init__(self, config: pytest.Config):
        self.config = config
        opt = config.getoption("--tolstat-table")
        self.table_path = opt if opt is not None else _pyproject_table(Path(config.rootpath))
        self.record_path = config.getoption("--tolstat-record")
        self.hardware_opt = config.getoption("--tolstat-hardware")
        self._table: Any = None
        self._hw: tuple[str, str] | None = None
        self.records: list[Any] = []

    @property
    def hardware(self) -> tuple[str, str]:
        """(hardware label, platform fingerprint)."""
        if self._hw is None:
            from .collect import hardware_fingerprint

            hw, plat = hardware_fingerprint()
            self._hw = (self.hardware_opt or hw, plat)
        return self._hw

    def table(self) -> Any:
        """The tolerance table, or None in record-only mode; raises a usage error if neither."""
        if self._table is None and self.table_path is not None:
            from .selection import load_table

            try:
                self._table = load_table(self.table_path)
            except (FileNotFoundError, ValueError) as exc:
                raise pytest.UsageError(f"tolstat: cannot load the tolerance table: {exc}") from exc
        return self._table

    def record(self, actual: Any, expected: Any, *, op: str, dtype: str, nodeid: str,
               covariates: Mapping[str, Any] | None) -> None:
        """Keep the error summary of a passing check."""
        import numpy as np  # here, not at module level: pytest start-up stays light

        from .dataset import summarize_run
        from .metrics import error_metrics

        m = error_metrics(actual, expected, dtype=dtype)
        hw, plat = self.hardware
        i = len(self.records)
        self.records.append(summarize_run(
            m, op=op, hardware=hw, platform=plat, seed=-1, run_index=i, labels={"test": nodeid},
            covariates={str(k): float(v) for k, v in (covariates or {}).items()},
            rng=np.random.default_rng([0, i]),
        ))

    def write(self) -> Path | None:
        """Write the recorded runs (at session end)."""
        if not self.record_path or not self.records:
            return None
        from .dataset import build_dataset
        from .io import save

        names = sorted({k for r in self.records for k in r.covariates})
        for r in self.records:  # every run needs the same covariates: NaN where a test gave none
            for k in names:
                r.covariates.setdefault(k, math.nan)
        ds = build_dataset(self.records, provenance={"created_by": "tolstat.pytest_plugin",
                                                     "runs": len(self.records)})
        return save(ds, self.record_path)


def pytest_configure(config: pytest.Config) -> None:
    """Create the session state."""
    config.stash[_KEY] = TolstatSession(config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the recorded error dataset."""
    st = session.config.stash.get(_KEY, None)
    if st is not None:
        path = st.write()
        if path is not None:
            tr = session.config.pluginmanager.get_plugin("terminalreporter")
            if tr is not None:
                tr.write_line(f"tolstat: recorded {len(st.records)} passing check(s) to {path}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which table is used."""
    st = config.stash.get(_KEY, None)
    if st is None:
        return []
    out = [f"tolstat: table {st.table_path or '(none)'}"]
    if st.record_path:
        out.append(f"tolstat: recording passing checks to {st.record_path}")
    return out


@pytest.fixture(scope="session")
def tolstat_table(pytestconfig: pytest.Config) -> Any:
    """The session's tolerance table (``--tolstat-table`` or ``[tool.tolstat] table``)."""
    st = pytestconfig.stash[_KEY]
    t = st.table()
    if t is None:
        pytest.fail("tolstat: no tolerance table configured: pass --tolstat-table PATH or set "
                    "[tool.tolstat] table = \"...\" in pyproject.toml", pytrace=False)
    return t


@pytest.fixture
def tolstat_check(request: pytest.FixtureRequest) -> Any:
    """A function ``(actual, expected, *, op, dtype, covariates=None, hardware=None)`` that
    asserts closeness with the session table and records passing checks."""
    st = request.config.stash[_KEY]
    table = st.table()
    if table is None and not st.record_path:
        pytest.fail("tolstat: no tolerance table configured: pass --tolstat-table PATH, set "
                    "[tool.tolstat] table in pyproject.toml, or --tolstat-record PATH to only record",
                    pytrace=False)

    def _check(actual: Any, expected: Any, *, op: str, dtype: Any, covariates: Mapping[str, Any] | None = None,
               hardware: str | None = None) -> Any:
        from ._dtypes import canonical_dtype
        from .checks import assert_close
        from .metrics import as_array

        dt = canonical_dtype(dtype)
        a, e = as_array(actual, name="actual"), as_array(expected, name="expected")
        res = None
        if table is not None:
            __tracebackhide__ = True
            hw = hardware if hardware is not None else st.hardware_opt
            if hw is None:  # detected label if the table has it, else the table's fallbacks
                det = st.hardware[0]
                hw = det if any(g[2] == det for g in table.groups) else None
            res = assert_close(a, e, op=op, dtype=dt, table=table, hardware=hw, covariates=covariates)
        if st.record_path:
            st.record(a, e, op=op, dtype=dt, nodeid=request.node.nodeid, covariates=covariates)
        return res

    return _check
