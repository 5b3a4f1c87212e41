"""Mutation testing of tolstat's core with mutmut: run, score per module, list survivors.

Usage (from the repository root; not part of the CI test run)::

    pip install -e ".[mutation]"
    python benchmarks/mutation.py                 # run (resumable) and report
    python benchmarks/mutation.py --report-only   # only re-read the results in mutants/
    python benchmarks/mutation.py --fresh         # discard cached results first

What is mutated and which tests run is configured in ``pyproject.toml``
(``[tool.mutmut]``): ``only_mutate`` lists the core modules, and
``pytest_add_cli_args_test_selection`` the fast unit tests that cover them (the long
coverage simulations are left out). mutmut runs, for each mutant, only the tests that
execute the mutated function, in forked workers (``process_isolation = "forkserver"``,
because torch and numba thread pools are not fork-safe). Functions with decorators
(every ``numba.njit`` kernel) are not mutated by mutmut: the kernels are covered by the
parity tests against numpy/scipy instead.

Score per module = killed / (mutants - equivalent), where *killed* counts mutants whose
tests fail or time out, and *equivalent* mutants (listed with the reason why no test can
tell them from the original in ``benchmarks/mutation_equivalent.json``) are excluded.
Mutants no test executes ("no tests") and survivors count against the score.

Writes ``benchmarks/results/mutation.json`` and ``benchmarks/results/mutation.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.json"
KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def _module(mutant: str) -> str:
    return mutant.rsplit(".", 1)[0]


def _function(mutant: str) -> str:
    return mutant.rsplit(".", 1)[1].rsplit("__mutmut_", 1)[0].lstrip("x").replace("ǁ", ".").strip("_.")


def run(max_children: int, names: list[str], log: Path) -> float:
    """Run mutmut (resumable: cached verdicts are kept); returns the wall time in seconds."""
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names]
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as fh:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"mutmut run failed (exit {rc}); end of {log}:\n{tail}")
    return time.perf_counter() - t0


def collect() -> dict[str, str]:
    """``{mutant name: status}`` from mutmut's result files under ``mutants/``."""
    from mutmut.stats import status_by_exit_code

    out: dict[str, str] = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        d = json.loads(meta.read_text(encoding="utf-8"))
        for name, code in d.get("exit_code_by_key", {}).items():
            out[name] = status_by_exit_code[code]
    return out


