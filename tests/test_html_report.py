"""The HTML report of a table on an error dataset (``tolstat report TABLE --errors DS``).

What it specifies: one section per table group with the decision values' histogram and
the threshold on it, the runs nearest the threshold, the recall table when references are
given; its counts are the decisions :func:`tolstat.check_runs` makes; labels are escaped;
the CLI's errors name the argument. The page renders in a headless Chromium (skipped
where none is installed: ``chromium-headless-shell``, ``chromium`` or ``TOLSTAT_CHROMIUM``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tolstat
from tolstat.assess.power import power_report
from tolstat.cli.html_report import histogram_svg, table_report_html, write_table_report
from tolstat.cli.main import main


def _items(dt, n: int, seed: int, bug: float = 0.0, hw_bug_every: int = 0) -> list[dict]:
    """``n`` fp32-accumulating matmuls stored in ``dt``; every ``hw_bug_every``-th scaled by ``1 + bug``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = rng.standard_normal((16, 32)).astype(dt)
        b = rng.standard_normal((32, 16)).astype(dt)
        act = a.astype(np.float32) @ b.astype(np.float32)
        if hw_bug_every and i % hw_bug_every == 0:
            act = act * (1.0 + bug)
        out.append({"actual": act.astype(dt), "expected": a.astype(np.float64) @ b.astype(np.float64),
                    "inputs": (a, b)})
    return out


