"""Compile caching of tolstat's numba kernels: a cold start against a warm one.

Runs the same small workload (import, collect 60 runs of the demo matmul, ``select``)
twice in fresh subprocesses sharing one empty ``TOLSTAT_CACHE_DIR``: the first run
compiles every kernel and writes the cache, the second loads it. Reports both wall
times, their ratio, and that nothing was written into the package folder.

    python benchmarks/bench_numba_cache.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = """
import tolstat
from tolstat.cli.main import _demo_dataset
ds = _demo_dataset(60, 0)
tolstat.select(ds, fp_budget=0.05, confidence=0.9)
"""


def _run(env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", WORKLOAD], env=env, check=True)
    return time.perf_counter() - t


def main() -> dict[str, float | int]:
    import tolstat

    pkg = Path(tolstat.__file__).parent
    before = set(pkg.rglob("*.nb[ic]"))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TOLSTAT_CACHE_DIR=cache)
        env.pop("NUMBA_CACHE_DIR", None)
        cold = _run(env)
        warm = _run(env)
        n_files = sum(1 for _ in Path(cache).rglob("*.nb[ic]"))
    in_package = len(set(pkg.rglob("*.nb[ic]")) - before)
    out = {"cold_s": round(cold, 2), "warm_s": round(warm, 2), "warm_over_cold": round(warm / cold, 3),
           "cache_files": n_files, "files_written_in_package": in_package}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
