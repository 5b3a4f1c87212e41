"""pytest plugin: calibrated kernel checks in test suites, and recording for recalibration.

Installed with tolstat, it loads through its ``pytest11`` entry point; from a source
tree that is not installed, name it with ``pytest -p tolstat.checks.pytest_plugin`` (also
harmless when installed). Usage guide: ``docs/plugin.md``.

Options (command line, or ``[tool.tolstat]`` in the rootdir's ``pyproject.toml``)
---------------------------------------------------------------------------------
``--tolstat-table PATH`` / ``table = "..."``
    Tolerance table (``.json`` or ``.nc``); a relative ``pyproject.toml`` path is
    relative to the rootdir. Loaded once at startup: a missing, unreadable or invalid
    table (or a directory) is one usage error, not one error per test.
``--tolstat-record PATH``
    Record the errors that *passing* checks saw into an error dataset (``.nc`` or
    ``.zarr``), written at the end of the session, for recalibration
    (:func:`tolstat.dataset.merge_records`). Checked at startup (folder exists, suffix).
    Every record is appended to a part file (in a hidden folder next to the record path)
    as soon as its check passes; at the end the parts are merged into the record file
    (one atomic write) and removed. Under pytest-xdist every worker writes its own part,
    so a worker that crashes keeps what it recorded; the summary names the parts that
    could not be read. Interrupted (Ctrl-C) while merging, the session leaves either the
    complete record file or the parts folder, with the command that merges it
    (:func:`merge_parts`, ``tolstat merge-parts PARTS RECORD``).
    Without a table, checks only record (calibration mode) and always pass.
``--tolstat-hardware LABEL``
    Hardware label for lookups and records (default: :func:`tolstat.dataset.hardware_fingerprint`).
``--tolstat-hardware-policy {exact,pooled,nearest,error}`` / ``hardware_policy = "..."``
    What a check on a machine the table was not calibrated on does
    (:mod:`tolstat.calibration.hwpolicy`; default ``"error"``). ``exact`` and ``error`` are also
    checked against the table at startup.
``--tolstat-uncalibrated {raise,model}`` / ``uncalibrated = "..."``
    What a check of a group the table does not have does (default ``"raise"``, the test
    errors): ``"model"`` decides it by the model-based threshold from zero runs
    (:class:`tolstat.CheckOptions` ``uncalibrated="model"``; needs the op's ``inputs=``),
    at the table's per-check budget, or 0.01 without a table: a suite of new kernels runs
    before any calibration. Not with ``suite_budget`` and no table (the model's budget
    would not be the suite's share).
``suite_budget = 0.01`` (``[tool.tolstat]`` or ``--tolstat-suite-budget``)
    False-positive budget of the whole suite, split over its checks by the union bound
    (Bonferroni): each check gets ``suite_budget / N``; see :func:`suite_table`.
    ``N`` is ``suite_checks = ...`` when given, else the checks the collected tests that
    use tolstat (the ``tolstat_check`` fixture or the ``tolstat`` marker) declare: one per
    test (each parametrised item is a test), ``max_examples`` plus the explicit examples
    for a Hypothesis ``@given`` test, times ``checks=`` of the test's
    ``@pytest.mark.tolstat(checks=...)`` marker (checks per call or example). A session
    whose passing tests make more checks than ``N`` fails at the end, because the promise
    no longer holds (a failing test counts at most its declared checks: Hypothesis's
    shrinking after a failure cannot make a failed suite fail).
``suite_tail = "model"`` (``[tool.tolstat]`` or ``--tolstat-suite-tail``)
    Where the calibration runs are too few for the distribution-free order statistic at
    ``suite_budget / N`` (``1e-4`` per check needs about 30,000 runs), extend the
    threshold by a model-based tail (:func:`tolstat.calibration.tiny_budget.extend_budget`:
    the largest calibration score, extended by the ratio of normal quantiles; labelled model-based with
    its assumption). Default ``"none"``: such groups are refused with the runs needed.

Fixtures and marker
-------------------
``tolstat_table``
    The session's table (after the suite-budget split, if any).
``tolstat_check``
    ``tolstat_check(actual, expected, *, op=None, dtype=None, inputs=None, params=None,
    covariates=None, hardware=None, options=None)``: :func:`tolstat.assert_close` with the
    session table; returns the :class:`~tolstat.checks.result.CheckResult`. Session-scoped
    (safe in Hypothesis ``@given`` tests); ``op``/``dtype``/``covariates`` default to those
    of the test's ``@pytest.mark.tolstat(op=..., dtype=..., covariates=...)`` marker.
    ``inputs``/``params`` (the op's own arguments) give the operator statistics
    (:func:`tolstat.check`), and recorded runs then carry them (the operator-noise
    statistics and the covariate ``K``), so recalibrating from the records can use the
    operator form.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
import uuid
import zlib
from pathlib import Path
from typing import Any, Mapping

import pytest

from tolstat.checks.record_parts import (_PART_FORMAT, _PART_SUFFIX, _PART_VERSION, PartsMerge, _frame, _merge,
                                         _merge_command, _new_parts_folder, _record_frame, _remove_parts,
                                         merge_parts)

__all__ = ["pytest_addoption", "pytest_configure", "TolstatSession", "suite_table", "declared_checks", "merge_parts",
           "PartsMerge"]

_KEY = pytest.StashKey["TolstatSession"]()
_MARKER = ("tolstat(op=None, dtype=None, covariates=None, hardware=None, checks=1): the table group of the test's "
           "tolstat_check calls; checks: how many checks one call (one Hypothesis example) makes, for the suite "
           "budget")
_TAILS = ("none", "model")


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
    group.addoption("--tolstat-hardware-policy", action="store", default=None,
                    choices=["exact", "pooled", "nearest", "error"],
                    help="when this machine is not in the table (default: [tool.tolstat] "
                         "hardware_policy, else 'error')")
    group.addoption("--tolstat-uncalibrated", action="store", default=None, choices=["raise", "model"],
                    help="a group the table does not have (or no table): 'raise' (default) or 'model', the "
                         "model-based threshold from zero runs (default: [tool.tolstat] uncalibrated)")
    group.addoption("--tolstat-suite-budget", action="store", default=None, type=float, metavar="A",
                    help="false-positive budget of the whole suite, split over its checks "
                         "(default: [tool.tolstat] suite_budget)")
    group.addoption("--tolstat-suite-tail", action="store", default=None, choices=list(_TAILS),
                    help="'model': extend thresholds the calibration runs cannot support at the per-check "
                         "budget by a model-based tail; 'none' (default): refuse them "
                         "(default: [tool.tolstat] suite_tail)")


def _pyproject(rootpath: Path) -> dict[str, Any]:
    pp = rootpath / "pyproject.toml"
    if not pp.is_file():
        return {}
    with open(pp, "rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise pytest.UsageError(f"tolstat: cannot parse {pp}: {exc}") from exc
    cfg = data.get("tool", {}).get("tolstat", {})
    known = {"table", "hardware_policy", "suite_budget", "suite_checks", "suite_tail", "uncalibrated"}
    bad = sorted(set(cfg) - known)
    if bad:
        raise pytest.UsageError(f"tolstat: unknown key(s) {bad} in [tool.tolstat] of {pp} (known: {sorted(known)})")
    return dict(cfg)


def _check_record_path(path: str) -> None:
    p = Path(path)
    if p.suffix.lower() not in (".nc", ".zarr"):
        raise pytest.UsageError(f"tolstat: --tolstat-record {path!r} must end in .nc or .zarr")
    if p.suffix.lower() == ".nc" and p.is_dir():
        raise pytest.UsageError(f"tolstat: --tolstat-record {path!r} is a directory")
    parent = p.resolve().parent
    if not parent.is_dir():
        raise pytest.UsageError(f"tolstat: --tolstat-record {path!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise pytest.UsageError(f"tolstat: --tolstat-record {path!r}: folder {str(parent)!r} is not writable")


def suite_table(table: Any, suite_budget: float, n_checks: int, *, tail: str = "none") -> Any:
    """The table with each threshold re-selected for a per-check budget ``suite_budget / n_checks``.

    Union bound (Bonferroni): if every check of a correct run fails with probability at
    most ``a = suite_budget / n_checks``, the probability that *any* of ``n_checks``
    checks fails is at most ``n_checks * a = suite_budget``, whatever the dependence
    between checks. Each group's confidence is kept; within a group the new budget is
    split between statistics in the table's proportions.

    Thresholds are the distribution-free order-statistic bound
    (:func:`tolstat.calibration.calibrate` with ``method="order_statistic"``) at the new budget,
    computed from the table's stored largest calibration scores: the runs below them are
    replaced by the smallest stored score, which can only raise the bound (exact when
    the bound's rank lies among the stored scores). A threshold never drops below the
    table's own. Groups without enough runs for the order statistic at the new budget
    keep a NaN threshold whose reason names the runs needed (looking them up raises),
    unless ``tail="model"``: those get the model-based extension of
    :func:`tolstat.calibration.tiny_budget.extend_budget` (method ``"model_tail"``, the
    largest calibration score times the ratio of normal quantiles; the promise then rests
    on the assumption that the score's quantiles grow no faster than a normal
    distribution's below the smallest budget the runs support).

    Parameters
    ----------
    table : ToleranceTable
        The session's table.
    suite_budget : float
        False-positive budget of the whole suite.
    n_checks : int
        Checks it is split over.
    tail : {"none", "model"}, default "none"
        What a group with too few runs for the order statistic at the split budget gets.

    Returns
    -------
    ToleranceTable

    Raises
    ------
    ValueError
        Bad ``suite_budget``, ``n_checks`` or ``tail``, or a budget larger than the table's.
    """
    from tolstat._base.inference import split_budget
    from tolstat.calibration.tiny_budget import rebudget_with_tail

    a = split_budget(suite_budget, n_checks, method="bonferroni")
    if a > table.fp_budget:
        raise ValueError(f"suite_budget {suite_budget:g} over {n_checks} checks gives {a:.3g} per check, more than "
                         f"the table's fp_budget {table.fp_budget:g}: calibrate the table at {a:.3g} or lower, or "
                         "leave suite_budget unset")
    if tail not in _TAILS:
        raise ValueError(f"tail must be one of {_TAILS}, got {tail!r}")
    out = rebudget_with_tail(table, a, tail=tail,
                             why=f"suite budget {suite_budget:g} over {n_checks} checks (Bonferroni)")
    ds = out.data
    prov = json.loads(ds.attrs.get("provenance", "{}"))
    prov["suite_budget"] = {"suite_budget": suite_budget, "n_checks": n_checks, "per_check": a,
                            "table_fp_budget": table.fp_budget, "tail": tail}
    ds.attrs["provenance"] = json.dumps(prov, sort_keys=True)
    return out


def _hypothesis_examples(fn: Any) -> int | None:
    """Calls a Hypothesis ``@given`` test makes when it passes: ``max_examples`` + explicit examples.

    ``None`` for a function that is not a Hypothesis test. The settings are those the test
    was decorated with (Hypothesis keeps them on the function; a test without
    ``@settings`` has the profile that was active when it was decorated).
    """
    if not getattr(fn, "is_hypothesis_test", False):
        return None
    cfg = getattr(fn, "_hypothesis_internal_use_settings", None)
    if cfg is None:
        from hypothesis import settings as _settings

        cfg = _settings.default
    return int(cfg.max_examples) + len(getattr(fn, "hypothesis_explicit_examples", ()) or ())


def declared_checks(item: pytest.Item) -> int:
    """The number of checks a collected test declares, for the suite budget.

    One call of the test (a parametrised item is one test) or, for a Hypothesis
    ``@given`` test, ``max_examples`` plus its explicit ``@example`` s; times ``checks``
    of the test's ``@pytest.mark.tolstat(checks=...)`` marker (the checks one call or
    example makes, default 1).

    Parameters
    ----------
    item : pytest.Item

    Returns
    -------
    int
        ``>= 1``.

    Raises
    ------
    pytest.UsageError
        A ``checks`` that is not a positive integer (names the test and the value).
    """
    mark = item.get_closest_marker("tolstat")
    per = mark.kwargs.get("checks", 1) if mark is not None else 1
    if isinstance(per, bool) or not isinstance(per, int) or per < 1:
        raise pytest.UsageError(f"tolstat: {item.nodeid}: @pytest.mark.tolstat(checks=...) must be a positive "
                                f"integer (checks per call or Hypothesis example), got {per!r}")
    calls = _hypothesis_examples(getattr(item, "obj", None))
    return per * (1 if calls is None else max(calls, 1))


class TolstatSession:
    """Per-session state: settings, the table, the hardware label and recorded runs.

    Recorded runs go to this process's part file as each check passes (:meth:`record`);
    ``records`` holds runs given directly, written with the parts by :meth:`write`.
    """

    # class-level defaults of the recording state (also for a session made without __init__)
    _part_fd: int | None = None
    _part_path: Path | None = None
    merged: PartsMerge | None = None

    def __init__(self, config: pytest.Config):
        from tolstat.calibration.hwpolicy import DEFAULT_POLICY, check_policy

        self.config = config
        root = Path(config.rootpath)
        cfg = _pyproject(root)
        opt = config.getoption("--tolstat-table")
        t = cfg.get("table")
        self.table_path = opt if opt is not None else (
            None if t is None else str(Path(str(t)) if Path(str(t)).is_absolute() else root / str(t)))
        self.record_path = config.getoption("--tolstat-record")
        self.hardware_opt = config.getoption("--tolstat-hardware")
        pol = config.getoption("--tolstat-hardware-policy") or cfg.get("hardware_policy", DEFAULT_POLICY)
        try:
            self.policy = check_policy(pol, name="[tool.tolstat] hardware_policy")
        except ValueError as exc:
            raise pytest.UsageError(f"tolstat: {exc}") from None
        unc = config.getoption("--tolstat-uncalibrated")
        self.uncalibrated = cfg.get("uncalibrated", "raise") if unc is None else unc
        if self.uncalibrated not in ("raise", "model"):
            raise pytest.UsageError(f"tolstat: [tool.tolstat] uncalibrated must be 'raise' or 'model', got "
                                    f"{self.uncalibrated!r}")
        sb = config.getoption("--tolstat-suite-budget")
        self.suite_budget = cfg.get("suite_budget") if sb is None else sb
        self.suite_checks = cfg.get("suite_checks")
        tail = config.getoption("--tolstat-suite-tail")
        self.suite_tail = cfg.get("suite_tail", "none") if tail is None else tail
        if self.suite_tail not in _TAILS:
            raise pytest.UsageError(f"tolstat: [tool.tolstat] suite_tail must be one of {list(_TAILS)}, got "
                                    f"{self.suite_tail!r}")
        for name, v in (("suite_budget", self.suite_budget), ("suite_checks", self.suite_checks)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise pytest.UsageError(f"tolstat: [tool.tolstat] {name} must be a number, got {v!r}")
        if self.suite_budget is not None:
            from tolstat._base.validate import budget  # only with a suite budget: numpy stays unloaded

            try:
                self.suite_budget = budget("suite_budget", self.suite_budget)
            except ValueError as exc:
                raise pytest.UsageError(f"tolstat: {exc}") from None
        if self.suite_checks is not None and (int(self.suite_checks) != self.suite_checks or self.suite_checks < 1):
            raise pytest.UsageError(f"tolstat: suite_checks must be a positive integer, got {self.suite_checks!r}")
        if self.uncalibrated == "model" and self.suite_budget is not None and self.table_path is None:
            raise pytest.UsageError("tolstat: uncalibrated = 'model' without a table cannot split suite_budget over "
                                    "the checks (the model would use 0.01 per check): give a table, or drop "
                                    "suite_budget")
        if self.record_path:
            _check_record_path(self.record_path)
        self.worker = getattr(config, "workerinput", {}).get("workerid")
        self.parts_dir = getattr(config, "workerinput", {}).get("tolstat_parts")
        self.base_table: Any = None
        self.table: Any = None
        self.n_suite: int | None = None
        self.n_checks = 0
        self.declared: dict[str, int] = {}   # per test: the checks it declares
        self.made: dict[str, int] = {}       # per test: the checks it made
        self.failed_tests: set[str] = set()
        self.n_hypothesis = 0                # Hypothesis tests among those that use tolstat
        self.n_checks_total: int | None = None  # xdist controller: the workers' counted checks
        self.item: Any = None
        self._counts: dict[str, int] = {}
        self._hw: tuple[str, str] | None = None
        self.records: list[Any] = []
        self.n_recorded = 0
        self.summary: list[str] = []
        if self.table_path is not None:
            self.base_table = self.table = self._load()

    def _load(self) -> Any:
        from tolstat.calibration.hwpolicy import hardware_mismatch
        from tolstat.calibration.table import load_table

        p = Path(self.table_path)
        if p.is_dir():
            raise pytest.UsageError(f"tolstat: the tolerance table {self.table_path!r} is a directory, not a "
                                    ".json or .nc table")
        try:
            table = load_table(p)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise pytest.UsageError(f"tolstat: cannot load the tolerance table {self.table_path!r}: {exc}") from None
        why = hardware_mismatch([g[2] for g in table.groups], self.hardware[0], self.policy)
        if why:
            raise pytest.UsageError(f"tolstat: {why} (table {self.table_path!r}); pass --tolstat-hardware-policy "
                                    "or set [tool.tolstat] hardware_policy")
        return table

    @property
    def hardware(self) -> tuple[str, str]:
        """(hardware label, platform fingerprint)."""
        if self._hw is None:
            from tolstat.dataset.runs import hardware_fingerprint

            found = hardware_fingerprint()
            hw, plat = found.label, found.platform
            self._hw = (self.hardware_opt or hw, plat)
        return self._hw

    def apply_suite_budget(self, items: Any) -> None:
        """Count the checks the collected tests declare (:func:`declared_checks`) and split
        ``suite_budget`` over them, or over ``suite_checks`` when given (after collection).

        ``items`` are the collected tests that use tolstat (an int is taken as that many
        tests of one check each).
        """
        if isinstance(items, int):
            n_declared = items
        else:
            for it in items:
                self.declared[it.nodeid] = declared_checks(it)
                self.n_hypothesis += _hypothesis_examples(getattr(it, "obj", None)) is not None
            n_declared = sum(self.declared.values())
        if self.suite_budget is None or self.base_table is None:
            return
        self.n_suite = int(self.suite_checks) if self.suite_checks is not None else max(n_declared, 1)
        try:
            self.table = suite_table(self.base_table, float(self.suite_budget), self.n_suite, tail=self.suite_tail)
        except ValueError as exc:
            raise pytest.UsageError(f"tolstat: {exc}") from None

    def counted_checks(self) -> int:
        """Checks that count against the suite budget: every check of a test that did not fail;
        a failed test at most its declared checks (what it made after failing, e.g. while
        Hypothesis shrank the example, cannot make a failed suite fail)."""
        n = 0
        for nodeid, k in self.made.items():
            n += min(k, self.declared.get(nodeid, k)) if nodeid in self.failed_tests else k
        return n

    def over_declared(self) -> list[tuple[str, int, int]]:
        """``(test, made, declared)`` for passing tests that made more checks than they declared."""
        return sorted((t, k, self.declared[t]) for t, k in self.made.items()
                      if t in self.declared and t not in self.failed_tests and k > self.declared[t])

    def record(self, actual: Any, expected: Any, *, op: str, dtype: str, nodeid: str,
               covariates: Mapping[str, Any] | None, inputs: Any = None,
               params: Mapping[str, Any] | None = None) -> None:
        """Keep the error summary of a passing check (deterministic for a given test and call).

        With ``inputs`` (and ``params``), the op's own arguments, the record carries the
        operator-noise statistics and the covariate ``K`` that :mod:`tolstat.ops` derives
        from them (:func:`tolstat.dataset.runs.derive_op_statistics`), what recalibrating
        an operator-form table needs.
        """
        import numpy as np  # here, not at module level: pytest start-up stays light

        from tolstat.dataset.records import summarize_run
        from tolstat.dataset.runs import derive_op_statistics
        from tolstat.dataset.schema import reference_fingerprint
        from tolstat.measure.metrics import as_array, error_metrics
        from tolstat.measure.noise import record_statistics

        cov = {str(c): float(v) for c, v in (covariates or {}).items()}
        op_stats: dict[str, float] = {}
        rowwise = None
        if inputs is not None:
            mag, cov, rowwise = derive_op_statistics(op, inputs, params, dtype=dtype, covariates=cov,
                                                     reference=expected)
            op_stats = record_statistics(actual, expected, dtype=dtype, magnitude=mag, K=cov["K"],
                                         rowwise=rowwise, op=op)
        m = error_metrics(actual, expected, dtype=dtype)
        hw, plat = self.hardware
        k = self._counts.get(nodeid, 0)
        self._counts[nodeid] = k + 1
        rec = summarize_run(
            m, op=op, hardware=hw, platform=plat, seed=-1, run_index=self.n_recorded, labels={"test": nodeid},
            covariates=cov, rng=np.random.default_rng([zlib.crc32(nodeid.encode()), k]),
        )
        rec.op_stats, rec.op_rowwise = op_stats, rowwise
        rec.op_magnitude = "ops" if op_stats else None
        # the same test with the same inputs on another CI run is the same unit, not a new draw
        rec.ref_fingerprint = reference_fingerprint(as_array(expected, name="expected"))
        self._append(rec)
        self.n_recorded += 1

    def _write_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # one write for a record of usual size; a crash between writes leaves a torn frame
            n = os.write(self._part_fd, view)  # type: ignore[arg-type]
            view = view[n:]

    def _append(self, rec: Any) -> None:
        """Append one record to this process's part file (opened at the first record).

        Each record goes to the OS at once (one unbuffered write of one frame), so a process
        that crashes or is killed later keeps every record it completed.
        """
        if self._part_fd is None:
            if not self.parts_dir:  # single process: its own parts folder
                self.parts_dir = str(_new_parts_folder(self.record_path))
            who = self.worker or "main"
            self._part_path = Path(self.parts_dir) / f"{who}-{os.getpid()}-{uuid.uuid4().hex[:6]}{_PART_SUFFIX}"
            try:
                self._part_fd = os.open(self._part_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except OSError as exc:
                raise OSError(f"tolstat: cannot create the record part {str(self._part_path)!r} for "
                              f"--tolstat-record {self.record_path!r}: {exc}") from exc
            self._write_bytes(json.dumps({"format": _PART_FORMAT, "version": _PART_VERSION, "worker": who,
                                         "pid": os.getpid()}).encode() + b"\n")
        self._write_bytes(_record_frame(rec))

    def close_part(self) -> None:
        """Mark this process's part file finished (an end frame) and close it."""
        if self._part_fd is not None:
            try:
                self._write_bytes(_frame({"end": self.n_recorded}))
            finally:
                os.close(self._part_fd)
                self._part_fd = None

    def write(self) -> PartsMerge | None:
        """Controller / single process: merge ``records`` and every part into the record file.

        The record file is written atomically; ``self.merged`` is set once it is complete,
        and only then are the merged parts removed. Returns ``None`` when there is nothing
        to merge.
        """
        self.close_part()
        parts = Path(self.parts_dir) if self.parts_dir else None
        if not self.records and (parts is None or not parts.is_dir()):
            return None
        self.merged = _merge(parts, self.record_path, self.records)
        _remove_parts(self.merged)
        return self.merged


def pytest_configure(config: pytest.Config) -> None:
    """Read the settings, load and check the table and the record path (usage errors here)."""
    config.addinivalue_line("markers", _MARKER)
    st = TolstatSession(config)
    config.stash[_KEY] = st
    distributed = getattr(config.option, "dist", "no") != "no" or bool(getattr(config.option, "numprocesses", None))
    if st.record_path and st.worker is None and distributed and config.pluginmanager.hasplugin("xdist"):
        st.parts_dir = str(_new_parts_folder(st.record_path))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: tell each worker where to write its part of the records."""
    st = node.config.stash.get(_KEY, None)
    if st is not None and st.parts_dir:
        node.workerinput["tolstat_parts"] = st.parts_dir


def _uses_tolstat(item: pytest.Item) -> bool:
    return "tolstat_check" in getattr(item, "fixturenames", ()) or item.get_closest_marker("tolstat") is not None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Split the suite budget over the collected checks."""
    st = config.stash.get(_KEY, None)
    if st is not None:
        st.apply_suite_budget([i for i in items if _uses_tolstat(i)])
        tr = config.pluginmanager.get_plugin("terminalreporter")
        if st.n_suite is not None and tr is not None and st.worker is None:
            tr.write_line(f"tolstat: suite budget {st.suite_budget:g} split over {st.n_suite} checks (Bonferroni): "
                          f"{st.table.fp_budget:.4g} per check")
            n_decl = sum(st.declared.values())
            if st.suite_checks is None and n_decl != len(st.declared):
                tr.write_line(f"tolstat: the {len(st.declared)} tests that use tolstat declare {n_decl} checks"
                              + (f" ({st.n_hypothesis} Hypothesis tests counted at max_examples plus explicit "
                                 "examples)" if st.n_hypothesis else "") + "; @pytest.mark.tolstat(checks=...) "
                              "declares checks per call")
            if st.suite_tail == "model":
                from tolstat.calibration.tiny_budget import MODEL_TAIL

                meth = st.table.data["method"].values
                k = int((meth == MODEL_TAIL).any(axis=1).sum())
                if k:
                    tr.write_line(f"tolstat: {k} of {len(st.table)} groups have too few calibration runs for "
                                  f"{st.table.fp_budget:.4g} per check: their thresholds are model-based (a "
                                  "normal-quantile tail beyond the smallest budget the runs support; not distribution-free)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Any:
    """Remember the tests that failed (a failed test counts at most its declared checks)."""
    outcome = yield
    rep = outcome.get_result()
    st = item.config.stash.get(_KEY, None)
    if st is not None and rep.failed:
        st.failed_tests.add(item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Remember the running test (for the session-scoped checker's marker and records)."""
    st = item.config.stash.get(_KEY, None)
    if st is not None:
        st.item = item


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write the records (per worker under xdist; merged by the controller) and check the suite budget."""
    st = session.config.stash.get(_KEY, None)
    if st is None:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if st.worker is not None:
        if st.record_path:
            st.close_part()
        if hasattr(session.config, "workeroutput"):  # sent to the controller (pytest_testnodedown)
            session.config.workeroutput["tolstat_checks"] = st.counted_checks()
            session.config.workeroutput["tolstat_n_suite"] = st.n_suite
        return
    if st.record_path:
        _write_records(session, st)
        if tr is None:  # no terminal summary (-p no:terminal): the report goes to stderr
            for line in st.summary:
                print(line, file=sys.stderr)
    n = st.n_checks_total if st.n_checks_total is not None else st.counted_checks()
    if st.n_suite is not None and n > st.n_suite:
        if tr is not None:
            over = st.over_declared()
            which = "" if not over else "; more than declared: " + ", ".join(
                f"{t} made {k} (declared {d})" for t, k, d in over[:3]) + (", ..." if len(over) > 3 else "")
            tr.write_line(f"tolstat: {n} checks ran but the suite budget {st.suite_budget:g} was split "
                          f"over {st.n_suite}: the suite-level promise does not hold; set [tool.tolstat] "
                          f"suite_checks >= {n} or mark the tests @pytest.mark.tolstat(checks=...){which}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _write_records(session: pytest.Session, st: TolstatSession) -> None:
    """Merge the parts into the record file; on Ctrl-C, say what is left and how to merge it."""
    try:
        res = st.write()
    except KeyboardInterrupt:
        session.exitstatus = pytest.ExitCode.INTERRUPTED
        if st.merged is not None:  # the record file is complete; only removing the parts was cut short
            st.summary += st.merged.lines()
            st.summary.append(f"tolstat: interrupted while removing the merged parts: the record file is "
                              f"complete; the parts folder {st.parts_dir} is left over and can be deleted")
        elif st.parts_dir and Path(st.parts_dir).is_dir():
            st.summary.append(f"tolstat: interrupted while merging the records: {st.record_path} was not "
                              f"written; every record is kept in {st.parts_dir}; merge them with "
                              f"`{_merge_command(st.parts_dir, st.record_path)}`")
        else:
            st.summary.append(f"tolstat: interrupted while writing the records: {st.record_path} was not written")
        return
    if res is not None:
        st.summary += res.lines()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Report what was recorded (records merged, parts that could not be read)."""
    st = config.stash.get(_KEY, None)
    if st is not None and st.worker is None:
        for line in st.summary:
            terminalreporter.write_line(line, red=("could not" in line or "interrupted" in line))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist controller: add up the checks of a finished worker."""
    st = node.config.stash.get(_KEY, None)
    out = getattr(node, "workeroutput", {})
    if st is not None and "tolstat_checks" in out:
        st.n_checks += int(out["tolstat_checks"])
        st.n_checks_total = (st.n_checks_total or 0) + int(out["tolstat_checks"])
        if out.get("tolstat_n_suite") is not None:
            st.n_suite = int(out["tolstat_n_suite"])


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name the table, its hardware, and whether this machine matches."""
    st = config.stash.get(_KEY, None)
    if st is None:
        return []
    hw = st.hardware[0]
    if st.base_table is None:
        out = ["tolstat: no table (" + ("record-only mode)" if st.record_path else "checks need --tolstat-table)")]
    else:
        hws = sorted({g[2] for g in st.base_table.groups})
        match = ("this machine is calibrated" if hw in hws else
                 "this machine is not calibrated; pooled '*' entries apply" if "*" in hws else
                 "this machine is NOT calibrated")
        out = [f"tolstat: table {st.table_path} ({len(st.base_table)} groups, hardware {', '.join(hws)})",
               f"tolstat: this machine {hw!r}: {match}; hardware_policy={st.policy}"]
        if st.suite_budget is not None:
            out.append(f"tolstat: suite budget {st.suite_budget:g}, split over the checks after collection")
    if st.record_path:
        out.append(f"tolstat: recording passing checks to {st.record_path}")
        if st.worker is None:
            rec = Path(st.record_path).resolve()
            own = Path(st.parts_dir).resolve() if st.parts_dir else None
            for d in sorted(rec.parent.glob(f".{rec.name}.parts-*")):
                if d.is_dir() and d.resolve() != own:
                    out.append(f"tolstat: {d} holds records of an earlier session that were not merged (or of "
                               f"one still running); merge them with `{_merge_command(d, rec)}`")
    return out


@pytest.fixture(scope="session")
def tolstat_table(pytestconfig: pytest.Config) -> Any:
    """The session's tolerance table (``--tolstat-table`` or ``[tool.tolstat] table``)."""
    st = pytestconfig.stash[_KEY]
    if st.table is None:
        pytest.fail("tolstat: no tolerance table configured: pass --tolstat-table PATH or set "
                    "[tool.tolstat] table = \"...\" in pyproject.toml", pytrace=False)
    return st.table


@pytest.fixture(scope="session")
def tolstat_check(pytestconfig: pytest.Config) -> Any:
    """A function ``(actual, expected, *, op=None, dtype=None, inputs=None, params=None,
    covariates=None, hardware=None, options=None)`` that asserts closeness with the session
    table and records passing checks.

    ``inputs``/``params`` (the positional and keyword arguments of the torch function
    named by ``op``) give the operator statistics tables of the operator form need
    (:func:`tolstat.check`), and passing checks are recorded with them. ``options`` is a
    :class:`tolstat.CheckOptions` (the expert magnitude override, ``allow_nan``); its
    ``hardware_policy`` must be unset (the session's applies).

    Session-scoped, so it works inside Hypothesis ``@given`` tests; ``op``, ``dtype``,
    ``covariates`` and ``hardware`` default to the running test's
    ``@pytest.mark.tolstat(...)`` marker.
    """
    st = pytestconfig.stash[_KEY]
    if st.table is None and not st.record_path and st.uncalibrated != "model":
        pytest.fail("tolstat: no tolerance table configured: pass --tolstat-table PATH, set "
                    "[tool.tolstat] table in pyproject.toml, --tolstat-record PATH to only record, or "
                    "--tolstat-uncalibrated model for model-based thresholds from zero runs",
                    pytrace=False)

    def tolstat_check(actual: Any, expected: Any, *, op: str | None = None, dtype: Any = None,
                      inputs: Any = None, params: Mapping[str, Any] | None = None,
                      covariates: Mapping[str, Any] | None = None, hardware: str | None = None,
                      options: Any = None) -> Any:
        __tracebackhide__ = True
        import dataclasses

        from tolstat._base.dtypes import canonical_dtype
        from tolstat.checks.checking import assert_close
        from tolstat.checks.options import check_options
        from tolstat.measure.metrics import as_array

        opts = check_options(options)
        if opts.hardware_policy is not None:
            raise ValueError(f"tolstat_check: CheckOptions.hardware_policy={opts.hardware_policy!r}: the session's "
                             "policy applies (--tolstat-hardware-policy or [tool.tolstat] hardware_policy)")
        if params is not None and inputs is None:
            raise ValueError("tolstat_check: params= needs inputs= (the op's positional arguments)")

        mark = st.item.get_closest_marker("tolstat") if st.item is not None else None
        kw = dict(mark.kwargs) if mark is not None else {}
        op = op if op is not None else kw.get("op")
        dtype = dtype if dtype is not None else kw.get("dtype")
        covariates = covariates if covariates is not None else kw.get("covariates")
        hardware = hardware if hardware is not None else kw.get("hardware")
        if op is None or dtype is None:
            raise TypeError("tolstat_check needs op and dtype: pass them or mark the test "
                                    "@pytest.mark.tolstat(op=..., dtype=...)")
        dt = canonical_dtype(dtype)
        a, e = as_array(actual, name="actual"), as_array(expected, name="expected")
        res = None
        st.n_checks += 1
        key = st.item.nodeid if st.item is not None else "(outside a test)"
        st.made[key] = st.made.get(key, 0) + 1
        unc = "model" if st.uncalibrated == "model" else opts.uncalibrated
        if st.table is not None or unc == "model":
            hw = hardware if hardware is not None else st.hardware[0]
            res = assert_close(a, e, op=op, dtype=dt, table=st.table, inputs=inputs, params=params, hardware=hw,
                               covariates=covariates,
                               options=dataclasses.replace(opts, hardware_policy=st.policy, uncalibrated=unc))
        if st.record_path:
            nodeid = st.item.nodeid if st.item is not None else "(outside a test)"
            st.record(a, e, op=op, dtype=dt, nodeid=nodeid, covariates=covariates, inputs=inputs, params=params)
        return res

    return tolstat_check