def _ds(n: int, seed: int, hardware: str = "cpu:test", **bug):
    opts = tolstat.CollectOptions(progress=False)
    parts = [tolstat.from_pairs(_items(dt, n, seed + j, **bug), op="matmul", dtype=name, hardware=hardware,
                                options=opts)
             for j, (name, dt) in enumerate((("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)))]
    return tolstat.concat(parts)


@functools.lru_cache(maxsize=2)
def _calibrated(form: object = "auto"):
    ds = _ds(60, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = tolstat.select(ds, fp_budget=0.1, form=form)
    return ds, table


def _over_counts(page: str) -> list[int]:
    return [int(m) for m in re.findall(r"(\d+) over the threshold", page)]


@pytest.mark.parametrize("form", ["auto", "allclose"])
def test_counts_over_threshold_are_the_checks_failures(form: str) -> None:
    _, table = _calibrated(form)
    held = _ds(40, 7, bug=0.02, hw_bug_every=4)  # 10 of each group's 40 runs scaled by 1.02
    page = table_report_html(table, held)
    failed = ~tolstat.check_runs(held, table)
    dts = np.asarray(held["dtype"].values).astype(str)
    expected = [int(failed[dts == dt].sum()) for _, dt, _ in table.groups]
    counts = _over_counts(page)
    assert len(table.statistics) == 1  # one histogram per group, so one count per group
    assert counts == expected
    assert sum(expected) >= 10  # the bug is caught: the counts are not trivially zero


def test_one_section_per_group_with_histogram_threshold_and_nearest_runs() -> None:
    ds, table = _calibrated()
    page = table_report_html(table, ds, nearest=3)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count('<section class="group"') == len(table) == 2
    assert page.count('<line class="threshold"') == 2
    assert page.count("<rect class=\"bar\"") >= 2
    # the nearest runs: the 3 largest decision values of each group, largest first
    from tolstat.calibration.decision import entry_run_values

    for op, dt, hw in table.groups:
        ent = table.entry(op, dt, hw)
        sub = ds.isel(run=np.flatnonzero(np.asarray(ds["dtype"].values).astype(str) == dt))
        v = entry_run_values(sub, ent)["op_score"]
        top = np.asarray(sub["run_index"].values)[np.argsort(-v, kind="stable")[:3]]
        sec = page.split(f"<h2>{op} / {dt} / {hw}</h2>")[1].split("</section>")[0]
        near = sec.split('<table class="nearest">')[1].split("</table>")[0]
        rows = re.findall(r"<tr><td>(\d+)</td><td class=\"text\">(\d+)</td>", near)
        assert [int(r) for _, r in rows] == [int(t) for t in top]
    assert "No recall table" in page


def test_recall_table_from_the_power_report() -> None:
    ds, table = _calibrated()
    rng = np.random.default_rng(3)
    refs = {}
    for name, dt in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        rs = []
        for _ in range(6):
            a = rng.standard_normal((16, 32)).astype(dt).astype(np.float64)
            b = rng.standard_normal((32, 16)).astype(dt).astype(np.float64)
            rs.append({"expected": a @ b, "magnitude": np.abs(a) @ np.abs(b), "covariates": {"K": 32}})
        refs[("matmul", name)] = rs
    rep = power_report(table, refs, peers=("torch-defaults",))
    page = table_report_html(table, ds, power=rep)
    assert page.count('<table class="recall">') == 2
    i = rep.groups.index(table.groups[0])
    zeros = rep.data["caught"].sel(rule="tolstat", wrong="zeros").values[i]
    sec = page.split('<table class="recall">')[1].split("</table>")[0]
    row = re.search(r"<td class=\"text\">tolstat</td><td>([^<]+)</td>", sec)
    assert row is not None and row.group(1) == f"{100 * zeros:.0f}%"
    assert "torch-defaults" in sec


def test_labels_are_escaped_and_unmatched_runs_named() -> None:
    _, table = _calibrated()
    other = _ds(5, 9, hardware="<b>gpu&x</b>")
    page = table_report_html(table, other)
    assert "<b>gpu" not in page
    assert "&lt;b&gt;gpu&amp;x&lt;/b&gt;" in page  # named among the runs the table has no group for
    assert page.count("No runs of this group in the error dataset") == 2


def test_histogram_counts_zero_and_nonfinite_values_apart() -> None:
    svg = histogram_svg([0.0, 0.0, 1.0, 2.0, np.inf, np.nan], 1.5)
    assert "6 runs; 2 with decision value 0" in svg
    assert "1 non-finite" in svg and "1 without a value" in svg
    assert "2 over the threshold 1.5" in svg  # 2.0 and inf
    assert "<svg" not in histogram_svg([0.0, np.nan], 1.0)  # nothing to draw: the caption only


def test_refused_group_is_shown_as_refused() -> None:
    ds = _ds(20, 2, bug=0.01, hw_bug_every=3)  # inexact runs in both groups: 10 units < 2,995 at 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = tolstat.select(ds, fp_budget=0.001, on_error="skip")
    refused = []
    for g in table.groups:
        try:
            table.entry(*g)
        except KeyError:
            refused.append(g)
    assert refused
    page = table_report_html(table, ds)
    assert page.count("Refused at calibration") == len(refused)
    assert page.count("2995 needed for budget 0.001") >= len(refused)  # the reason is shown
    assert page.count('<section class="group"') == len(table)


def test_arguments_are_checked() -> None:
    ds, table = _calibrated()
    with pytest.raises(TypeError, match="table must be a ToleranceTable"):
        table_report_html({}, ds)
    with pytest.raises(ValueError, match="nearest must be a positive integer, got 0"):
        table_report_html(table, ds, nearest=0)
    with pytest.raises(ValueError, match=r"path must end in \.html"):
        write_table_report("x.txt", table, ds)


def test_cli_writes_the_page_and_names_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds, table = _calibrated()
    tpath, epath = tmp_path / "t.json", tmp_path / "e.nc"
    table.to_json(tpath)
    tolstat.save(ds, epath)
    assert main(["report", str(tpath), "--errors", str(epath)]) == 0
    out = tmp_path / "t.html"
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_text(encoding="utf-8").count('<section class="group"') == 2
    assert main(["report", str(tpath)]) == 2
    assert "needs --errors ERRORS.nc" in capsys.readouterr().err
    (tmp_path / "ev").mkdir()
    assert main(["report", str(tmp_path / "ev"), "--errors", str(epath)]) == 2
    assert "--errors belong to the HTML report of a table" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing.json"), "--errors", str(epath)]) == 2
    assert "no such table or evaluation folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tpath), "--errors", str(epath), "-o", str(tmp_path / "r.md")])
    assert exc.value.code == 2
    assert "must end in .html" in capsys.readouterr().err


def _chromium() -> str | None:
    env = os.environ.get("TOLSTAT_CHROMIUM")
    if env:
        return env
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome", "headless_shell"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium (chromium-headless-shell, chromium or TOLSTAT_CHROMIUM)")
    ds, table = _calibrated()
    page = write_table_report(tmp_path / "r.html", table, ds)
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'p'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    # the browser's parsed document: every section, histogram bar and threshold line survived parsing
    assert dom.count('<section class="group"') == 2
    assert dom.count('class="threshold"') == 2
    assert dom.count('class="bar"') == table_report_html(table, ds).count('class="bar"') > 0
    png = tmp_path / "r.png"
    subprocess.run([*flags, "--window-size=1000,1400", f"--screenshot={png}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image as mpimg

    img = mpimg.imread(png)[..., :3]
    red = (img[..., 0] > 0.6) & (img[..., 1] < 0.3) & (img[..., 2] < 0.3)
    blue = (img[..., 2] > 0.55) & (img[..., 0] < 0.4)
    assert red.sum() > 50  # the dashed threshold lines were drawn
    assert blue.sum() > 200  # and the histogram bars
