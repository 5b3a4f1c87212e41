"""The tolstat command line."""

from __future__ import annotations

import tolstat
from tolstat.cli import main


def test_demo_and_summary(tmp_path, capsys):
    out = tmp_path / "demo.nc"
    assert main(["demo", "--runs", "4", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "matmul" in text and "bfloat16" in text and "float16" in text
    ds = tolstat.open_errors(out)
    assert ds.sizes["run"] == 8
    assert main(["summary", str(out)]) == 0
    assert "max max_ulp" in capsys.readouterr().out


def test_cli_reports_bad_files(tmp_path, capsys):
    bad = tmp_path / "bad.nc"
    bad.write_text("junk")
    assert main(["summary", str(bad)]) == 2
    assert "bad.nc" in capsys.readouterr().err
