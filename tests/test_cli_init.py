"""``tolstat init``: the scaffold of a calibrated pytest suite, and that suite run as a user runs it."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from tolstat.cli import scaffold
from tolstat.cli.main import main

pytest_plugins = ["pytester"]


def test_init_writes_the_suite_files_and_says_what_to_commit(tmp_path, capsys):
    assert main(["init", str(tmp_path / "proj")]) == 0
    out = capsys.readouterr().out
    root = tmp_path / "proj"
    for rel in ("kernels.py", "calibrate.py", "tests/test_kernels.py", "pyproject.toml", "conftest.py",
                ".gitignore"):
        assert (root / rel).is_file(), rel
        assert f"wrote {rel}" in out
    assert "commit kernels.py" in out and "tolerances.json" in out and "not errors.nc" in out
    assert (root / ".gitignore").read_text().splitlines() == ["errors.nc"]
    pp = (root / "pyproject.toml").read_text()
    assert 'table = "tolerances.json"' in pp and "suite_budget = 0.01" in pp
    kernels = (root / "kernels.py").read_text()
    for op in scaffold.DEFAULT_OPS:
        assert f"def {op}_kernel(" in kernels and f"def {op}_reference(" in kernels
    assert '"fp16": torch.float16, "bf16": torch.bfloat16' in kernels
    for rel in ("kernels.py", "calibrate.py", "tests/test_kernels.py", "conftest.py"):
        compile((root / rel).read_text(), rel, "exec")  # valid Python


def test_init_refuses_to_overwrite_without_force(tmp_path, capsys):
    assert main(["init", str(tmp_path)]) == 0
    (tmp_path / "kernels.py").write_text("# mine\n")
    assert main(["init", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "kernels.py, calibrate.py, tests/test_kernels.py already exist" in err and "--force" in err
    assert (tmp_path / "kernels.py").read_text() == "# mine\n"
    assert main(["init", str(tmp_path), "--force", "--op", "gelu"]) == 0
    assert "def gelu_kernel(" in (tmp_path / "kernels.py").read_text()
    # pyproject.toml, conftest.py and .gitignore of the first run are kept, not duplicated
    out = capsys.readouterr().out
    assert "left pyproject.toml" in out and "left conftest.py" in out
    assert (tmp_path / "pyproject.toml").read_text().count("[tool.tolstat]") == 1
    assert (tmp_path / ".gitignore").read_text().splitlines() == ["errors.nc"]


def test_init_appends_to_an_existing_pyproject_and_gitignore(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mine"')  # no final newline
    (tmp_path / ".gitignore").write_text("*.pyc\n")
    scaffold.write(scaffold.plan(tmp_path, ["matmul"], ["fp16"]))
    pp = (tmp_path / "pyproject.toml").read_text()
    assert pp.startswith('[project]\nname = "mine"\n\n[tool.tolstat]\n')
    import tomllib

    cfg = tomllib.loads(pp)
    assert cfg["project"]["name"] == "mine"
    assert cfg["tool"]["tolstat"] == {"table": "tolerances.json", "suite_budget": 0.01, "suite_tail": "model"}
    assert (tmp_path / ".gitignore").read_text() == "*.pyc\nerrors.nc\n"


@pytest.mark.parametrize("argv, words", [
    (["--op", "conv2d"], ["--op 'conv2d'", "templates for", "matmul", "register"]),
    (["--dtype", "fp8"], ["--dtype 'fp8'", "bf16"]),
    (["--op", "matmul", "matmul"], ["--op 'matmul' is given twice"]),
    (["--runs", "299"], ["--runs", ">= 300", "299"]),
    (["--checks", "0"], ["--checks", ">= 1", "0"]),
])
def test_init_names_the_bad_argument(tmp_path, capsys, argv, words):
    assert main(["init", str(tmp_path / "p"), *argv]) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err
    assert not (tmp_path / "p").exists()


def test_init_into_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["init", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _plant_scale_bug(root: Path, op: str) -> None:
    """Multiply what ``{op}_kernel`` returns by ``1 + 2^-8`` (a 0.4% scale error)."""
    src = (root / "kernels.py").read_text()
    marker = f"def {op}_kernel("
    head, _, rest = src.partition(marker)
    start = rest.index("return ")
    end = rest.index("\n", start)
    (root / "kernels.py").write_text(head + marker + rest[:end] + " * (1 + 2 ** -8)" + rest[end:])


def test_init_suite_goes_green_on_torch_and_red_on_a_scale_bug(torch_and_h5netcdf, pytester, monkeypatch):
    """The same steps in this process (calibrate.py by runpy, the suite by pytester)."""
    root = pytester.path
    assert main(["init", str(root), "--op", "softmax", "--dtype", "fp16", "--runs", "300",
                 "--checks", "2"]) == 0
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "kernels", raising=False)
    runpy.run_path(str(root / "calibrate.py"), run_name="__main__")
    sys.modules.pop("kernels", None)
    assert (root / "tolerances.json").is_file() and (root / "errors.nc").is_file()
    green = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    green.assert_outcomes(passed=3)
    assert any("suite budget 0.01 split over 3 checks" in line for line in green.outlines)
    _plant_scale_bug(root, "softmax")
    red = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    red.assert_outcomes(passed=1, failed=2)  # the 1% test still passes: its check still fails


@pytest.mark.slow
def test_init_with_every_template_goes_green_in_fp16_and_bf16_and_red_on_a_scale_bug(tmp_path):
    """As a user runs it: ``python calibrate.py`` and ``pytest`` in new processes."""
    pytest.importorskip("torch")
    ops = sorted(scaffold.TEMPLATES)
    assert main(["init", str(tmp_path), "--op", *ops]) == 0
    n = len(ops) * 2
    cal = _run([sys.executable, "calibrate.py"], tmp_path)
    assert cal.returncode == 0, cal.stdout + cal.stderr
    assert f"{n} groups" in cal.stdout
    assert (tmp_path / "tolerances.json").is_file() and (tmp_path / "errors.nc").is_file()
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    green = _run(pytest_cmd, tmp_path)
    assert green.returncode == 0 and f"{n * 5} passed" in green.stdout, green.stdout + green.stderr
    assert f"suite budget 0.01 split over {n * 5} checks" in green.stdout
    _plant_scale_bug(tmp_path, "layer_norm")  # every check of fresh inputs of layer_norm fails
    red = _run(pytest_cmd, tmp_path)
    assert red.returncode == 1, red.stdout + red.stderr
    assert f"8 failed, {n * 5 - 8} passed" in red.stdout, red.stdout
