"""The README's five-minute path, timed step by step in a fresh venv.

    python benchmarks/bench_init_path.py [--torch torch==2.13.0] [--keep DIR]

Creates a venv in a temporary folder, installs torch (``--torch``, the CPU wheel by
default) and this checkout with pytest, then runs the README's steps: ``tolstat init
myproject``, ``python calibrate.py`` and ``pytest`` in the project. Prints each step's
wall time and writes them to ``benchmarks/results/init_path.json`` (atomically, with the
load average at the start and the end). Every step must succeed; the suite must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _step(name: str, cmd: list[str], cwd: Path, env: dict[str, str], times: dict[str, float]) -> str:
    t = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    times[name] = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"{name} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    print(f"{name}: {times[name]:.1f} s", flush=True)
    return res.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", default="torch==2.13.0", help="the torch requirement (default torch==2.13.0)")
    ap.add_argument("--keep", help="build in this folder and keep it (default: a temporary folder)")
    ap.add_argument("--out", default=str(HERE / "results" / "init_path.json"))
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV", "PYTHONPATH"))}
        times: dict[str, float] = {}
        venv = base / "venv"
        _step("python -m venv", [sys.executable, "-m", "venv", str(venv)], base, env, times)
        py = str(venv / "bin" / "python")
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        _step(f"pip install {args.torch}", [py, "-m", "pip", "install", "-q", args.torch], base, env, times)
        _step("pip install tolstat pytest", [py, "-m", "pip", "install", "-q", str(ROOT), "pytest"], base, env, times)
        _step("tolstat init myproject", [str(venv / "bin" / "tolstat"), "init", "myproject"], base, env, times)
        proj = base / "myproject"
        _step("python calibrate.py", [py, "calibrate.py"], proj, env, times)
        out = _step("pytest", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"], proj, env, times)
        passed = next((ln.strip() for ln in out.splitlines() if " passed" in ln), "")
    total = sum(times.values())
    print(f"total {total:.1f} s; after the venv and torch {total - sum(list(times.values())[:2]):.1f} s; {passed}")
    res = {"steps_s": times, "total_s": total, "pytest": passed, "load_start": load_start,
           "load_end": os.getloadavg(), "machine": platform.machine(), "python": platform.python_version()}
    from tolstat._base.util import atomic_write_text

    atomic_write_text(args.out, json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