def diffs(names: list[str]) -> dict[str, str]:
    """The source diff of each named mutant (mutmut's own rendering)."""
    os.chdir(ROOT)
    from mutmut.__main__ import find_mutant, get_diff_for_mutant

    out = {}
    for n in names:
        try:
            d = get_diff_for_mutant(n, path=find_mutant(n).path)
        except Exception as exc:  # noqa: BLE001 - a report must not die on one diff
            d = f"(diff unavailable: {exc})"
        lines = [ln for ln in d.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        out[n] = "\n".join(lines)
    return out


def score(status: dict[str, str], equivalent: dict[str, str]) -> dict:
    per: dict[str, Counter] = defaultdict(Counter)
    for name, st in status.items():
        mod = _module(name)
        if st == "not checked":  # generated but not run (a run restricted to some names)
            per[mod]["not_run"] += 1
            continue
        per[mod]["mutants"] += 1
        if name in equivalent:
            per[mod]["equivalent"] += 1
        elif st in KILLED:
            per[mod]["killed"] += 1
        else:
            per[mod][st.replace(" ", "_")] += 1
    rows = {}
    tot: Counter = Counter()
    for mod in sorted(per):
        c = per[mod]
        tot.update(c)
        rows[mod] = dict(c)
    for mod, c in list(rows.items()) + [("TOTAL", dict(tot))]:
        denom = c.get("mutants", 0) - c.get("equivalent", 0)
        c["score"] = round(c.get("killed", 0) / denom, 4) if denom else None
        rows[mod] = c
    return rows


def write(rows: dict, status: dict[str, str], equivalent: dict[str, str], survivors_diff: dict[str, str],
          wall: float | None, args: argparse.Namespace) -> None:
    import mutmut

    RESULTS.mkdir(parents=True, exist_ok=True)
    survivors = sorted(n for n, s in status.items() if s not in KILLED | {"not checked"} and n not in equivalent)
    doc = {
        "tool": f"mutmut {mutmut.__version__}",
        "command": " ".join(["python benchmarks/mutation.py", f"--max-children {args.max_children}",
                             *(shlex.quote(n) for n in args.names)]),
        "wall_seconds_last_run": None if wall is None else round(wall, 1),
        "scores": rows,
        "survivors": {n: {"status": status[n], "diff": survivors_diff.get(n, "")} for n in survivors},
        "equivalent": {n: equivalent[n] for n in sorted(equivalent) if n in status},
        "equivalent_listed_but_not_generated": sorted(n for n in equivalent if n not in status),
    }
    tmp = RESULTS / f".mutation.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, RESULTS / "mutation.json")

    md = ["# Mutation testing of the core", "",
          f"Measured with {doc['tool']} by `python benchmarks/mutation.py` (see `docs/testing.md`).",
          "Score = killed / (mutants - equivalent); survivors and mutants no test executes count",
          "against it.", "",
          "Mutants generated but not run in the measured run (restricted to some functions) are",
          "counted in 'not run' and left out of the score.", "",
          "| module | mutants run | killed | survived | no tests | other | equivalent | score | not run |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mod, c in rows.items():
        other = c.get("mutants", 0) - sum(c.get(k, 0) for k in ("killed", "survived", "no_tests", "equivalent"))
        if not c.get("mutants", 0) and not args.all_modules:
            continue
        sc = "n/a" if c["score"] is None else f"{100 * c['score']:.1f}%"
        name = f"**{mod}**" if mod == "TOTAL" else f"`{mod}`"
        md.append(f"| {name} | {c.get('mutants', 0)} | {c.get('killed', 0)} | {c.get('survived', 0)} | "
                  f"{c.get('no_tests', 0)} | {other} | {c.get('equivalent', 0)} | {sc} | {c.get('not_run', 0)} |")
    md += ["", "## Equivalent mutants (excluded from the score)", ""]
    if doc["equivalent"]:
        md += [f"- `{n}`: {r}" for n, r in doc["equivalent"].items()]
    else:
        md.append("(none)")
    md += ["", "## Surviving mutants", ""]
    if survivors:
        for n in survivors:
            md.append(f"- `{n}` ({status[n]})")
            d = survivors_diff.get(n, "")
            if d:
                md += ["  ```diff"] + [f"  {ln}" for ln in d.splitlines()] + ["  ```"]
    else:
        md.append("(none)")
    tmp = RESULTS / f".mutation.md.{os.getpid()}.tmp"
    tmp.write_text("\n".join(md) + "\n", encoding="utf-8")
    os.replace(tmp, RESULTS / "mutation.md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-children", type=int, default=2, help="parallel mutant workers (default 2)")
    ap.add_argument("--report-only", action="store_true", help="do not run, only report cached results")
    ap.add_argument("--fresh", action="store_true", help="delete mutants/ (all cached verdicts) first")
    ap.add_argument("--all-modules", action="store_true", help="list modules with no mutant run too")
    ap.add_argument("names", nargs="*", help="mutant name globs, e.g. 'tolstat.checks.*' (re-runs those)")
    args = ap.parse_args(argv)
    if args.fresh and (ROOT / "mutants").exists():
        shutil.rmtree(ROOT / "mutants")
    wall = None
    if not args.report_only:
        (ROOT / "mutants").mkdir(exist_ok=True)
        wall = run(args.max_children, args.names, ROOT / "mutants" / "mutation-run.log")
    status = collect()
    if not status:
        raise SystemExit("no mutmut results under mutants/: run without --report-only first")
    equivalent = json.loads(EQUIVALENT.read_text(encoding="utf-8")) if EQUIVALENT.exists() else {}
    rows = score(status, equivalent)
    surv = sorted(n for n, s in status.items() if s not in KILLED | {"not checked"} and n not in equivalent)
    write(rows, status, equivalent, diffs(surv), wall, args)
    w = max(len(m) for m in rows)
    print(f"{'module':{w}s} {'mutants':>8s} {'killed':>7s} {'survived':>9s} {'no tests':>9s} {'equiv':>6s} {'score':>7s}")
    for mod, c in rows.items():
        if not c.get("mutants", 0) and not args.all_modules:
            continue
        sc = "n/a" if c["score"] is None else f"{100 * c['score']:.1f}%"
        print(f"{mod:{w}s} {c.get('mutants', 0):8d} {c.get('killed', 0):7d} {c.get('survived', 0):9d} "
              f"{c.get('no_tests', 0):9d} {c.get('equivalent', 0):6d} {sc:>7s}")
    print(f"\n{len(surv)} surviving mutants (listed with diffs in {RESULTS / 'mutation.md'}):")
    for n in surv:
        print(f"  {n} ({status[n]})")
    if wall is not None:
        print(f"\nwall time of this run: {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
