"""The tolstat command line."""

from __future__ import annotations

import pytest

import tolstat
from tolstat.cli.main import main


@pytest.mark.slow
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


def test_collect_calibrate_check(tmp_path, capsys):
    import numpy as np

    from tolstat import corpus

    errs = tmp_path / "errors.nc"
    assert main(["collect", "-o", str(errs), "--ops", "gelu", "--dtypes", "float16",
                 "--cases", "80", "--quick", "--no-progress"]) == 0
    table = tmp_path / "table.json"
    assert main(["calibrate", str(errs), "--fp-budget", "0.05", "--form", "allclose",
                 "--pool-hardware", "-o", str(table)]) == 0
    case = corpus.cases("gelu", "float16", n=1, seed=99, quick=True)[0]
    ref = corpus.run_reference(case, "float16")
    good = corpus.run_kernel(corpus.OPS["gelu"].variants["erf"], case, "float16")
    bad = corpus.run_kernel(corpus.BUGS["gelu_missing_half"].kernel, case, "float16")
    np.save(tmp_path / "ref.npy", ref)
    np.save(tmp_path / "good.npy", good)
    np.save(tmp_path / "bad.npy", bad)
    capsys.readouterr()
    args = ["--op", "gelu", "--dtype", "fp16", "--table", str(table)]
    assert main(["check", str(tmp_path / "good.npy"), str(tmp_path / "ref.npy"), *args]) == 0
    out = capsys.readouterr().out
    assert "PASS gelu/float16" in out
    assert " <= " not in out and ("% of its threshold" in out or "correctly rounded" in out), out
    np.save(tmp_path / "rounded.npy", ref.astype(np.float16))  # the reference correctly rounded
    assert main(["check", str(tmp_path / "rounded.npy"), str(tmp_path / "ref.npy"), *args]) == 0
    assert "every element is the reference rounded to float16 (correctly rounded)" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "bad.npy"), str(tmp_path / "ref.npy"), *args]) == 1
    assert "gelu" in capsys.readouterr().out
    # a group the table does not have is a clear error, exit status 2
    assert main(["check", str(tmp_path / "good.npy"), str(tmp_path / "ref.npy"), "--op", "silu",
                 "--dtype", "fp16", "--table", str(table)]) == 2
    assert "silu" in capsys.readouterr().err
