"""Mutation testing of tolstat's core with mutmut: run, score per module, list survivors.

Usage (from the repository root; not part of the CI test run)::

    pip install -e ".[mutation]"
    python benchmarks/mutation.py                 # run (resumable) and report
    python benchmarks/mutation.py --report-only   # only re-read the results in mutants/
    python benchmarks/mutation.py --fresh         # discard cached results first
    python benchmarks/mutation.py --sample 60 --seed 17 --max-children 1
                                                  # seeded stratified random sample
    python benchmarks/mutation.py --sample 40 --seed 31 "tolstat.calibration.engine.*"
                                                  # the same draw, of one module only

A full run of every core mutant (about 10500) takes hours on two cores. ``--sample N
--seed S`` draws, per module, a simple random sample of N mutants without replacement
(all of a module's mutants when it has N or fewer), seeded by ``S`` and the module name
(``random.Random(f"{S}:{module}")`` over the sorted mutant names, so a module's sample
does not depend on the other modules), runs those that have no verdict yet or were not
killed (a killed verdict of an earlier run is kept: tests are only ever added; ``--rerun``
or ``--fresh`` runs every sampled mutant again), and scores only those: a
*sample estimate*, reported as such, with a 95% Wilson interval per module (a module
sampled whole is a census: its score is exact) and, for the total, the stratified
estimate (modules weighted by their estimated number of non-equivalent mutants) with a
normal-approximation 95% interval including the finite-population correction.

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

Writes ``benchmarks/results/mutation.json`` and ``benchmarks/results/mutation.md``
(``mutation_TAG.{json,md}`` with ``--tag TAG``, e.g. for a held-out sample).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import math
import random
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


def generate() -> None:
    """Generate the mutants (``mutants/``, mutmut's own generation step) without running any."""
    code = (
        "import os\n"
        "from mutmut.__main__ import copy_src_dir, copy_also_copy_files, setup_source_paths, "
        "store_lines_covered_by_tests, create_mutants\n"
        "from mutmut.mutation.trampoline import set_mutant_under_test\n"
        "set_mutant_under_test('mutant_generation')\n"
        "os.makedirs('mutants', exist_ok=True)\n"
        "copy_src_dir(); copy_also_copy_files(); setup_source_paths(); store_lines_covered_by_tests()\n"
        "create_mutants(1)\n"
    )
    rc = subprocess.call([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL)
    if rc != 0:
        raise SystemExit(f"mutant generation failed (exit {rc})")


def all_mutants() -> list[str]:
    """Every generated mutant name (from mutmut's ``*.py.meta`` files), sorted."""
    names = []
    for meta in (ROOT / "mutants").rglob("*.py.meta"):
        names += json.loads(meta.read_text(encoding="utf-8")).get("exit_code_by_key", {})
    return sorted(names)


def draw_sample(names: list[str], n: int, seed: int) -> dict[str, list[str]]:
    """Stratified simple random sample: per module, ``n`` names without replacement (all if fewer).

    Each module's draw uses its own generator, ``random.Random(f"{seed}:{module}")``, over
    the module's sorted names, so it is reproducible and independent of the other modules.
    """
    by_mod: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_mod[_module(name)].append(name)
    out = {}
    for mod in sorted(by_mod):
        pop = sorted(by_mod[mod])
        out[mod] = pop if len(pop) <= n else sorted(random.Random(f"{seed}:{mod}").sample(pop, n))
    return out


def wilson(k: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval for k successes in n trials (statsmodels)."""
    from statsmodels.stats.proportion import proportion_confint

    lo, hi = proportion_confint(k, n, alpha=0.05, method="wilson")
    return float(lo), float(hi)


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


def score(status: dict[str, str], equivalent: dict[str, str],
          sample: dict[str, list[str]] | None = None) -> dict:
    """Counts and score per module and in total.

    Without ``sample`` every generated mutant counts (``not checked`` ones as *not run*).
    With ``sample`` (``{module: sampled names}``) only sampled mutants count; the others
    are *not sampled*, sampled mutants without a verdict are *not run*, and each score
    gets a 95% interval (see the module docstring).
    """
    per: dict[str, Counter] = defaultdict(Counter)
    population: Counter = Counter(_module(n) for n in status)
    in_sample = None if sample is None else {n for names in sample.values() for n in names}
    for name, st in status.items():
        mod = _module(name)
        if in_sample is not None and name not in in_sample:
            per[mod]["not_sampled"] += 1
            continue
        if st == "not checked":  # generated (or sampled) but not run
            per[mod]["not_run"] += 1
            continue
        per[mod]["mutants"] += 1
        if name in equivalent:
            per[mod]["equivalent"] += 1
        elif st in KILLED:
            per[mod]["killed"] += 1
        else:
            per[mod][st.replace(" ", "_")] += 1
    rows: dict[str, dict] = {}
    tot: Counter = Counter()
    strata = []
    for mod in sorted(per):
        c = dict(per[mod])
        tot.update(per[mod])
        c["population"] = population[mod]
        n_run, eq, k = c.get("mutants", 0), c.get("equivalent", 0), c.get("killed", 0)
        denom = n_run - eq
        c["score"] = round(k / denom, 4) if denom else None
        c["census"] = n_run == population[mod]
        if denom:
            lo, hi = (k / denom, k / denom) if c["census"] else wilson(k, denom)
            c["ci95"] = [round(lo, 4), round(hi, 4)]
            # estimated number of non-equivalent mutants in the module
            strata.append((population[mod] * denom / n_run, denom, k / denom, c["census"]))
        rows[mod] = c
    t = dict(tot)
    t["population"] = sum(population.values())
    denom = t.get("mutants", 0) - t.get("equivalent", 0)
    t["score"] = round(t.get("killed", 0) / denom, 4) if denom else None  # pooled counts
    t["census"] = t.get("mutants", 0) == t["population"]
    if strata and sample is not None:
        big_m = sum(s[0] for s in strata)
        est = sum(m / big_m * p for m, _, p, _ in strata)
        var = sum((m / big_m) ** 2 * (0.0 if census or n < 2 else max(0.0, 1 - n / m) * p * (1 - p) / (n - 1))
                  for m, n, p, census in strata)
        half = 1.959963984540054 * math.sqrt(var)
        t["stratified_score"] = round(est, 4)
        t["ci95"] = [round(max(0.0, est - half), 4), round(min(1.0, est + half), 4)]
    elif denom and t["census"]:
        t["ci95"] = [t["score"], t["score"]]
    rows["TOTAL"] = t
    return rows


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ci(c: dict) -> str:
    if "ci95" not in c:
        return "n/a"
    if c.get("census"):
        return "exact (all run)"
    lo, hi = c["ci95"]
    return f"{100 * lo:.1f}-{100 * hi:.1f}%"


def command_line(args: argparse.Namespace) -> str:
    parts = ["python benchmarks/mutation.py", f"--max-children {args.max_children}"]
    if args.sample:
        parts.append(f"--sample {args.sample} --seed {args.seed}")
    return " ".join(parts + [shlex.quote(n) for n in args.names])


def write(rows: dict, status: dict[str, str], equivalent: dict[str, str], survivors_diff: dict[str, str],
          survivors: list[str], wall: float | None, args: argparse.Namespace) -> None:
    import mutmut

    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "tool": f"mutmut {mutmut.__version__}",
        "command": command_line(args),
        "kind": (f"stratified random sample: up to {args.sample} mutants per module, seed {args.seed}"
                 if args.sample else "all generated mutants (cached verdicts of earlier runs included)"),
        "wall_seconds_last_run": None if wall is None else round(wall, 1),
        "note": args.note or None,
        "scores": rows,
        "survivors": {n: {"status": status[n], "diff": survivors_diff.get(n, "")} for n in survivors},
        "equivalent": {n: equivalent[n] for n in sorted(equivalent) if n in status},
        "equivalent_listed_but_not_generated": sorted(n for n in equivalent if n not in status),
    }
    stem = "mutation" + (f"_{args.tag}" if args.tag else "")
    tmp = RESULTS / f".{stem}.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, RESULTS / f"{stem}.json")

    tot = rows["TOTAL"]
    md = ["# Mutation testing of the core", "",
          f"Measured with {doc['tool']} by `{doc['command']}` (see `docs/testing.md`).",
          "Score = killed / (mutants run - equivalent); survivors and mutants no test executes",
          "('no tests') count against it; mutants that time out count as killed.", ""]
    if args.note:
        md += [f"**Note.** {args.note}", ""]
    if args.sample:
        md += [f"**Sample estimate, not a full run**: a seeded stratified random sample of up to "
               f"{args.sample} mutants per module (seed {args.seed}): {tot.get('mutants', 0)} mutants run "
               f"of {tot['population']} generated; {tot.get('not_sampled', 0)} not sampled, "
               f"{tot.get('not_run', 0)} sampled but not run.",
               "Per module: 95% Wilson interval of the module's score ('exact' where every mutant of",
               "the module was run). Total: the stratified estimate (modules weighted by their",
               "estimated number of non-equivalent mutants) with a normal-approximation 95% interval",
               "(finite-population correction included); the pooled ratio of the counts is shown too.",
               ""]
    else:
        md += ["Mutants generated but not run are counted in 'not run' and left out of the score.", ""]
    md += ["| module | mutants | run | killed | survived | no tests | other | equivalent | score | 95% CI | not run |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mod, c in rows.items():
        other = c.get("mutants", 0) - sum(c.get(k, 0) for k in ("killed", "survived", "no_tests", "equivalent"))
        if not c.get("mutants", 0) and not args.all_modules:
            continue
        name = f"**{mod}**" if mod == "TOTAL" else f"`{mod}`"
        sc = _pct(c["score"])
        ci = _ci(c)
        if mod == "TOTAL" and "stratified_score" in c:
            sc = f"{_pct(c['stratified_score'])} (pooled {_pct(c['score'])})"
        md.append(f"| {name} | {c['population']} | {c.get('mutants', 0)} | {c.get('killed', 0)} | "
                  f"{c.get('survived', 0)} | {c.get('no_tests', 0)} | {other} | {c.get('equivalent', 0)} | "
                  f"{sc} | {ci} | {c.get('not_run', 0)} |")
    md += ["", "## Equivalent mutants (excluded from the score)", ""]
    if doc["equivalent"]:
        md += [f"- `{n}`: {r}" for n, r in doc["equivalent"].items()]
    else:
        md.append("(none)")
    md += ["", "## Surviving mutants (and mutants no selected test executes)", ""]
    if survivors:
        for n in survivors:
            md.append(f"- `{n}` ({status[n]})")
            d = survivors_diff.get(n, "")
            if d:
                md += ["  ```diff"] + [f"  {ln}" for ln in d.splitlines()] + ["  ```"]
    else:
        md.append("(none)")
    tmp = RESULTS / f".{stem}.md.{os.getpid()}.tmp"
    tmp.write_text("\n".join(md) + "\n", encoding="utf-8")
    os.replace(tmp, RESULTS / f"{stem}.md")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-children", type=int, default=2, help="parallel mutant workers (default 2)")
    ap.add_argument("--report-only", action="store_true", help="do not run, only report cached results")
    ap.add_argument("--fresh", action="store_true", help="delete mutants/ (all cached verdicts) first")
    ap.add_argument("--all-modules", action="store_true", help="list modules with no mutant run too")
    ap.add_argument("--sample", type=int, default=0, metavar="N",
                    help="run and score a seeded random sample of N mutants per module (0: all)")
    ap.add_argument("--seed", type=int, default=17, help="seed of --sample (default 17)")
    ap.add_argument("--rerun", action="store_true",
                    help="with --sample: re-run killed sampled mutants too (by default only those without "
                         "a verdict and those not killed are run)")
    ap.add_argument("--tag", default="", metavar="TAG",
                    help="write benchmarks/results/mutation_TAG.{md,json} instead of mutation.{md,json}")
    ap.add_argument("--note", default="", metavar="TEXT",
                    help="a sentence written at the top of the results (e.g. that a held-out sample has "
                         "since been tuned: tests were written against its survivors)")
    ap.add_argument("names", nargs="*",
                    help="mutant name globs, e.g. 'tolstat.checks.checking.*' (re-runs those); with --sample: "
                         "only the sampled mutants they match are run and scored")
    args = ap.parse_args(argv)
    if args.tag and not all(ch.isalnum() or ch in "_-" for ch in args.tag):
        ap.error(f"--tag must be letters, digits, '_' or '-', got {args.tag!r}")
    if args.sample < 0:
        ap.error(f"--sample must be >= 0, got {args.sample}")
    if args.fresh and (ROOT / "mutants").exists():
        shutil.rmtree(ROOT / "mutants")
    sample = None
    if args.sample:
        if not args.report_only or not all_mutants():
            generate()  # (re)generate so the sample is drawn from the current source
        sample = draw_sample(all_mutants(), args.sample, args.seed)
        if args.names:  # restrict the sample (drawn per module, so unchanged) to the named mutants
            sample = {mod: [n for n in ns if any(fnmatch.fnmatchcase(n, g) for g in args.names)]
                      for mod, ns in sample.items()}
            sample = {mod: ns for mod, ns in sample.items() if ns}
            if not sample:
                ap.error(f"no sampled mutant matches {args.names}")
    wall = None
    if not args.report_only:
        (ROOT / "mutants").mkdir(exist_ok=True)
        names = args.names
        if sample is not None:
            status0 = collect()
            names = [n for ns in sample.values() for n in ns
                     if args.rerun or status0.get(n, "not checked") not in KILLED]
        if sample is None or names:
            wall = run(args.max_children, names, ROOT / "mutants" / "mutation-run.log")
    status = collect()
    if not status:
        raise SystemExit("no mutmut results under mutants/: run without --report-only first")
    equivalent = json.loads(EQUIVALENT.read_text(encoding="utf-8")) if EQUIVALENT.exists() else {}
    scored = status
    if sample is not None and args.names:  # only the named modules: their population, their total
        scored = {n: st for n, st in status.items() if _module(n) in sample}
    rows = score(scored, equivalent, sample)
    counted = status if sample is None else {n: status[n] for ns in sample.values() for n in ns if n in status}
    surv = sorted(n for n, s in counted.items() if s not in KILLED | {"not checked"} and n not in equivalent)
    shown = equivalent if scored is status else {n: r for n, r in equivalent.items() if _module(n) in sample}
    write(rows, scored, shown, diffs(surv), surv, wall, args)
    w = max(len(m) for m in rows)
    print(f"{'module':{w}s} {'mutants':>8s} {'run':>5s} {'killed':>7s} {'survived':>9s} {'no tests':>9s} "
          f"{'equiv':>6s} {'score':>7s}  95% CI")
    for mod, c in rows.items():
        if not c.get("mutants", 0) and not args.all_modules:
            continue
        sc = _pct(c.get("stratified_score", c["score"]))
        print(f"{mod:{w}s} {c['population']:8d} {c.get('mutants', 0):5d} {c.get('killed', 0):7d} "
              f"{c.get('survived', 0):9d} {c.get('no_tests', 0):9d} {c.get('equivalent', 0):6d} {sc:>7s}  {_ci(c)}")
    if sample is not None:
        print(f"\nSAMPLE ESTIMATE: {rows['TOTAL'].get('mutants', 0)} of {rows['TOTAL']['population']} mutants run "
              f"(up to {args.sample} per module, seed {args.seed}); not a full run")
    stem = "mutation" + (f"_{args.tag}" if args.tag else "")
    print(f"\n{len(surv)} surviving mutants (listed with diffs in {RESULTS / (stem + '.md')}):")
    for n in surv:
        print(f"  {n} ({status[n]})")
    if wall is not None:
        print(f"\nwall time of this run: {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
