"""The tutorial's suite, from its text alone: the files of docs/tutorial.md section 7, written
into an empty folder, calibrated and tested as a user runs them."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs_snippets import ROOT, file_blocks

pytest_plugins = ["pytester"]

TUTORIAL = ROOT / "docs" / "tutorial.md"
FILES = ("my_kernels.py", "calibrate.py", "tests/test_my_kernels.py", "pyproject.toml")


def _write(root: Path) -> dict[str, str]:
    files = file_blocks(TUTORIAL)
    assert sorted(files) == sorted(FILES)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return files


def _plant_bug(root: Path) -> None:
    """A 0.4% scale error in the registered op's kernel."""
    src = (root / "my_kernels.py").read_text()
    old = "return (alpha * (a.float() @ b.float())).to(torch.float16)"
    assert src.count(old) == 1
    (root / "my_kernels.py").write_text(src.replace(old, old.replace("(alpha *", "(alpha * 1.004 *")))


def test_tutorial_states_the_line_count_of_its_files():
    files = file_blocks(TUTORIAL)
    n = sum(1 for text in files.values() for line in text.splitlines() if line.strip())
    m = re.search(r"These (\w+) files are (\d+) lines \(without blank lines\)", TUTORIAL.read_text())
    assert m, "the tutorial states how long its files are"
    assert (m.group(1), int(m.group(2))) == ({4: "four"}.get(len(files), str(len(files))), n)


def test_tutorial_suite_goes_green_and_catches_a_bug(torch_and_h5netcdf, pytester, monkeypatch):
    """In this process: calibrate.py by runpy, the suite by pytester."""
    root = pytester.path
    _write(root)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "my_kernels", raising=False)
    runpy.run_path(str(root / "calibrate.py"), run_name="__main__")
    sys.modules.pop("my_kernels", None)
    green = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    green.assert_outcomes(passed=10)
    assert any("suite budget 0.01 split over 10 checks" in line for line in green.outlines)
    _plant_bug(root)
    red = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    red.assert_outcomes(passed=5, failed=5)


@pytest.mark.slow
def test_tutorial_suite_in_a_fresh_process(tmp_path):
    """As a user runs it: ``python calibrate.py`` and ``pytest`` in the folder, in new processes."""
    pytest.importorskip("torch")
    _write(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    cal = run(sys.executable, "calibrate.py")
    assert cal.returncode == 0, cal.stdout + cal.stderr
    green = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert green.returncode == 0 and "10 passed" in green.stdout, green.stdout + green.stderr
    _plant_bug(tmp_path)
    red = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")
    assert red.returncode == 1 and "5 failed, 5 passed" in red.stdout, red.stdout + red.stderr
